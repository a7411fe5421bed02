"""Planted cases of `profile`'s verdicts on host reads and float64: a Python number in an op is no float64 work
(a healthy model of small ops was told to compute in float32), boolean-mask indexing, torch.nonzero and
torch.unique read values on the host as `.item()` does (on a CPU they went uncounted), and host reads are
named whatever the verdict (under compute-bound they went unsaid). Verdicts are asserted by kind and advice."""
from __future__ import annotations

import json
import math
import signal
from types import SimpleNamespace

import pytest
import torch

from tests.faults.common import BASE_TOML, lit, step_events
from turbotrain import profile as prof
from turbotrain.cli import main
from turbotrain.config import load_config

pytestmark = pytest.mark.usefixtures("userpkg_importable")

PKG = "userpkg.planted_s25_profile"
ITEMS = ['data.name="userpkg.planted_s22:items"', "data.num_workers=0", 'train.loss="cross_entropy"',
         "model.args={}", "data.args={}"]
F32 = "compute the model and the loss in float32"
READS = "remove the host reads from the model and the loss"


def _profile(tmp_path, *overrides) -> dict:
    argv = [str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *ITEMS, *overrides]
    assert main(["profile", "--active", "2", *argv]) == 0
    report = json.loads((tmp_path / "fault" / "profile" / "report.json").read_text())
    shares = report["breakdown_share"]  # every number finite, the shares a whole
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
    assert all(math.isfinite(v) and v >= 0 for v in [*shares.values(), *report["breakdown_ms"].values()])
    for s in filter(None, (r["set"] for r in report["recommendations"])):  # each pasted as it is loads as config
        load_config(argv[0], [*argv[1:], *s.split()])
    return report


def _tips(report: dict) -> list[str]:
    return [r["do"] for r in report["recommendations"] if not r["set"]]


# ---------------------------------------------------------------- float64: numbers are not tensors

W = torch.randn(32, 4, requires_grad=True)
X = torch.randn(8, 32)


def _scaled():
    h = X @ W
    for _ in range(50):  # `h * 1.0001` reaches aten::mul as a 0-dim float64 tensor: a Python number
        h = h * 1.0001 + 0.5
    return h.sum()


def test_python_numbers_in_ops_are_not_float64_work():
    assert prof.f64_share(step_events(_scaled)) == 0.0
    w64 = W.detach().double().requires_grad_()
    assert prof.f64_share(step_events(lambda: (X.double() @ w64 * 0.5).sum())) > 0.5


@pytest.mark.parametrize("model, f64", [("userpkg.redteam_s23_tools:tiny_ops", False), (f"{PKG}:doubled", True)])
def test_float64_advice_only_for_float64_tensors(tmp_path, model, f64):
    """150 float32 ops with Python numbers (`h * 1.0001 + 0.0`) were told to go back to float32; a model whose
    parameters and inputs are float64 must still be."""
    args = "model.args={n=150}" if "tiny_ops" in model else "model.args={width=256}"
    report = _profile(tmp_path, f'model.name="{model}"', args)
    assert (report["float64_op_share"] >= prof.F64_SHARE) == f64, report["float64_op_share"]
    assert (F32 in _tips(report)) == f64, report["recommendations"]


# ---------------------------------------------------------------- host reads: every kind, under every verdict

def _read(how: str):
    def step():
        h = X @ W
        if how == "mask":
            h = h + h[h > 0].sum()
        elif how == "nonzero":
            h = h + torch.nonzero(h > 0).shape[0]
        elif how == "where":
            h = h + torch.where(h > 0)[0].numel()
        elif how == "unique":
            h = h + torch.unique(h.detach().round()).numel()
        elif how == "item":
            h = h + h.mean().item()
        return h.sum()
    return step


@pytest.mark.parametrize("how", ["mask", "nonzero", "where", "unique", "item"])
def test_values_read_to_size_an_output_are_host_reads(how):
    """t[mask], torch.nonzero, torch.where(cond), torch.unique size their output by the tensor's values: a host
    sync on a GPU like `.item()`, yet on a CPU no wait is recorded and they were counted as none."""
    assert prof.host_reads(step_events(_read(how)), 1) >= 1
    assert prof.host_reads(step_events(_read("none")), 1) == 0


def _run():
    model = torch.nn.Linear(8, 8)
    return SimpleNamespace(cfg=load_config(str(BASE_TOML), []),
                           batches=SimpleNamespace(resident=False, loader=SimpleNamespace(num_workers=0, dataset=None)),
                           trainee=SimpleNamespace(device=torch.device("cpu"), dtype="fp32", model=model,
                                                   opt=torch.optim.AdamW(model.parameters(), fused=True)))


@pytest.mark.parametrize("parts", [{"forward": 0.5, "backward": 0.5}, {"data_wait": 0.6, "forward": 0.4}])
def test_host_reads_are_named_whatever_the_verdict(parts):
    """Reads inside forward were advised against only under a host verdict: a compute- or data-bound step
    with two `.item()` a step said nothing of them, though each is a sync on the GPU the user trains on."""
    shares = dict.fromkeys(prof.PARTS, 0.0) | parts
    kind, recs = prof.verdict(shares, _run(), {}, reads=2.0)
    assert kind in ("compute-bound", "data-bound")
    assert READS in [r.get("do") for r in recs] and not any("reduce-overhead" in r["set"] for r in recs)
    _, none = prof.verdict(shares, _run(), {}, reads=0.0)
    assert READS not in [r.get("do") for r in none]


def test_boolean_mask_indexing_in_forward_is_named_first(tmp_path):
    report = _profile(tmp_path, f'model.name="{PKG}:synced"', 'model.args={how="mask"}')
    assert report["host_reads_per_step"] >= 8, report["host_reads_per_step"]
    assert READS in _tips(report)
    if report["verdict"].startswith("host"):
        assert report["recommendations"][0]["do"] == READS


def test_a_healthy_model_is_accused_of_neither(tmp_path):
    """No read and no float64 op in a float32 MLP: counts, not timings (its data share is near a threshold)."""
    report = _profile(tmp_path, 'model.name="userpkg.planted_s22:small"')
    assert report["host_reads_per_step"] == 0 and report["float64_op_share"] == 0
    assert READS not in _tips(report) and F32 not in _tips(report)


# ---------------------------------------------------------------- SIGTERM

class _Killed(Exception):
    pass


def test_sigterm_during_profile_cleans_up_and_says_so(tmp_path, capsys):
    """SIGTERM (a scheduler's stop) ended profile by the default handler: exit -15, no line, and the scratch
    folder with what the user's callbacks wrote left in the run's profile/ folder. It now ends as Ctrl-C does:
    one `error:` line, exit 143, nothing left behind. (The guard stands in for the default action, which would
    end the test process itself.)"""
    def guard(signum, frame):
        raise _Killed
    before = signal.signal(signal.SIGTERM, guard)
    try:
        argv = [str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *ITEMS, 'model.name="userpkg.planted_s22:small"',
                f'train.callbacks=["{PKG}:TermAtThirdStep"]']
        assert main(["profile", "--active", "4", *argv]) == 143
    finally:
        signal.signal(signal.SIGTERM, before)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: interrupted by SIGTERM during profile") and "Traceback" not in "".join(err)
    assert sorted(p.name for p in (tmp_path / "fault" / "profile").iterdir()) == []


# ---------------------------------------------------------------- too few steps to measure

def test_a_single_profiled_step_is_said_to_be_too_few(tmp_path, capsys):
    """--active 1 gave a verdict from one step's timing (a healthy MLP read as data-bound once) with nothing said."""
    argv = [str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *ITEMS, 'model.name="userpkg.planted_s22:small"']
    assert main(["profile", "--active", "1", *argv]) == 0
    out = tmp_path / "fault" / "profile"
    report = json.loads((out / "report.json").read_text())
    assert any(n.startswith("only 1 profiled step(s)") and "--active 5" in n for n in report["notes"])
    assert "warning: only 1 profiled step(s)" in capsys.readouterr().out
    assert "**Warning:** only 1 profiled step(s)" in (out / "report.md").read_text()
