"""Numerics drift: the default preset (gpt-shakespeare: its model, real text, optimizer and schedule) trained
for 30 steps on a CPU must log the stored loss curve, step by step, within a relative tolerance. The micro-batch
is 8 instead of 32 and the end-of-run eval is 1 batch: ~1 s of CPU a step on a 2-core CPU (batch 32 took ~6 s a
step on a loaded one: too slow for a test).

The baseline is tests/integration/baselines/gpt_shakespeare_cpu.json. Regenerate it (after a change that is
MEANT to move the numbers, or for a new torch) with

    TT_REGEN_BASELINES=1 python -m pytest -q tests/integration/test_loss_baseline.py

which writes the curve, the torch that produced it, and the curves of two perturbed runs (another seed, the
learning rate x 1.1). Those perturbed curves are the guard that this test can fail: each must miss the
baseline by more than 10x the tolerance (seed: ~5e-2, lr x 1.1: ~4e-2; for scale, lr x 1.01 moves it ~1.4e-3).
"""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

from tests.helpers import losses
from turbotrain.config import load_config
from turbotrain.trainer import train

BASELINE = Path(__file__).resolve().parent / "baselines" / "gpt_shakespeare_cpu.json"
PRESET = "gpt-shakespeare"
OVERRIDES = ["train.steps=30", "train.log_every=1", "train.eval_every=0", 'run.device="cpu"', "data.batch_size=8",
             "data.eval_batches=1"]
REL_TOL = 1e-3  # per step, relative to the stored loss
PERTURBED = {"seed-1": ["run.seed=1"], "lr-x1.1": ["train.lr=0.0033"]}  # the preset's lr is 3e-3
REGEN = os.environ.get("TT_REGEN_BASELINES") == "1"


def run_curve(tmp_path: Path, name: str, *extra: str) -> list[float]:
    train(load_config(PRESET, [*OVERRIDES, *extra, f"run.out_dir={str(tmp_path)!r}", f"run.name={name}"]))
    return losses(tmp_path, name)


def misses(curve: list[float], baseline: list[float], rel: float = REL_TOL) -> list[tuple[int, float, float]]:
    """(step, got, stored) for each step whose loss is off by more than rel (relative to the stored one)."""
    assert len(curve) == len(baseline), f"{len(curve)} logged steps, the baseline has {len(baseline)}"
    return [(i + 1, a, b) for i, (a, b) in enumerate(zip(curve, baseline)) if abs(a - b) > rel * abs(b)]


def max_rel(curve: list[float], baseline: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(curve, baseline))


def regenerate(tmp_path: Path) -> None:
    doc = {
        "what": f"losses per step of `turbotrain train {PRESET} {' '.join(OVERRIDES)}` (in-process, fp32)",
        "regenerate": "TT_REGEN_BASELINES=1 python -m pytest -q tests/integration/test_loss_baseline.py",
        "rel_tol": REL_TOL,
        "produced_by": {"torch": torch.__version__, "python": platform.python_version(),
                        "machine": platform.machine(), "torch_threads": torch.get_num_threads()},
        "losses": run_curve(tmp_path, "baseline"),
        "perturbed": {k: {"overrides": v, "losses": run_curve(tmp_path, k, *v)} for k, v in PERTURBED.items()},
    }
    BASELINE.parent.mkdir(exist_ok=True)
    BASELINE.write_text(json.dumps(doc, indent=1) + "\n")


def test_default_preset_cpu_curve_matches_the_stored_baseline(tmp_path):
    if REGEN:
        regenerate(tmp_path / "regen")
    stored = json.loads(BASELINE.read_text())
    baseline = stored["losses"]
    assert len(baseline) == 30 and baseline[-1] < 0.8 * baseline[0], "the stored curve must be a run that learns"
    # the guard: the comparison rejects runs that differ by a seed or a 10 % learning rate, by a wide margin
    for name, run in stored["perturbed"].items():
        assert misses(run["losses"], baseline), f"perturbed run {name} passes the comparison: it cannot fail"
        assert max_rel(run["losses"], baseline) > 10 * REL_TOL, f"perturbed run {name} is too close to the baseline"
    curve = run_curve(tmp_path, "now")
    bad = misses(curve, baseline)
    assert not bad, (f"loss curve drifted from {BASELINE.name} (made with torch {stored['produced_by']['torch']}, "
                     f"this is torch {torch.__version__}); (step, now, stored), first 5: {bad[:5]}; "
                     f"max relative difference {max_rel(curve, baseline):.2e} > {REL_TOL}. If the change is "
                     f"meant, regenerate: {stored['regenerate']}")
