"""Red-team cases of session 26 on faults during a run (signals, checkpoints, resume, run directories): each failed
before its fix. User code: tests/userpkg/redteam_s26_faults.py."""
from __future__ import annotations

import contextlib
import json
import signal

import pytest

from tests.faults.common import BASE_TOML, lit
from turbotrain.config import load_config
from turbotrain.trainer import train

STEPS = ["train.steps=6", "checkpoint.every=2"]


def fault_cfg(out, *overrides: str):
    return load_config(str(BASE_TOML), [*STEPS, *overrides, f"run.out_dir={lit(out)}"])


@pytest.mark.parametrize("where", ["on_train_start", "first batch read"])
def test_a_sigterm_before_the_first_step_landing_in_user_code_exits_143_not_blamed_on_the_user(tmp_path, capfd,
                                                                                             where):
    """Before the first step finished, a SIGTERM stops at once by raising where it lands; landing in a callback or
    the dataset's read, the guard there took it for the user's own sys.exit(143): one `error:` line blaming the
    user's code, exit 2, where a scheduler's stop must read as 143 (stopped by SIGTERM, nothing lost)."""
    import userpkg.redteam_s26_faults as user

    if where == "on_train_start":
        data, callbacks = None, [user.SignalAt("on_train_start")]
    else:
        data = user.SignalOnRead()
        callbacks = [user.Arm(data)]
    with pytest.raises(SystemExit) as stopped:
        train(fault_cfg(tmp_path), train_data=data, callbacks=callbacks)
    assert stopped.value.code == 128 + signal.SIGTERM
    out = capfd.readouterr().out
    assert "before the first step finished: stopping now" in out
    assert "sys.exit" not in out
    assert data is None or data.sent == 1
    assert not (tmp_path / "fault" / "summary.json").exists()


def test_a_callback_failing_on_the_end_checkpoint_leaves_a_finished_run_with_its_summary(tmp_path):
    """on_checkpoint of the end save ran before summary.json was written: a hook raising there left the run with its
    end checkpoint and final/ but no summary, so report and watch read it as crashed for good, and the rerun they
    point to found nothing left to train ("already reached step 6") and never wrote one."""
    from userpkg.redteam_s26_faults import FailOnCheckpoint

    from turbotrain.errors import UserError
    from turbotrain.report import load_run, run_state

    with pytest.raises(UserError, match="on_checkpoint raised RuntimeError"):
        train(fault_cfg(tmp_path), callbacks=[FailOnCheckpoint(6)])
    run = tmp_path / "fault"
    assert (run / "checkpoints" / "step-00000006").is_dir() and (run / "final").is_dir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6
    assert run_state(load_run(run)) == "finished"


@contextlib.contextmanager
def file_size_limit(size: int):
    """`ulimit -f` set to `size` bytes inside the block (Python ignores SIGXFSZ: a write past it gets EFBIG). Given
    back inside the test, not in a fixture's teardown: pytest writes the test's report line before teardown, and
    its own output file (CI's log) is longer than the limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


# a 4096-wide linear model: its weights (16 KiB) pass a 8 KiB file-size limit that the run's small files stay under
WIDE = ["model.args.dim=4096", "data.args.dim=4096", "monitor.trackers=['jsonl']", "data.eval_batches=0"]


def test_final_and_export_past_the_file_size_limit_name_the_limit_not_free_space(tmp_path):
    """safetensors reports a write's errno only in words ("File too large (os error 27)"): final/ under
    checkpoint.every = 0 said "free space under run.out_dir"; `turbotrain export --out` said "free space or choose
    another folder" and `turbotrain report` "check permissions and free space", for a `ulimit -f` that no free
    space lifts."""
    from turbotrain.errors import UserError
    from turbotrain.export import export
    from turbotrain.report import write_report

    with file_size_limit(8192), pytest.raises(UserError) as final:
        train(fault_cfg(tmp_path / "a", *WIDE, "checkpoint.every=0", "train.steps=2"))
    assert "ulimit -f" in str(final.value) and "free space under" not in str(final.value)
    train(fault_cfg(tmp_path / "b", *WIDE, "checkpoint.every=0", "train.steps=2"))
    with file_size_limit(8192), pytest.raises(UserError) as exported:
        export(tmp_path / "b" / "fault", "safetensors", out=tmp_path / "out")
    assert "ulimit -f" in str(exported.value) and "free space or" not in str(exported.value)
    assert not (tmp_path / "out").exists()
    # report.png (tens of KiB) said "check permissions and free space"
    with file_size_limit(8192), pytest.raises(UserError) as report:
        write_report(tmp_path / "b" / "fault")
    assert "ulimit -f" in str(report.value) and "free space" not in str(report.value).split("not a lack of")[0]


def reseal_meta(ckpt, key: str, value) -> None:
    """Set meta.json's `key` and recompute its meta_sha256: the digest vouches for the edit (a hand edit resealed,
    another tool's file), so only the fields' kinds can tell."""
    from turbotrain.checkpoint import meta_digest

    meta = json.loads((ckpt / "meta.json").read_text())
    meta[key] = value
    manifest = meta.pop("manifest")
    meta.pop("meta_sha256")
    meta["meta_sha256"], meta["manifest"] = meta_digest(meta), manifest
    (ckpt / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("key, value", [("param_shapes", [1, 8]), ("global_batch", "8"), ("seed", 2**40),
                                        ("config", '[model]\nname = "userpkg.models:linear"\nargs = [8]\n')],
                         ids=["shapes-a-list", "batch-a-string", "seed-past-2**32", "model-args-a-list"])
def test_a_resealed_meta_json_with_fields_of_another_kind_is_a_damaged_checkpoint(tmp_path, key, value):
    """meta.json's run facts were used as the kinds a save writes: param_shapes as a list ended the resume in a
    TypeError traceback, model.args as a list in an AttributeError, a string global batch in "written with global
    batch 8 ...; this run has 8", a seed past 2**32 in a config error naming run.seed. Now such a checkpoint is a
    damaged one: auto-resume falls back past it to the previous good one (on the same curve), an explicit
    checkpoint.resume names it as corrupt (or, for the model's args, as written with another model)."""
    from tests.faults.common import loss_rows
    from turbotrain.errors import UserError

    flat = "train.schedule='constant'"  # the LR of a step does not depend on train.steps: 4 then 6 is one curve
    train(fault_cfg(tmp_path / "whole", flat))
    train(fault_cfg(tmp_path / "cut", flat, "train.steps=4"))
    latest = tmp_path / "cut" / "fault" / "checkpoints" / "step-00000004"
    reseal_meta(latest, key, value)
    if key == "config":  # a model built with other args: refused as such, by an explicit resume and by "auto"
        for resume in (f"checkpoint.resume={lit(latest)}", "checkpoint.resume='auto'"):
            with pytest.raises(UserError, match="written with model.args = \\[8\\]"):
                train(fault_cfg(tmp_path / "cut", flat, resume))
        return
    with pytest.raises(UserError, match="corrupt checkpoint"):
        train(fault_cfg(tmp_path / "cut", flat, f"checkpoint.resume={lit(latest)}"))
    assert train(fault_cfg(tmp_path / "cut", flat))["resumed_from"] == 2
    assert loss_rows(tmp_path / "cut" / "fault") == loss_rows(tmp_path / "whole" / "fault")
