"""Planted cases for `turbotrain tune` (wave 11): an input config whose failure a lever of the search cures.

- The input config compiles and its compile falls back to eager (a trial error: what was asked for did not run).
  Eager is a candidate of the compile dimension and trains: tune measures it first and recommends it, rather
  than skipping every candidate as "the input config fails: fix it first" and ending with no tuned.toml.
- The input config's error line names a key a candidate changes (its loader workers crash): that candidate runs,
  and the candidates after it build on the configuration that ran.
- An input config that fails for what no candidate changes (its model's first batch) still runs nothing more
  (tests/faults/test_redteam_s23_tools.py): the rule above is no licence to spend the budget on failures.
- tuned.toml's head says how the input config ended, not that it "did not run".

The trials here are measured figures given by a stand-in for the trial process (as test_planted_s25_tune does),
read back through tune's own `outcome`: what is under test is what tune decides and writes from them."""
from __future__ import annotations

import json

import pytest

from tests.faults.common import BASE_TOML, lit
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.tune import TrialRunner, outcome

pytestmark = pytest.mark.usefixtures("userpkg_importable")


def _runs(result_of, calls):
    """A TrialRunner.__call__ that writes what `train` writes (summary.json, metrics.jsonl, the log) from
    result_of(config) = (rc, summary or None, log line) and reads it back with `outcome`."""
    def call(self, name, changes, timeout_s, what, *a, **k):
        calls.append(dict(changes))
        rc, summary, line = result_of(changes)
        run_dir = self.dir / name
        run_dir.mkdir(parents=True)
        (self.dir / f"{name}.log").write_text(line + "\n")
        if summary is not None:
            (run_dir / "metrics.jsonl").write_text("".join(
                json.dumps({"step": 10 * (i + 1), "samples_per_s": summary["samples_per_s"]}) + "\n" for i in range(4)))
            (run_dir / "summary.json").write_text(json.dumps({"peak_mem_gib": 0.1, "compile_s": 0.0,
                                                              "device_name": "cpu", "global_batch": 16, **summary}))
        return outcome(rc, self.dir / f"{name}.log", run_dir / "summary.json", 0.5)

    return call


def _tune(tmp_path, *overrides, flags=()):
    rc = main(["tune", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *overrides, "--budget-min", "5",
               "--repeats", "1", *flags])
    out = tmp_path / "fault" / "tune"
    return rc, json.loads((out / "tune.json").read_text()), out


def test_an_input_whose_compile_falls_back_gets_eager(tmp_path, monkeypatch):
    """Compiled, the input config falls back to eager (its run says so: an error); eager itself trains at 100
    samples/s. tune recommends compile.enabled=false, and the rest of the search builds on it."""
    calls: list[dict] = []

    def result_of(config):
        if config.get("compile.enabled") is False:
            return 0, {"samples_per_s": 100.0}, "done"
        return 0, {"samples_per_s": 90.0, "compile_fell_back": True}, "warning: compile failed; eager"

    monkeypatch.setattr(TrialRunner, "__call__", _runs(result_of, calls))
    rc, result, out = _tune(tmp_path, "compile.enabled=true", flags=["--converge"])
    assert rc == 0, result["trials"]
    assert result["trials"][0]["status"] == "error" and "fell back to eager" in result["trials"][0]["reason"]
    assert result["winner"]["changes"] == {"compile.enabled": False}
    assert load_config(str(out / "tuned.toml")).compile.enabled is False  # it trains what was measured
    # eager is measured first, and the other dimensions' candidates build on it (not skipped, not on the input)
    assert calls[1] == {"compile.enabled": False} and len(calls) > 3
    assert all(c.get("compile.enabled") is False for c in calls[2:] if not c.get("compile.enabled"))
    assert any("train.optimizer_impl" in c for c in calls) and all("compile.enabled" in c for c in calls[1:])
    # the input's run measured eager (its compile fell back): no ratio is taken over it as the input config's speed
    assert result["baseline_samples_per_s"] is None and not any(t.get("speedup") for t in result["trials"])
    head = (out / "tuned.toml").read_text().splitlines()[1]
    assert "the input config failed (error: compile failed and fell back to eager" in head, head
    assert result["converge"] == {"checked": False,  # --converge: no loss of the input's to compare, said as such
                                  "why": "the input config has no finished run to compare the loss with"}


def test_an_input_whose_error_names_a_lever_gets_the_candidate_that_changes_it(tmp_path, monkeypatch):
    """The input config's loader workers crash (its error line names data.num_workers); without workers it trains.
    The no-worker candidate runs and wins; the candidates the failure does not name wait until one ran."""
    calls: list[dict] = []

    def result_of(config):
        if config.get("data.num_workers", 2):
            return 2, None, "error: data.num_workers = 2: a DataLoader worker exited unexpectedly; set it to 0"
        return 0, {"samples_per_s": 100.0}, "done"

    monkeypatch.setattr(TrialRunner, "__call__", _runs(result_of, calls))
    rc, result, out = _tune(tmp_path, "data.num_workers=2")
    assert rc == 0, result["trials"]
    assert result["winner"]["changes"].get("data.num_workers") == 0
    assert load_config(str(out / "tuned.toml")).data.num_workers == 0
    # the worker counts (each changes the named key) run first; every trial after them builds on the one that ran
    assert all("data.num_workers" in c for c in calls[1:]) and any("train.optimizer_impl" in c for c in calls)


def test_after_an_input_that_failed_a_candidate_that_changed_the_math_is_still_no_win(tmp_path, monkeypatch):
    """The input config's workers crash before it reports a global batch; without workers it trains 16 samples a
    step. The fused optimizer's run, on top of that, trains 64 a step at 4x the samples/s: another math, not a
    speed-up. The reference is the global batch of the first run that kept the input's micro-batch."""
    calls: list[dict] = []

    def result_of(config):
        if config.get("data.num_workers", 2):
            return 2, None, "error: data.num_workers = 2: a DataLoader worker exited unexpectedly; set it to 0"
        if config.get("train.optimizer_impl") == "fused":
            return 0, {"samples_per_s": 400.0, "global_batch": 64}, "done"
        return 0, {"samples_per_s": 100.0}, "done"

    monkeypatch.setattr(TrialRunner, "__call__", _runs(result_of, calls))
    rc, result, out = _tune(tmp_path, "data.num_workers=2")
    assert rc == 0, result["trials"]
    fused = next(t for t in result["trials"] if t["tried"] == {"train.optimizer_impl": "fused"})
    assert fused["status"] == "error" and "changed the math: global batch 64, the input config's 16" in fused["reason"]
    assert "train.optimizer_impl" not in result["winner"]["changes"]
    assert "optimizer_impl" not in (out / "tuned.toml").read_text()


def test_a_candidate_that_is_the_input_config_again_is_not_measured_as_a_rival(tmp_path, monkeypatch):
    """The input config loads in the training process (data.num_workers=0, prefetch "auto", not persistent), so the
    data path's last candidate, "no loader workers", is the input config itself, spelled out. Measured again as a
    candidate (here a lucky 1.3x, the same configuration), it would win with no change and a speed-up over itself;
    it is the input config's own trial instead, and the fastest real change (2 workers, 1.2x) wins."""
    calls: list[dict] = []
    rates = {8: 105.0, 4: 110.0, 2: 120.0, 0: 130.0}

    def result_of(config):
        if not config:
            return 0, {"samples_per_s": 100.0}, "done"
        if set(config) - {"data.device_resident", "data.num_workers", "data.persistent_workers",
                          "data.prefetch_factor", "data.pin_memory"}:
            return 0, {"samples_per_s": 50.0}, "done"  # every other lever is slower here
        return 0, {"samples_per_s": rates[config["data.num_workers"]]}, "done"

    monkeypatch.setattr(TrialRunner, "__call__", _runs(result_of, calls))
    rc, result, out = _tune(tmp_path)
    assert rc == 0, result["trials"]
    assert [c for c in calls if c and not c.get("data.num_workers", 1)] == []  # the input config ran once: t00
    assert result["winner"]["changes"].get("data.num_workers") == 2 and result["winner"]["speedup"] == 1.2
    assert load_config(str(out / "tuned.toml")).data.num_workers == 2
