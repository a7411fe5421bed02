"""Planted cases for `turbotrain tune` (wave 7): a knob that changes the math, ties and noise, a tune that
compared nothing.

- A user model whose samples see each other in forward (centred on the batch mean, no BatchNorm module), or a
  user loss summed over the micro-batch: a micro-batch x accumulation change changes the math although the
  global batch is kept; the probe measures it, the micro-batch is not searched, and tune says why. A per-sample
  model keeps its micro-batch candidates (no false alarm).
- A candidate as fast as the input config whose one lucky round made its median 3 % faster: it is noise, the
  input config is kept and tune says so. Of two finalists within noise of each other, the one with fewer
  changes wins (the extra change measured nothing).
- Every candidate failed: tuned.toml is the input config, and tune says nothing was compared rather than
  "nothing measured faster".

The trials here are measured figures given by a stand-in for the trial process (as tests/faults/test_tune_redteam
does): what is under test is what tune decides and writes from them; the probe runs the real user code."""
from __future__ import annotations

import json

import pytest

from tests.faults.common import BASE_TOML, lit
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.tune import TrialRunner, outcome
from turbotrain.tune_space import Ctx, dimensions, probe_workload

pytestmark = pytest.mark.usefixtures("userpkg_importable")

PKG = "userpkg.planted_s25_tune"
ITEMS = [f'data.name="{PKG}:items"', 'train.loss="cross_entropy"', "data.batch_size=8", "train.grad_accum=2"]
MICRO = "micro-batch x accumulation, checkpointing"


def _stand_in(rate, log=None):
    """A TrialRunner.__call__ that runs nothing: the n-th run of a configuration measures rate(config, n)."""
    runs: dict[str, int] = {}

    def call(self, name, changes, timeout_s, what, *a, **k):
        key = json.dumps(changes, sort_keys=True)
        n = runs[key] = runs.get(key, -1) + 1
        r = rate(changes, n)
        if log is not None:
            log.append((dict(changes), r))
        if r is None:
            return {"status": "error", "reason": "exit 1: RuntimeError: planted failure", "wall_s": 0.5}
        return {"status": "ok", "samples_per_s": r, "samples_per_s_median_window": r, "peak_mem_gib": 0.1,
                "compile_s": 0.0, "wall_s": 0.5, "device_name": "cpu", "global_batch": 16}

    return call


def _windows(rate, factors, global_batch=16):
    """A TrialRunner.__call__ that writes a run as `train` would (summary.json; metrics.jsonl with a log window every
    10 steps, the i-th at rate x factors[i]) and reads it back with tune's own `outcome`."""
    runs: dict[str, int] = {}

    def call(self, name, changes, timeout_s, what, *a, **k):
        key = json.dumps(changes, sort_keys=True)
        n = runs[key] = runs.get(key, -1) + 1
        r, run_dir = rate(changes, n), self.dir / name
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text("".join(
            json.dumps({"step": 10 * (i + 1), "samples_per_s": r * f}) + "\n" for i, f in enumerate(factors)))
        (run_dir / "summary.json").write_text(json.dumps({"samples_per_s": r, "peak_mem_gib": 0.1, "compile_s": 0.0,
                                                          "device_name": "cpu", "global_batch": global_batch}))
        return outcome(0, self.dir / f"{name}.log", run_dir / "summary.json", 0.5)

    return call


def _tune(tmp_path, *overrides, repeats=2):
    return main(["tune", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *overrides, "--budget-min", "5",
                 "--repeats", str(repeats)])


def _out(tmp_path):
    out = tmp_path / "fault" / "tune"
    return json.loads((out / "tune.json").read_text()), (out / "tune.md").read_text(), (out / "tuned.toml").read_text()


@pytest.mark.parametrize("model, loss, says", [
    ("coupled", "cross_entropy", "each sample's output depends on the other samples of its micro-batch"),
    ("per_sample", f"{PKG}:sum_loss", "is not a mean over the samples"),
    ("per_sample", "cross_entropy", None),
])
def test_a_micro_batch_change_that_changes_the_math_is_not_searched(model, loss, says):
    cfg = load_config(str(BASE_TOML), [*ITEMS, f'model.name="{PKG}:{model}"', f'train.loss="{loss}"'])
    probe, eff = probe_workload(cfg)
    micro = next(d for d in dimensions(probe) if d.name == MICRO).build(Ctx(probe, eff))
    if says is None:  # samples independent, a mean loss: the micro-batch is a speed lever
        assert probe.micro_batch_math is None and any("data.batch_size" in c.changes for c in micro)
    else:
        assert says in probe.micro_batch_math and not any("data.batch_size" in c.changes for c in micro)


def test_tune_says_which_knob_it_kept_out_and_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(TrialRunner, "__call__", _stand_in(lambda changes, n: 100.0))
    assert _tune(tmp_path, *ITEMS, f'model.name="{PKG}:coupled"', repeats=0) == 0
    result, md, _ = _out(tmp_path)
    assert not any("data.batch_size" in t["tried"] for t in result["trials"])
    assert "Not searched: micro-batch x accumulation, as each sample's output depends" in md
    assert "micro-batch x accumulation not searched" in capsys.readouterr().out


def test_a_lucky_round_is_noise_and_the_input_config_is_kept(tmp_path, monkeypatch, capsys):
    """The fused optimizer is as fast as the input config: 103, 104, 102 against the input's 100, 90, 110. Its
    median is 3 % faster only because of the input's slow round; in the last round the input was faster."""
    def rate(changes, n):
        if not changes:
            return [100.0, 90.0, 110.0][min(n, 2)]
        if changes == {"train.optimizer_impl": "fused"}:
            return [103.0, 104.0, 102.0][min(n, 2)]
        return 50.0

    monkeypatch.setattr(TrialRunner, "__call__", _stand_in(rate))
    assert _tune(tmp_path) == 0
    result, md, toml = _out(tmp_path)
    assert result["winner"]["changes"] == {} and "optimizer_impl" not in toml
    assert "fused optimizer" in result["noise"] and "within the noise of the input config" in result["noise"]
    assert "within the noise of the input config" in toml.splitlines()[1]
    assert f"**Note:** {result['noise']}." in md
    assert "within the noise of the input config" in capsys.readouterr().out


def test_of_two_finalists_within_noise_the_one_with_fewer_changes_wins(tmp_path, monkeypatch):
    """Four loader workers double the speed; the fused optimizer on top of them adds 1-2 % in each round, which
    is noise: tuned.toml must not carry the extra change."""
    workers = {"data.device_resident": False, "data.num_workers": 4, "data.persistent_workers": True,
               "data.prefetch_factor": 4, "data.pin_memory": False}

    def rate(changes, n):
        if changes == workers:
            return 200.0
        if changes == {**workers, "train.optimizer_impl": "fused"}:
            return [203.0, 202.0, 203.0][min(n, 2)]
        return 100.0 if not changes else 50.0

    monkeypatch.setattr(TrialRunner, "__call__", _stand_in(rate))
    assert _tune(tmp_path) == 0
    result, _, toml = _out(tmp_path)
    assert result["winner"]["changes"] == {k: v for k, v in workers.items() if k in ("data.num_workers",
                                           "data.persistent_workers", "data.prefetch_factor")}, result["winner"]
    assert "optimizer_impl" not in toml and "num_workers = 4" in toml
    assert "within noise of each other: the one with fewer changes is kept" in result["noise"]


def test_a_tune_where_only_the_input_config_ran_says_nothing_was_compared(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(TrialRunner, "__call__", _stand_in(lambda changes, n: None if changes else 100.0))
    assert _tune(tmp_path) == 0
    result, md, toml = _out(tmp_path)
    assert result["winner"]["changes"] == {}
    assert "no configuration but the input config was measured" in toml.splitlines()[1]
    assert "beyond noise" not in toml
    assert "**Note:** no configuration but the input config was measured" in md
    assert "warning: tune: no configuration but the input config was measured" in capsys.readouterr().out


@pytest.mark.parametrize("sig, status, says", [
    (9, "oom", "killed by SIGKILL, most often the kernel's out-of-memory killer"),
    (11, "error", "killed by SIGSEGV (a crash"),
])
def test_a_trial_killed_by_a_signal_is_reported_as_such(tmp_path, sig, status, says):
    """A trial the kernel killed (host memory ran out: SIGKILL) or that crashed in native code (SIGSEGV) wrote no
    error line: its status and reason say what ended it, not its last progress line."""
    import subprocess
    import sys

    from turbotrain.tune import outcome

    log = tmp_path / "t.log"
    log.write_text("step 10/40 | loss 1.2 | 90.0 samples/s\n")
    rc = subprocess.run([sys.executable, "-c", f"import os; os.kill(os.getpid(), {sig})"]).returncode
    res = outcome(rc, log, tmp_path / "summary.json", 1.0)
    assert res["status"] == status and says in res["reason"], res


def test_each_tuned_key_is_credited_to_a_trial_on_the_winners_own_path():
    """4 workers were kept (2.00x), then 2 workers screened faster (1.10x over them) but lost the finalists' re-runs:
    the winner has 4 workers, so its persistent_workers line must quote the 4-worker trial, not the 2-worker one
    that set the same value in a configuration the winner is not."""
    from turbotrain.tune_report import tuned_toml

    def workers(n):
        return {"data.num_workers": n, "data.persistent_workers": True}

    trials = [{"id": "t00", "label": "input config", "status": "ok", "tried": {}, "config": {}, "samples_per_s": 100.0},
              {"id": "t01", "label": "4 loader workers", "status": "ok", "tried": workers(4), "config": workers(4),
               "samples_per_s": 200.0, "gain": 2.0},
              {"id": "t02", "label": "2 loader workers", "status": "ok", "tried": workers(2), "config": workers(2),
               "samples_per_s": 220.0, "gain": 1.1}]
    result = {"winner": {"label": "4 loader workers", "trial": "t01", "changes": workers(4), "samples_per_s": 190.0,
                         "speedup": 1.9},
              "trials": trials, "overrides": [], "run_name": "fault", "device": "cpu", "torch": "x",
              "config": str(BASE_TOML)}
    lines = {ln.split(" =")[0]: ln for ln in tuned_toml(result).splitlines() if " = " in ln}
    assert "4 loader workers: 2.00x" in lines["persistent_workers"] and "t02" not in lines["persistent_workers"]
    assert "(t01, 200.0 samples/s)" in lines["num_workers"]


def test_the_inputs_own_slow_setting_is_measured_against_its_off_state():
    """An input that compiles, autocasts to bf16 on a CPU and loads with a worker: eager, fp32 and no workers are
    each a candidate (each can be the faster one: a small model, a CPU without bf16 units, cheap items)."""
    cfg = load_config(str(BASE_TOML), [*ITEMS, f'model.name="{PKG}:per_sample"', "compile.enabled=true",
                                       'precision.dtype="bf16"', "data.num_workers=1"])
    probe, eff = probe_workload(cfg)
    cands = {d.name: d.build(Ctx(probe, eff)) for d in dimensions(probe)}
    assert cands["compile"][0].changes == {"compile.enabled": False}
    assert {"precision.dtype": "fp32"} in [c.changes for c in cands["precision"]]
    assert cands["data path"][-1].changes["data.num_workers"] == 0


def test_an_input_whose_compile_is_slower_gets_eager(tmp_path, monkeypatch):
    def rate(changes, n):
        return 200.0 if changes == {"compile.enabled": False} else 100.0

    monkeypatch.setattr(TrialRunner, "__call__", _stand_in(rate))
    assert _tune(tmp_path, "compile.enabled=true", repeats=1) == 0
    result, _, toml = _out(tmp_path)
    assert result["winner"]["changes"] == {"compile.enabled": False}
    assert "enabled = false  # no compile (eager): 2.00x" in toml


def test_a_winner_measured_once_says_its_noise_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(TrialRunner, "__call__", _stand_in(lambda changes, n: 200.0 if changes else 100.0))
    assert _tune(tmp_path, repeats=0) == 0
    result, md, _ = _out(tmp_path)
    assert result["winner"]["changes"] and "measured once" in result["noise"] and "noise is unknown" in md


def test_a_re_run_without_a_partner_still_counts_as_noise(tmp_path, monkeypatch):
    """As a loaded 2-core machine measured it: prefetch 8 screened at 3.3x the input config, its re-run at 0.4x;
    the input config's re-runs did not come back (cut by the budget, or failed). Its median (mean of two) was
    called a 1.86x win; a run slower than the input config's median says the gain is noise."""
    def rate(changes, n):
        if not changes:
            return 141.0 if n == 0 else None
        if changes == {"train.optimizer_impl": "fused"}:
            return [460.0, 63.0, 470.0][min(n, 2)]
        return 50.0

    monkeypatch.setattr(TrialRunner, "__call__", _stand_in(rate))
    assert _tune(tmp_path) == 0
    result, _, toml = _out(tmp_path)
    assert result["winner"]["changes"] == {} and "within the noise of the input config" in result["noise"]
    assert "optimizer_impl" not in toml
