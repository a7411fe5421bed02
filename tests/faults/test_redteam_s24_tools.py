"""Red-team cases of `profile`'s verdicts on work outside the step and outside float32: an evaluation or a
checkpoint every step, a callback sleeping in every step (none of which profile ran, so each read as a healthy
step), and a loss in float64 (which no precision.dtype reaches). Verdicts are asserted by kind and advice."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tests.faults.common import BASE_TOML, lit, step_events
from turbotrain import profile as prof
from turbotrain.cli import main
from turbotrain.config import load_config

pytestmark = pytest.mark.usefixtures("userpkg_importable")

PKG = "userpkg.redteam_s24_tools"
ITEMS = ['data.name="userpkg.planted_s22:items"', "data.num_workers=0", 'train.loss="cross_entropy"',
         "model.args={}", "data.args={}", 'model.name="userpkg.planted_s22:small"']


def _profile(tmp_path, *overrides) -> tuple[dict, str, list[str]]:
    argv = [str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *ITEMS, *overrides]
    assert main(["profile", "--active", "2", *argv]) == 0
    out = tmp_path / "fault" / "profile"
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text(), argv


def _loads(argv: list[str], recs: list[dict]) -> None:
    for s in filter(None, (r["set"] for r in recs)):  # each pasted as it is loads as config
        load_config(argv[0], [*argv[1:], *s.split()])


def _left_alone(tmp_path) -> None:
    """profile's probe writes nothing of a run: no checkpoints, no scratch left, only its report files."""
    run = tmp_path / "fault"
    assert sorted(p.name for p in run.iterdir()) == ["profile"]
    assert sorted(p.name for p in (run / "profile").iterdir()) == ["report.json", "report.md", "trace.json.gz"]


# ---------------------------------------------------------------- the loop's work outside the step

def test_an_evaluation_every_step_is_eval_bound_and_told_to_evaluate_less(tmp_path):
    """200 validation batches after every 1-batch step: most of the run is evaluation, which profile never ran;
    the step alone read as healthy and the advice was about the step."""
    report, md, argv = _profile(tmp_path, "train.eval_every=1", "data.eval_batches=200", "data.args={n=8192}")
    assert report["verdict"] == "eval-bound" and report["bottleneck"] == "eval", report["loop"]
    first = report["recommendations"][0]["set"]
    assert first.startswith("train.eval_every=") and int(first.split("=")[1]) > 1
    assert report["loop"]["eval"]["every"] == 1 and "eval" in md.split("**Verdict:")[1].splitlines()[0]
    assert "Outside the step: eval" in md
    _loads(argv, report["recommendations"])
    _left_alone(tmp_path)


def test_a_checkpoint_every_step_is_checkpoint_bound_and_nothing_is_saved_in_the_run(tmp_path):
    """A 64 MB model state saved after each step of a 32x4 layer: the saves are the run."""
    report, md, argv = _profile(tmp_path, "checkpoint.every=1", f'model.name="{PKG}:ballast"')
    assert report["verdict"] == "checkpoint-bound", report["loop"]
    first = report["recommendations"][0]["set"]
    assert first.startswith("checkpoint.every=") and int(first.split("=")[1]) > 1
    _loads(argv, report["recommendations"])
    _left_alone(tmp_path)


def test_rare_evaluations_and_none_are_no_verdict_of_their_own(tmp_path):
    """The evaluation at a run's end (eval_every=0) is no per-step cost: no eval key is advised for it."""
    report, _, _ = _profile(tmp_path, "data.eval_batches=20")
    assert "eval" not in report["loop"] and report["verdict"] != "eval-bound"
    assert not any("eval_every" in r["set"] for r in report["recommendations"])


def test_a_callback_that_sleeps_every_step_is_named_and_writes_nothing_in_the_run(tmp_path, capsys):
    """A callback sleeping 100 ms in on_step_end (a synchronous upload): in training it is in every step; profile
    did not run it and called the step healthy. It now runs where training runs it, its run_dir a scratch
    folder that profile removes (the run's folder is left alone)."""
    report, md, _ = _profile(tmp_path, f'train.callbacks=["{PKG}:WritingCallback"]')
    assert report["verdict"] == "host-overhead-bound", report["breakdown_share"]
    assert report["recommendations"][0]["do"] == "make train.callbacks' on_step_end cheaper"
    assert report["loop"]["callbacks_ms_per_step"] >= 100
    assert any("on_step_end ran in each profiled step" in n for n in report["notes"])
    assert "warning: train.callbacks" in capsys.readouterr().out
    _left_alone(tmp_path)


# ---------------------------------------------------------------- float64

def _f64_of(fn) -> float:
    return prof.f64_share(step_events(fn))


def test_float64_share_tells_a_double_loss_from_a_float_one():
    w = torch.randn(64, 512, requires_grad=True)
    x, y = torch.randn(256, 64), torch.randint(0, 512, (256,))
    assert _f64_of(lambda: F.cross_entropy((x @ w).double(), y)) > 0  # a share of time: its size depends on load
    assert _f64_of(lambda: F.cross_entropy(x @ w, y)) == 0.0


def test_a_loss_in_float64_is_advised_back_to_float32(tmp_path):
    """cross-entropy over 512 classes computed in float64: precision.dtype does not reach a `.double()`, and the
    report said nothing of it."""
    over = [f'model.name="{PKG}:wide"', f'data.name="{PKG}:classes"', "data.batch_size=64"]
    report, md, argv = _profile(tmp_path, *over, f'train.loss="{PKG}:f64_loss"')
    assert report["float64_op_share"] >= prof.F64_SHARE
    assert any(r.get("do") == "compute the model and the loss in float32" for r in report["recommendations"])
    _loads(argv, report["recommendations"])


# ---------------------------------------------------------------- advice that changes the global batch

def _cpu_run(*overrides):
    from types import SimpleNamespace
    model = torch.nn.Linear(2, 2)
    return SimpleNamespace(cfg=load_config(str(BASE_TOML), list(overrides)),
                           batches=SimpleNamespace(resident=True, loader=None),
                           trainee=SimpleNamespace(device=torch.device("cpu"), dtype="fp32", model=model,
                                                   opt=torch.optim.AdamW(model.parameters(), foreach=True)))


@pytest.mark.parametrize("shares, tiny", [
    (dict.fromkeys(prof.PARTS, 0.0) | {"forward": 0.4, "backward": 0.5, "host_overhead": 0.1}, 0.9),  # tiny ops
    (dict.fromkeys(prof.PARTS, 0.0) | {"forward": 0.2, "backward": 0.3, "host_overhead": 0.5}, 0.0),  # host work
    (dict.fromkeys(prof.PARTS, 0.0) | {"h2d_copy": 0.6, "forward": 0.1, "backward": 0.3}, 0.0),  # resident gather
])
def test_micro_batches_of_one_are_merged_first_and_a_larger_batch_says_it_changes_the_math(shares, tiny):
    """1-sample micro-batches accumulated 8 times: per-op and per-step costs are paid 8 times a step. Merging
    them keeps the global batch (the math); the tiny-op and resident-data verdicts advised a doubled batch
    first, and no doubled batch said that it changes the global batch (the LR wants retuning)."""
    run = _cpu_run("data.batch_size=1", "train.grad_accum=8")
    kind, recs = prof.verdict(shares, run, {}, tiny=tiny)
    assert kind in ("host-overhead-bound", "data-bound")
    assert recs[0]["set"] == "data.batch_size=8 train.grad_accum=1" and "the same math" in recs[0]["why"]
    for r in recs:
        if r["set"].startswith("data.batch_size=") and "grad_accum" not in r["set"]:
            assert "retune train.lr" in r["why"], r


# ---------------------------------------------------------------- bench's table

def test_a_saving_that_rounds_to_zero_is_written_0_not_minus_0():
    """A peak 0.1 % above the baseline's (process RSS on a CPU) was "-0%" saved in bench.md."""
    from turbotrain.bench import format_table

    row = {"tokens_per_s": None, "samples_per_s": 1000.0, "speedup": 1.0, "step_ms": 2.0, "peak_mem_gib": 0.31,
           "compile_s": 0.0, "final_loss": 1.0, "val_loss": 1.0, "val_acc": None, "verdict": "ok"}
    result = {"device": "cpu", "torch": torch.__version__, "steps": 4, "synthetic_data": False, "repeats": 1,
              "rows": [{**row, "variant": "baseline", "mem_saving": 0.0},
                       {**row, "variant": "workers", "mem_saving": -0.001, "final_loss": -0.00001},
                       {**row, "variant": "accum", "mem_saving": -0.25}]}
    table = format_table(result)
    assert "-0%" not in table and "-0.0000" not in table and "| 0% |" in table
    assert "| -25% |" in table  # a real negative saving stays negative
