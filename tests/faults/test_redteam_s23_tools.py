"""Red-team cases of the measuring tools: a step of many ops on tiny tensors is per-op overhead, not compute with
"no obvious lever left"; an optimizer beside a larger forward+backward does not bound the step; the size of an
op's work counts what it allocates as well as what it reads; tune stops searching once the input config itself
fails."""
from __future__ import annotations

import json
import os
import socket
from types import SimpleNamespace

import pytest
import torch

from tests.faults.common import BASE_TOML, error_line, lit, step_events
from turbotrain import profile as prof
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.tune import TrialRunner

pytestmark = pytest.mark.usefixtures("userpkg_importable")

PKG = "userpkg.redteam_s23_tools"
ITEMS = ['data.name="userpkg.planted_s22:items"', "data.num_workers=0", 'train.loss="cross_entropy"',
         "model.args={}", "data.args={}"]


def _profile(tmp_path, *overrides) -> tuple[dict, str, list[str]]:
    argv = [str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *ITEMS, *overrides]
    assert main(["profile", "--active", "2", *argv]) == 0
    out = tmp_path / "fault" / "profile"
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text(), argv


# ---------------------------------------------------------------- many tiny ops

def test_a_model_of_many_tiny_ops_is_per_op_overhead_with_its_levers(tmp_path):
    """300 elementwise ops on an 8x4 tensor: the profiler books them as forward/backward op time, yet no
    arithmetic is there to speed up; "compute-bound, no obvious lever" hid the batch and the fusion."""
    report, md, argv = _profile(tmp_path, f'model.name="{PKG}:tiny_ops"', "model.args={n=150}")
    assert report["verdict"] == "host-overhead-bound" and report["bottleneck"] == "host", report["breakdown_share"]
    assert report["tiny_op_share"] > 0.9
    sets = [r["set"] for r in report["recommendations"]]
    assert sets[0] == "data.batch_size=16" and "compile.enabled=true" in sets
    assert "spent in compute" not in md
    if report["breakdown_share"]["host_overhead"] < prof.STALLS["host"]:  # named through its tiny ops alone
        assert "per-op overhead" in md.split("**Verdict:")[1].splitlines()[0]
    for s in filter(None, sets):  # each pasted as it is loads as config
        load_config(argv[0], [*argv[1:], *s.split()])


def _share_of(fn) -> float:
    """tiny_op_share of one forward+backward of `fn`, recorded as profile records a step."""
    return prof.tiny_op_share(step_events(fn))


def test_tiny_op_share_tells_tiny_ops_from_real_work():
    small = torch.randn(8, 4, requires_grad=True)
    big = torch.randn(256, 256, requires_grad=True)
    idle = torch.zeros(1_000_000, requires_grad=True)

    def loop():
        h = small
        for _ in range(50):
            h = h * 1.0001 + 0.0
        return h.sum()

    assert _share_of(loop) > 0.9
    assert _share_of(lambda: (big @ big).sum()) < 0.1
    # one element of a large parameter: a scalar read, but its gradient writes the whole parameter
    assert _share_of(lambda: idle[0] * 2 + (big @ big).sum() * 0) < 0.5


# ---------------------------------------------------------------- optimizer against compute

def _shares(**parts) -> dict:
    return dict.fromkeys(prof.PARTS, 0.0) | parts


@pytest.mark.parametrize("shares, part", [
    (_shares(forward=0.28, backward=0.32, optimizer=0.40), "backward"),  # compute 60% beats the optimizer's 40%
    (_shares(forward=0.10, backward=0.20, optimizer=0.70), "optimizer"),
    (_shares(forward=0.30, backward=0.30, optimizer=0.40, data_wait=0.0), "forward"),
])
def test_the_optimizer_bounds_the_step_only_beyond_forward_and_backward_together(shares, part):
    assert prof.bottleneck(shares) == part
    run = SimpleNamespace(cfg=load_config(str(BASE_TOML), []), batches=SimpleNamespace(resident=True, loader=None),
                          trainee=SimpleNamespace(device=torch.device("cpu"), dtype="fp32", model=torch.nn.Linear(2, 2),
                                                  opt=torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(),
                                                                        foreach=True)))
    kind, recs = prof.verdict(shares, run, {})
    assert kind == ("optimizer-bound" if part == "optimizer" else "compute-bound")
    assert prof.describe(shares).startswith(f"{part} {shares[part]:.0%}")
    # under compute, the optimizer's large share still gets its own advice
    assert any("optimizer" in r["why"] for r in recs)


# ---------------------------------------------------------------- tune on an input config that fails

def test_tune_runs_no_candidate_over_an_input_config_that_fails(tmp_path, monkeypatch, capsys):
    """The input config fails in its first batch (a user error, exit 2): every candidate builds on it and would
    fail alike, each costing a trial's time; they are skipped saying why (not "budget"), and the error names the
    input config's own failure."""
    calls = []

    def failing(self, name, changes, timeout_s, what, *a, **k):  # the trial as `turbotrain train` ends it
        calls.append(changes)
        return {"status": "error", "reason": "exit 2: model.name = 'x:y' fails on the first batch", "wall_s": 0.5}

    monkeypatch.setattr(TrialRunner, "__call__", failing)
    rc = main(["tune", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "--budget-min", "5"])
    assert rc == 2 and calls == [{}]
    assert "fails on the first batch" in error_line(capsys.readouterr().err)
    trials = json.loads((tmp_path / "fault" / "tune" / "tune.json").read_text())["trials"]
    assert len(trials) > 1 and all(t["status"] == "skipped" and "input config fails" in t["reason"]
                                   for t in trials[1:])


# ---------------------------------------------------------------- scale over a run directory with checkpoints

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_scale_times_a_fresh_run_beside_checkpoints_of_that_name(tmp_path, monkeypatch, capsys):
    """A run named as scale's row (the user's, an earlier tool's) holds a checkpoint at step 6: each row must
    time a fresh run, not resume it (with train.steps=4 the row was "nothing to do"; with more, a run from step
    6 on). Each row runs `turbotrain train` with scale's own overrides, in this process (world size 1)."""
    from turbotrain import scale

    def train_here(n, config, overrides, log, what, run_dir, steps):
        world = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(_free_port())}  # what torchrun sets for its one process
        os.environ.update(world)
        try:
            rc = main(["train", config, *overrides])
        finally:
            for k in world:
                os.environ.pop(k)
        log.write_text(capsys.readouterr().err)  # what torchrun's log would hold: the run's own error line
        return rc

    base = [str(BASE_TOML), f"run.out_dir={lit(tmp_path)}"]
    assert main(["train", *base, 'run.name="fault-scale-ddp-1"', "train.steps=6", "checkpoint.every=3"]) == 0
    monkeypatch.setattr(scale, "_torchrun", train_here)
    assert main(["scale", *base, "train.steps=4", "--gpus", "1"]) == 0
    row = json.loads((tmp_path / "fault-scale" / "scale.json").read_text())["rows"][0]
    assert row.get("samples_per_s") and "error" not in row, row
    kept = tmp_path / "fault-scale-ddp-1"  # the earlier run is moved aside, not lost
    assert any((p / "checkpoints" / "step-00000006").is_dir() for p in kept.glob("previous-*"))


# ---------------------------------------------------------------- host reads hidden in the loss

def test_a_loss_that_reads_values_on_the_host_is_told_to_stop(tmp_path):
    """A loss reading each sample's loss with `.item()` (8 a step) and sleeping for the logging it feeds: host
    overhead, and the first fix is in the loss, not a batch size that would double the reads."""
    report, md, _ = _profile(tmp_path, 'model.name="userpkg.planted_s22:small"', f'train.loss="{PKG}:sync_loss"')
    assert report["verdict"] == "host-overhead-bound", report["breakdown_share"]
    assert report["host_reads_per_step"] == 8
    assert report["recommendations"][0]["do"] == "remove the host reads from the model and the loss"
    assert "remove the host reads" in md


def test_on_a_gpu_host_reads_replace_the_cuda_graph_advice():
    """CUDA graphs cannot capture a step that syncs: with reads in the step, reduce-overhead is not advised."""
    cfg = load_config(str(BASE_TOML), ['parallel.strategy="none"'])
    gpu = SimpleNamespace(device=torch.device("cuda"), dtype="bf16", model=torch.nn.Linear(2, 2))
    run = SimpleNamespace(cfg=cfg, batches=SimpleNamespace(resident=True, loader=None), trainee=gpu)
    shares = _shares(forward=0.2, backward=0.3, host_overhead=0.5)
    kind, recs = prof.verdict(shares, run, {})
    assert kind == "host/launch-bound" and "reduce-overhead" in recs[0]["set"]  # no reads: CUDA graphs first
    kind, recs = prof.verdict(shares, run, {}, reads=4)
    assert kind == "host/launch-bound" and recs[0]["do"] == "remove the host reads from the model and the loss"
    assert not any("reduce-overhead" in r["set"] for r in recs)


# ---------------------------------------------------------------- tune's winner changing the numerics

def test_a_winner_that_changes_the_precision_says_so_everywhere_it_is_given(tmp_path, monkeypatch, capsys):
    """bf16 measured fastest: the loss curve is no longer the input config's. Only FP8 was said to change the
    numerics; a dtype change went into tuned.toml as a plain speed-up."""
    def bf16_fastest(self, name, changes, timeout_s, what, *a, **k):  # the trial's measured figures
        rate = 200.0 if changes.get("precision.dtype") == "bf16" else 100.0
        return {"status": "ok", "samples_per_s": rate, "samples_per_s_median_window": rate, "peak_mem_gib": 0.1,
                "compile_s": 0.0, "wall_s": 0.5, "device_name": "cpu", "global_batch": 8}

    monkeypatch.setattr(TrialRunner, "__call__", bf16_fastest)
    assert main(["tune", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "--budget-min", "5", "--repeats", "1"]) == 0
    out = tmp_path / "fault" / "tune"
    result = json.loads((out / "tune.json").read_text())
    assert result["winner"]["changes"].get("precision.dtype") == "bf16"
    assert "precision.dtype=\"bf16\" changes the numerics" in result["numerics"]
    assert f"**Numerics:** {result['numerics']}." in (out / "tune.md").read_text()
    line = next(ln for ln in (out / "tuned.toml").read_text().splitlines() if ln.startswith("dtype"))
    assert "changes the numerics" in line and "--converge" in line
    assert f"warning: {result['numerics']}" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize("loss, reads", [("cross_entropy", 0), (f"{PKG}:copy_loss", 1), (f"{PKG}:sync_loss", 8)])
def test_on_a_gpu_copies_to_the_host_are_counted_as_host_reads(tmp_path, loss, reads):
    """`.cpu()` in the loss waits on a GPU as `.item()` does, with no scalar read to count; a clean step has none
    (nothing of turbotrain's own waits inside forward or backward)."""
    report, _, _ = _profile(tmp_path, 'model.name="userpkg.planted_s22:small"', f'train.loss="{loss}"',
                            'run.device="cuda"')
    assert report["host_reads_per_step"] == reads
