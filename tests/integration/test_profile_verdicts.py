"""Planted bottlenecks: each kind of step gets the verdict that fits its numbers and advice that fits the
verdict. Timing shares move with the machine's load, so verdicts are asserted only where the planted effect
dwarfs everything else; the rest are invariants that hold whatever the timings."""
import json
import os
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from turbotrain import profile as prof
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.profile import PARTS, format_report, run_profile, verdict
from turbotrain.rundir import RunDir

HERE = __name__  # the planted factories below are user code, named "module:factory" like any other

# ---------------------------------------------------------------- planted user code


class MostlyIdleParameter(nn.Module):
    """A tiny MLP beside a 4M-element parameter the forward barely touches: every step AdamW still updates
    it and its 2 x 4M state, so the optimizer step dwarfs forward and backward."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
        self.idle = nn.Parameter(torch.zeros(4_000_000))

    def forward(self, x):
        return self.net(x) + self.idle[0]


class HeavyForward(nn.Module):
    """Work without gradients inside forward (a frozen feature extractor run 24 times): forward dwarfs
    backward and the optimizer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(512, 512) / 512**0.5)
        self.up, self.head = nn.Linear(32, 512), nn.Linear(512, 4)

    def forward(self, x):
        h = self.up(x)
        with torch.no_grad():
            f = h.detach()
            for _ in range(24):
                f = torch.tanh(f @ self.w)
        return self.head(h + f)


class Diverged(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(32, 4)

    def forward(self, x):
        return self.net(x) * float("nan")


def idle_parameter():
    return MostlyIdleParameter()


def heavy_forward():
    return HeavyForward()


def diverged():
    return Diverged()


# ---------------------------------------------------------------- helpers

VECTORS = ["data.args.in_features=32", "data.args.num_classes=4", "data.args.size=256", "data.num_workers=0"]


def _profile(tmp_path, *overrides):
    cfg = load_config("mlp-seed", [f"run.out_dir={str(tmp_path)!r}", "precision.dtype=fp32", "data.batch_size=16",
                                   "train.steps=8", *overrides])
    return run_profile(cfg, active=3)


def _markdown(tmp_path) -> str:
    return (tmp_path / "mlp-seed" / "profile" / "report.md").read_text()


OWN_PART = {"data-bound": "data", "communication-bound": "communication", "host/launch-bound": "host",
            "host-overhead-bound": "host", "optimizer-bound": "optimizer"}


def assert_consistent(report: dict, markdown: str | None = None) -> None:
    """The invariants every report keeps, whatever the timings: the verdict fits the numbers, the advice
    fits the verdict, and the text says no more than that."""
    kind, recs, shares = report["verdict"], report["recommendations"], report["breakdown_share"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
    g = prof.groups(shares)
    stalls = {k: g[k] for k, limit in prof.STALLS.items() if g[k] >= limit}
    # the optimizer bounds the step only beyond forward+backward together
    working = "optimizer" if g["optimizer"] > g["forward"] + g["backward"] else max(("forward", "backward"),
                                                                                      key=g.__getitem__)
    tiny = working != "optimizer" and (report.get("tiny_op_share") or 0.0) >= prof.TINY_BOUND
    own = OWN_PART.get(kind)
    if stalls:  # the step waits more than a stall's threshold: the largest such stall is the verdict
        assert own == max(stalls, key=stalls.get), (kind, shares)
    elif tiny:  # compute mostly in ops on tiny tensors (CPU): per-op overhead, named as host overhead
        assert kind == "host-overhead-bound" and report["verdict_detail"].startswith("per-op overhead"), (kind, shares)
    else:  # else the largest working part: the optimizer by name, forward or backward as compute
        assert (own == "optimizer") == (working == "optimizer") and own in (None, "optimizer"), (kind, shares)
        assert kind in ("optimizer-bound", "compute-bound", "memory-bound")
    part = own or working
    if not tiny or stalls:
        assert report["verdict_detail"].startswith(f"{prof.LABELS.get(part, part)} {g[part]:.0%}")
    if own and tiny and not stalls:  # its advice is on the compute's evidence
        assert recs and recs[0]["evidence_share"] == pytest.approx(g["forward"] + g["backward"], abs=1e-3), recs
    elif own:  # a named part comes with its own advice, ranked first, on the part's evidence
        assert recs and recs[0]["evidence_share"] == pytest.approx(g[own], abs=1e-3), recs
    for r in recs:
        assert (r["set"] or r.get("do")) and r["why"], r  # a key to set or a change to make, and why
    text = markdown if markdown is not None else format_report(report)
    assert ("spent in compute" in text) == (kind == "compute-bound" and not recs)


# ---------------------------------------------------------------- planted runs


def test_slow_items_with_workers_used_up_get_data_advice(tmp_path, monkeypatch):
    """Data-bound with no loader key left (workers at the core count, a dataset that is not in-memory
    tensors): still data advice, in the user's code, never the compute-bound sentence."""
    monkeypatch.setattr(prof, "_cpus", lambda: 2)  # 1 worker is then all the cores the step may use
    report = _profile(tmp_path, 'model.name="userpkg.planted:small_model"', 'data.name="userpkg.planted:slow_data"',
                      "data.args.delay=0.05", "data.num_workers=1", "data.prefetch_factor=1", "data.batch_size=8")
    md = _markdown(tmp_path)
    # 50 ms sleeps x 8 items = 400 ms of wall time a batch, less the step the worker overlaps (a tiny model's, ~100
    # ms on a loaded CPU); one batch prefetched at most (a deeper queue, filled while the model is built, would
    # feed the few profiled steps at once)
    assert report["verdict"] == "data-bound"
    assert_consistent(report, md)
    advice = " ".join(r["set"] + " " + r.get("do", "") + " " + r["why"] for r in report["recommendations"])
    assert "__getitem__" in advice and "CPU cores" in advice and "data.num_workers" not in advice
    assert "spent in compute" not in md and "__getitem__" in md


def test_idle_parameter_is_optimizer_bound_and_fused_is_advised(tmp_path):
    report = _profile(tmp_path, f'model.name="{HERE}:idle_parameter"', *VECTORS, 'train.optimizer_impl="foreach"')
    assert_consistent(report, _markdown(tmp_path))
    assert report["verdict"] == "optimizer-bound" and report["bottleneck"] == "optimizer"
    assert report["recommendations"][0]["set"] == 'train.optimizer_impl="fused"'
    # the state's size is reported: AdamW keeps two fp32 moments of the 4M-element parameter (~30.5 MiB)
    assert report["optimizer"]["name"] == "AdamW" and report["optimizer"]["impl"] == "foreach"
    assert report["optimizer"]["state_mib"] == pytest.approx(2 * 4e6 * 4 / 2**20, rel=0.01)
    assert "MiB of optimizer state" in report["recommendations"][0]["why"]
    assert "MiB of state" in _markdown(tmp_path)


def test_fused_optimizer_is_not_advised_again(tmp_path):
    report = _profile(tmp_path, f'model.name="{HERE}:idle_parameter"', *VECTORS, 'train.optimizer_impl="fused"')
    assert_consistent(report, _markdown(tmp_path))
    assert report["optimizer"]["impl"] == "fused"
    assert not any("fused" in r["set"] or "fused" in r.get("do", "") for r in report["recommendations"])


def test_heavy_forward_is_compute_bound_and_names_forward(tmp_path):
    report = _profile(tmp_path, f'model.name="{HERE}:heavy_forward"', *VECTORS)
    md = _markdown(tmp_path)
    assert_consistent(report, md)
    assert report["verdict"] == "compute-bound" and report["bottleneck"] == "forward"
    assert "forward" in md.split("**Verdict:")[1].splitlines()[0]
    # a healthy model: no divergence note
    assert report["loss_finite"] and not report["notes"] and "non-finite" not in md


def test_non_finite_loss_is_flagged(tmp_path, capsys):
    report = _profile(tmp_path, f'model.name="{HERE}:diverged"', *VECTORS)
    assert_consistent(report, _markdown(tmp_path))
    assert not report["loss_finite"]
    assert any("non-finite in the profiled steps" in n and "diverged model" in n for n in report["notes"])
    assert "diverged model" in _markdown(tmp_path)
    saved = json.loads((tmp_path / "mlp-seed" / "profile" / "report.json").read_text())
    assert saved["loss_finite"] is False and saved["notes"] == report["notes"]
    assert any(line.startswith("[turbotrain] warning:") and "non-finite" in line
               for line in capsys.readouterr().out.splitlines())


# ---------------------------------------------------------------- refusals (before any build)


@pytest.mark.parametrize("link", ["profile", "profile/report.md", "profile/trace.json.gz"])
def test_no_write_through_a_link_in_the_run_dir(tmp_path, link):
    run, elsewhere = tmp_path / "mlp-seed", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "profile").mkdir(parents=True)
    if link == "profile":
        (run / "profile").rmdir()
        target = elsewhere
    else:
        target = elsewhere / "x"
    (run / link).symlink_to(target)
    with pytest.raises(UserError, match="symbolic link") as e:
        _profile(tmp_path, 'model.name="userpkg.planted:small_model"', *VECTORS)
    assert "\n" not in str(e.value)
    assert not any(elsewhere.iterdir())


def test_refuses_a_run_that_is_training_now(tmp_path):
    cfg = load_config("mlp-seed", [f"run.out_dir={str(tmp_path)!r}"])
    live = RunDir(cfg.run, is_main=True).open()  # as `turbotrain train` holds it while it runs
    try:
        with pytest.raises(UserError, match=rf"is training now \(pid {os.getpid()}\): profile under another "
                                            r"run\.name") as e:
            _profile(tmp_path, 'model.name="userpkg.planted:small_model"', *VECTORS)
        assert "\n" not in str(e.value)
        assert not (tmp_path / "mlp-seed" / "profile").exists()
    finally:
        live.release()


# ---------------------------------------------------------------- every kind, on planted shares


def _fake_run(device="cpu", optimizer="adamw", impl="foreach", workers=0, dataset=None, resident=False, cfg=()):
    cfg = load_config("mlp-seed", [f'train.optimizer="{optimizer}"', f'train.optimizer_impl="{impl}"', *cfg])
    model = nn.Linear(64, 64)
    kernel = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for": {"foreach": False}}[impl]
    opt = torch.optim.AdamW(model.parameters(), **kernel)
    model(torch.randn(2, 64)).sum().backward()
    opt.step()  # the state exists, as after the profiled steps
    loader = None if resident else SimpleNamespace(num_workers=workers, dataset=dataset or object())
    return SimpleNamespace(cfg=cfg, trainee=SimpleNamespace(device=torch.device(device), dtype="fp32", model=model,
                                                            opt=opt),
                           batches=SimpleNamespace(resident=resident, loader=loader))


def _shares(**parts):
    """Planted shares summing to 1: what the given parts leave is forward (1/3) and backward (2/3)."""
    rest = 1 - sum(parts.values())
    return dict.fromkeys(PARTS, 0.0) | {"forward": rest / 3, "backward": 2 * rest / 3} | parts


def _report(shares, kind, recs):
    """The smallest report format_report takes, for the text invariants."""
    return {"workload": "w", "device": "cpu", "dtype": "fp32", "compile": None, "strategy": "none",
            "global_batch": 1, "step_ms_median": 1.0, "steps_profiled": 1, "breakdown_ms": shares,
            "breakdown_share": shares, "verdict": kind, "verdict_detail": prof.describe(shares),
            "recommendations": recs, "optimizer": {"name": "AdamW", "impl": "foreach", "params": 1, "state_mib": 0},
            "top_ops": [], "memory": {"peak_allocated_gib": 0}, "trace": "trace.json.gz"}


@pytest.mark.parametrize("name, shares, run, kind, first", [
    ("data, workers used up", _shares(data_wait=0.87), dict(workers=os.cpu_count()), "data-bound", ""),
    ("data, no workers", _shares(data_wait=0.6), dict(workers=0), "data-bound", "data.num_workers="),
    ("data, resident", _shares(h2d_copy=0.5), dict(resident=True), "data-bound", "data.batch_size="),
    ("optimizer, foreach", _shares(optimizer=0.8), {}, "optimizer-bound", 'train.optimizer_impl="fused"'),
    ("optimizer, fused", _shares(optimizer=0.6), dict(impl="fused"), "optimizer-bound", "data.batch_size="),
    ("optimizer, for", _shares(optimizer=0.6), dict(impl="for"), "optimizer-bound", 'train.optimizer_impl="fused"'),
    ("optimizer, user factory", _shares(optimizer=0.7), dict(optimizer="mypkg.opt:build"), "optimizer-bound", ""),
    ("host, cpu", _shares(host_overhead=0.5), {}, "host-overhead-bound", "data.batch_size="),
    ("host, cpu, accumulating", _shares(host_overhead=0.5), dict(cfg=["train.grad_accum=4"]), "host-overhead-bound",
     "data.batch_size=1024 train.grad_accum=1"),
    ("host, gpu", _shares(host_overhead=0.5), dict(device="cuda"), "host/launch-bound", "compile.enabled=true"),
    # the fake model's gradients fit one bucket: accumulation first, no bucket advice (test_profile.py has the other)
    ("communication", _shares(exposed_comm=0.3), dict(device="cuda", cfg=['parallel.strategy="ddp"']),
     "communication-bound", "train.grad_accum="),
    ("forward", _shares(forward=0.7, backward=0.3), {}, "compute-bound", None),
    ("backward, checkpointing", _shares(), dict(cfg=['memory.activation_checkpointing="full"']), "compute-bound",
     'memory.activation_checkpointing="none"'),
    # a large optimizer under another verdict still gets its advice, after the verdict's own
    ("data and optimizer", _shares(data_wait=0.3, optimizer=0.5), dict(workers=0), "data-bound", "data.num_workers="),
])
def test_every_verdict_comes_with_advice_that_fits(name, shares, run, kind, first):
    got, recs = verdict(shares, _fake_run(**run), {})
    report = _report(shares, got, recs)
    assert got == kind, name
    assert_consistent(report)
    if first is None:
        assert not recs and "spent in compute" in format_report(report)
    elif first:
        assert recs[0]["set"].startswith(first), recs
    else:  # no key is left: the first fix is a change in the user's code
        assert recs[0]["set"] == "" and recs[0]["do"], recs
    sets = " ".join(r["set"] for r in recs)
    assert "data.num_workers" not in sets or kind == "data-bound"
    assert not (got != "host/launch-bound" and "reduce-overhead" in sets)  # CUDA graphs only for a GPU host stall
    if shares["optimizer"] >= prof.OPTIMIZER_SECONDARY and run.get("impl", "foreach") != "fused" \
            and ":" not in run.get("optimizer", ""):
        assert 'train.optimizer_impl="fused"' in sets


def test_a_verdict_without_advice_never_claims_compute():
    """format_report's no-advice sentence speaks of compute only under a compute-bound verdict."""
    shares = _shares(data_wait=0.9)
    assert "spent in compute" not in format_report(_report(shares, "data-bound", []))
    assert "spent in compute" in format_report(_report(_shares(), "compute-bound", []))
