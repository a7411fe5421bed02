"""Checkpoints are untrusted input: loading never runs pickled code (state.pt, DCP's .metadata and .distcp
byte items), a damaged checkpoint (meta.json flips, incomplete manifests, missing keys, wrong shapes,
truncation) is skipped for the previous good one without touching the model, a failed write (disk full)
is one error line that leaves no temp folder and keeps the earlier checkpoints, and no save follows a
symlink out of the run dir.

Most cases drive `Checkpointer` directly on a tiny model (milliseconds); FSDP2 ones in a 1-rank gloo group
in-process; a few go through `turbotrain.cli.main` for the contract (resume, losses, one error line); one
runs 2 gloo ranks through torchrun on a real sharded checkpoint.
"""
from __future__ import annotations

import errno
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.faults.common import (
    Payload,
    checkpoint_steps,
    ckpt_dir,
    error_line,
    lit,
    loss_rows,
    plant_payload,
    report,
    reseal,
    resumed_step,
    subprocess_env,
)
from tests.helpers import TINY_GPT
from turbotrain.checkpoint import CheckpointConfig, Checkpointer, param_shapes
from turbotrain.cli import main
from turbotrain.errors import UserError

GPT = ["gpt2-124m", *TINY_GPT, 'run.device="cpu"', "train.log_every=1", "run.name=gpt"]


# ================================================================ a tiny model driven through Checkpointer

class Run:
    """A 2-layer MLP with AdamW, LambdaLR and a (disabled) GradScaler, checkpointed at steps 1 and 2."""

    def __init__(self, root: Path, sharded: bool = False, resume: str = "auto"):
        self.root, self.sharded = root, sharded
        self.model, self.opt, self.sched, self.scaler = self.fresh()
        self.ck = Checkpointer(CheckpointConfig(every=1, keep=5, resume=resume), root, 0, 1, sharded)
        self.meta = {"global_batch": 8, "param_shapes": param_shapes(self.model), "optimizer": "adamw", "dtype": "fp32"}
        self.weights: dict[int, list[torch.Tensor]] = {0: weights(self.model)}

    def fresh(self):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        if self.sharded:
            from torch.distributed.fsdp import fully_shard

            fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        return model, opt, sched, torch.amp.GradScaler("cpu", enabled=False)

    def train_and_save(self, steps=(1, 2)) -> "Run":
        for step in steps:
            self.model(torch.randn(3, 4)).sum().backward()
            self.opt.step()
            self.opt.zero_grad()
            self.sched.step()
            self.ck.save(step, self.model, self.opt, self.sched, self.scaler, self.meta)
            self.weights[step] = weights(self.model)
        return self

    def resume(self, ck: Checkpointer | None = None):
        """A fresh model restored per find_resume + load (as build() does): (step, model, opt)."""
        ck = ck or self.ck
        model, opt, sched, scaler = self.fresh()
        path = ck.find_resume()
        step = ck.load(path, model, opt, sched, scaler, self.meta) if path is not None else 0
        return step, model, opt

    def ckpt(self, step: int) -> Path:
        return self.root / "checkpoints" / f"step-{step:08d}"


def weights(model: nn.Module) -> list[torch.Tensor]:
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in model.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def edit_state(path: Path, change) -> None:
    """Rewrite state.pt through `change(state)` and reseal the manifest (only the content is wrong)."""
    state = torch.load(path / "state.pt", weights_only=True)
    change(state)
    torch.save(state, path / "state.pt")
    reseal(path)



# ================================================================ 3. meta.json, manifest and state.pt are checked

def _flip_step(ck: Path) -> None:
    meta = json.loads((ck / "meta.json").read_text())
    meta["step"] = 7  # the folder name aside, nothing but meta_sha256 can tell
    (ck / "meta.json").write_text(json.dumps(meta, indent=1))


def _flip_global_batch(ck: Path) -> None:
    text = (ck / "meta.json").read_text()
    (ck / "meta.json").write_text(text.replace('"global_batch": 8', '"global_batch": 9'))


def _unlist_rng(ck: Path) -> None:  # a file that exists but the manifest does not name
    meta = json.loads((ck / "meta.json").read_text())
    del meta["manifest"]["rng-rank0.pt"]
    (ck / "meta.json").write_text(json.dumps(meta, indent=1))


def _unlist_and_delete_state(ck: Path) -> None:  # an expected file neither listed nor present
    meta = json.loads((ck / "meta.json").read_text())
    del meta["manifest"]["state.pt"]
    (ck / "meta.json").write_text(json.dumps(meta, indent=1))
    (ck / "state.pt").unlink()


def _extra_file(ck: Path) -> None:
    (ck / "extra.pt").write_bytes(b"not listed")


@pytest.mark.parametrize("corrupt, expect", [
    (_flip_step, "meta_sha256"), (_flip_global_batch, "meta_sha256"), (_unlist_rng, "rng-rank0.pt"),
    (_unlist_and_delete_state, "state.pt"), (_extra_file, "extra.pt"),
], ids=["meta-step-flipped", "meta-batch-flipped", "manifest-lacks-existing-file", "manifest-lacks-state",
        "unlisted-extra-file"])
def test_verify_catches_meta_and_manifest_damage(tmp_path, corrupt, expect):
    run = Run(tmp_path).train_and_save()
    assert Checkpointer.verify(run.ckpt(2)) is None
    corrupt(run.ckpt(2))
    problem = Checkpointer.verify(run.ckpt(2))
    assert problem is not None and expect in problem, problem
    step, model, _ = run.resume()
    assert step == 1 and same(weights(model), run.weights[1])


def _drop(key):
    return lambda s: s.pop(key)


def _model_shape(s):
    k = next(iter(s["model"]))
    s["model"][k] = torch.zeros(3, 3)


def _model_key(s):
    s["model"].pop(next(iter(s["model"])))


def _optim_shape(s):  # the model part is fine: a loader that applies it first is left half-loaded
    st = next(iter(s["optim"]["state"].values()))
    st["exp_avg"] = torch.zeros(5)


def _optim_groups(s):
    s["optim"]["param_groups"] = s["optim"]["param_groups"][:0]


def _sched_keys(s):
    s["sched"] = {"last_epoch": 2}


def _model_not_tensor(s):
    k = next(iter(s["model"]))
    s["model"][k] = [1.0, 2.0]


@pytest.mark.parametrize("change", [_drop("model"), _drop("optim"), _drop("sched"), _drop("scaler"), _model_shape,
                                    _model_key, _optim_shape, _optim_groups, _sched_keys, _model_not_tensor],
                         ids=["no-model", "no-optim", "no-sched", "no-scaler", "model-shape", "model-key",
                              "optim-shape", "optim-groups", "sched-keys", "model-not-tensor"])
def test_bad_state_falls_back_and_leaves_nothing_half_loaded(tmp_path, change):
    run = Run(tmp_path).train_and_save()
    edit_state(run.ckpt(2), change)
    assert Checkpointer.verify(run.ckpt(2)) is None  # resealed: only the content check can tell
    step, model, opt = run.resume()
    assert step == 1 and run.ck.loaded == run.ckpt(1)
    assert same(weights(model), run.weights[1])
    assert int(opt.state_dict()["state"][0]["step"]) == 1


def test_bad_state_with_explicit_resume_is_a_user_error(tmp_path):
    run = Run(tmp_path).train_and_save()
    edit_state(run.ckpt(2), _optim_shape)
    ck = Checkpointer(CheckpointConfig(every=1, resume=str(run.ckpt(2))), tmp_path, 0, 1, False)
    model, opt, sched, scaler = run.fresh()
    with pytest.raises(UserError) as e:
        ck.load(ck.find_resume(), model, opt, sched, scaler, run.meta)
    msg = str(e.value)
    assert "\n" not in msg and "checkpoint.resume" in msg and "corrupt" in msg and "optim" in msg, msg
    assert same(weights(model), run.weights[0])  # untouched


@pytest.mark.parametrize("target", ["state.pt", "rng-rank0.pt"])
def test_truncated_file_resealed_is_corruption_not_a_payload(tmp_path, target):
    """Truncation (a zip without its central directory) is damage: the previous checkpoint is loaded."""
    run = Run(tmp_path).train_and_save()
    f = run.ckpt(2) / target
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    reseal(run.ckpt(2))
    step, model, _ = run.resume()
    assert step == 1 and same(weights(model), run.weights[1])


def test_payload_in_state_is_refused_not_skipped(tmp_path):
    """Pickled code is not damage: no fallback past it, one error line, and the code never runs."""
    run = Run(tmp_path).train_and_save()
    marker = tmp_path / "PWNED"
    plant_payload(run.ckpt(2) / "state.pt", marker, "torch")
    reseal(run.ckpt(2))
    with pytest.raises(UserError, match="more than tensors"):
        run.resume()
    assert not marker.exists()


def test_every_checkpoint_damaged_starts_fresh_and_keeps_them(tmp_path):
    run = Run(tmp_path).train_and_save()
    for s in (1, 2):
        edit_state(run.ckpt(s), _optim_shape)
    model, opt, sched, scaler = run.fresh()
    assert run.ck.load(run.ckpt(2), model, opt, sched, scaler, run.meta) == 0
    assert same(weights(model), run.weights[0]) and not opt.state_dict()["state"]
    kept = tmp_path / "checkpoints.old-1"
    assert sorted(p.name for p in kept.iterdir()) == ["step-00000001", "step-00000002"]


# ================================================================ 1. FSDP2 / DCP: no pickled code runs

def _payload_pickle(marker: Path) -> bytes:
    return pickle.dumps({"metadata": Payload(marker)}, protocol=4)


def test_dcp_metadata_unpickler_allows_real_metadata_refuses_code(tmp_path, gloo1):
    from turbotrain.checkpoint import CodeInCheckpoint, CorruptCheckpoint, load_dcp_metadata

    run = Run(tmp_path, sharded=True).train_and_save((1,))
    raw = (run.ckpt(1) / "dcp" / ".metadata").read_bytes()
    md = load_dcp_metadata(io.BytesIO(raw))
    assert any(k.startswith("model.") for k in md.state_dict_metadata)
    marker = tmp_path / "PWNED"
    for bad in (_payload_pickle(marker), pickle.dumps(eval), pickle.dumps(Path)):  # noqa: S301
        with pytest.raises(CodeInCheckpoint):
            load_dcp_metadata(io.BytesIO(bad))
    assert not marker.exists()
    with pytest.raises(CorruptCheckpoint):
        load_dcp_metadata(io.BytesIO(raw[: len(raw) // 2]))
    md.storage_data[next(iter(md.storage_data))].relative_path = "../../state.pt"  # path traversal
    with pytest.raises(CorruptCheckpoint):
        load_dcp_metadata(io.BytesIO(pickle.dumps(md)))


def _plant_metadata(ck: Path, marker: Path) -> None:
    (ck / "dcp" / ".metadata").write_bytes(_payload_pickle(marker))
    reseal(ck)


def _plant_distcp(run: Run, ck: Path, marker: Path) -> None:
    """A well-formed DCP checkpoint whose byte item optim.param_groups.0.lr is a pickled payload."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(run.model, run.opt)
    osd["param_groups"][0]["lr"] = Payload(marker)
    shutil.rmtree(ck / "dcp")
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(ck / "dcp"))
    reseal(ck)


@pytest.mark.parametrize("plant", ["metadata", "distcp"])
def test_sharded_payload_never_runs(tmp_path, gloo1, plant):
    run = Run(tmp_path, sharded=True).train_and_save()
    marker = tmp_path / "PWNED"
    if plant == "metadata":
        _plant_metadata(run.ckpt(2), marker)
    else:
        _plant_distcp(run, run.ckpt(2), marker)
    assert Checkpointer.verify(run.ckpt(2)) is None
    with pytest.raises(UserError) as e:
        run.resume()
    assert not marker.exists(), "the checkpoint's pickled code RAN"
    assert "\n" not in str(e.value) and "step-00000002" in str(e.value), e.value


def test_sharded_truncated_distcp_falls_back_untouched(tmp_path, gloo1):
    run = Run(tmp_path, sharded=True).train_and_save()
    f = run.ckpt(2) / "dcp" / "__0_0.distcp"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    reseal(run.ckpt(2))
    step, model, _ = run.resume()
    assert step == 1 and same(weights(model), run.weights[1])


FSDP_ARGS = ["gpt2-124m", *TINY_GPT, 'run.device="cpu"', 'parallel.strategy="fsdp"', "data.batch_size=4",
             "checkpoint.every=2", "run.name=fsdp"]


def _torchrun(out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "turbotrain",
           "train", *FSDP_ARGS, f"run.out_dir={lit(out)}", *extra]
    return subprocess.run(cmd, cwd=out, env=subprocess_env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=240)


@pytest.mark.slow
def test_fsdp_two_ranks_metadata_payload_does_not_run(tmp_path):
    """A real 2-rank FSDP2 checkpoint, its dcp/.metadata replaced by a payload and the manifest resealed."""
    r = _torchrun(tmp_path, "train.steps=2")
    assert r.returncode == 0, report(r)
    ck, marker = ckpt_dir(tmp_path / "fsdp", 2), tmp_path / "PWNED"
    assert (ck / "dcp" / "__1_0.distcp").is_file()
    _plant_metadata(ck, marker)
    r = _torchrun(tmp_path, "train.steps=4")
    assert not marker.exists(), "the checkpoint's pickled code RAN\n" + report(r)
    assert r.returncode != 0 and "resumed from" not in r.stdout, report(r)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert lines and "dcp/.metadata" in lines[0] and "step-00000002" in lines[0], report(r)


# ================================================================ 2. a failed write: one line, no temp folder

def _fail_on_step(monkeypatch, step: int, exc: BaseException) -> None:
    real = torch.save

    def save(obj, f, *a, **k):
        if f".tmp-step-{step:08d}" in str(f):
            raise exc
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("exc", [
    OSError(errno.ENOSPC, "No space left on device"),
    RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file data/0: "
                 "file write failed"),
], ids=["ENOSPC", "torch-writer-RuntimeError"])
def test_disk_full_mid_checkpoint_is_one_error_line(tmp_path, capsys, monkeypatch, exc):
    _fail_on_step(monkeypatch, 4, exc)
    capsys.readouterr()
    rc = main(["train", *GPT, f"run.out_dir={lit(tmp_path)}", "train.steps=6", "checkpoint.every=2"])
    out, err = capsys.readouterr()
    assert rc == 2, err
    line = error_line(err)
    for text in ("checkpoint", ".tmp-step-00000004", "run.out_dir", "checkpoint.keep", "free"):
        assert text in line, line
    run_dir = tmp_path / "gpt"
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
    assert checkpoint_steps(run_dir) == [2] and Checkpointer.verify(ckpt_dir(run_dir, 2)) is None


@pytest.mark.parametrize("stage", ["fsync", "rename"])
def test_quota_exceeded_while_sealing_keeps_the_same_step_checkpoint(tmp_path, monkeypatch, stage):
    """EDQUOT while sealing a rewrite of an existing step (at the fsync, or at the rename into place after
    the earlier one was moved aside): the earlier checkpoint of that step survives, under its name."""
    import turbotrain.checkpoint as cp

    run = Run(tmp_path).train_and_save()
    before = (run.ckpt(2) / "state.pt").read_bytes()
    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    if stage == "fsync":
        def fsync_tree(folder):
            raise quota

        monkeypatch.setattr(cp, "_fsync_tree", fsync_tree)
    else:
        real = os.replace

        def replace(src, dst):
            if ".tmp-step-" in str(src):
                raise quota
            return real(src, dst)

        monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(UserError, match="Disk quota exceeded") as e:
        run.ck.save(2, run.model, run.opt, run.sched, run.scaler, run.meta)
    assert "\n" not in str(e.value)
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert (run.ckpt(2) / "state.pt").read_bytes() == before and Checkpointer.verify(run.ckpt(2)) is None


def test_sharded_disk_full_is_one_error_line(tmp_path, gloo1, monkeypatch):
    """DCP wraps a rank's write error in CheckpointException (a BaseException): still one user error."""
    run = Run(tmp_path, sharded=True).train_and_save((1,))
    _fail_on_step(monkeypatch, 2, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(UserError, match="No space left on device"):
        run.train_and_save((2,))
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert checkpoint_steps(tmp_path) == [1] and Checkpointer.verify(run.ckpt(1)) is None


# ================================================================ 4. no save follows a symlink out of the run dir

def test_checkpoints_dir_symlinked_outside_is_refused(tmp_path, capsys):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (tmp_path / "out" / "gpt").mkdir(parents=True)
    (tmp_path / "out" / "gpt" / "checkpoints").symlink_to(outside)
    capsys.readouterr()
    rc = main(["train", *GPT, f"run.out_dir={lit(tmp_path / 'out')}", "train.steps=2", "checkpoint.every=1"])
    out, err = capsys.readouterr()
    assert rc == 2, err
    line = error_line(err)  # refused by the run dir's own link check or by Checkpointer's: either way one line
    assert "checkpoints" in line and ("symlink" in line or "symbolic link" in line), line
    assert not list(outside.iterdir())


@pytest.mark.parametrize("name", ["checkpoints", "checkpoints/step-00000002", "checkpoints/.tmp-step-00000002"])
def test_symlink_out_of_the_run_dir_is_refused(tmp_path, name):
    """Checkpointer's own check (whatever the run dir's): the folder, a step folder or its temp folder."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    run = Run(tmp_path / "run")
    if name != "checkpoints":
        run.train_and_save((1,))
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / name).symlink_to(outside)
    with pytest.raises(UserError, match="outside the run dir") as e:
        run.train_and_save((2,))
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt"]
    if name != "checkpoints":
        assert Checkpointer.verify(run.ckpt(1)) is None
    else:
        with pytest.raises(UserError, match="outside the run dir"):
            run.ck.find_resume()  # refused before any training when checkpointing is on


# ================================================================ the contract through the CLI

@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted tiny-GPT run of 6 steps with checkpoints at 2, 4, 6 (copy it before touching it)."""
    out = tmp_path_factory.mktemp("trustref")
    assert main(["train", *GPT, f"run.out_dir={lit(out)}", "train.steps=6", "checkpoint.every=2"]) == 0
    assert checkpoint_steps(out / "gpt") == [2, 4, 6]
    return out / "gpt"


@pytest.mark.parametrize("corrupt, words", [
    (_flip_step, ["meta_sha256"]),
    (lambda ck: edit_state(ck, _optim_shape), ["optim", "shape"]),
    (lambda ck: ((ck / "state.pt").write_bytes((ck / "state.pt").read_bytes()[:300]), reseal(ck)), ["truncated"]),
], ids=["meta-step-flipped", "optim-shape-resealed", "state-truncated-resealed"])
def test_damaged_latest_resumes_previous_bitwise(tmp_path, capsys, reference, corrupt, words):
    """The damaged step 4 is skipped with a warning, step 2 is loaded whole (not a mix with step 4's
    model), and steps 3..6 log exactly the uninterrupted run's losses."""
    run_dir = tmp_path / "gpt"
    shutil.copytree(reference, run_dir)
    shutil.rmtree(ckpt_dir(run_dir, 6))
    corrupt(ckpt_dir(run_dir, 4))
    capsys.readouterr()
    rc = main(["train", *GPT, f"run.out_dir={lit(tmp_path)}", "train.steps=6", "checkpoint.every=2"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    warning = [ln for ln in out.splitlines() if "corrupt" in ln]
    assert warning and "step-00000004" in warning[0] and all(w in warning[0] for w in words), out
    assert resumed_step(out) == 2, out
    assert loss_rows(run_dir) == loss_rows(reference)
    assert Checkpointer.verify(ckpt_dir(run_dir, 4)) is None  # rewritten whole by the resumed run


def test_damaged_explicit_resume_is_one_error_line(tmp_path, capsys, reference):
    run_dir = tmp_path / "gpt"
    shutil.copytree(reference, run_dir)
    edit_state(ckpt_dir(run_dir, 4), _model_shape)
    capsys.readouterr()
    rc = main(["train", *GPT, f"run.out_dir={lit(tmp_path)}", "train.steps=8",
               f"checkpoint.resume={lit(ckpt_dir(run_dir, 4))}"])
    out, err = capsys.readouterr()
    assert rc == 2, err
    line = error_line(err)
    assert "checkpoint.resume" in line and "corrupt" in line and "shape" in line, line
