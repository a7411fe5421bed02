"""Planted workloads whose truth is known, run end to end through the real commands on a CPU: `profile` must
name the planted bottleneck with advice that loads as config, the monitor must alert on the planted loss
curve or data stall (and stay quiet on healthy runs), `tune` must find the planted data-loader fix and report
only numbers it measured. Planted effects are sleeps (wall time whatever the machine's load) or fixed data."""
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.common import BASE_TOML, error_line, lit, loss_rows
from tests.helpers import USERPKG, userpkg_env
from turbotrain import profile as prof
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.monitor.rules import RULES, LossRules, MonitorConfig, RowRules

PL = "userpkg.planted_s22"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "monitoring.md"
ALERT_KEYS = {"time", "step", "rank", "rule", "value", "threshold", "message"}


def cli(*argv) -> int:
    try:
        return main(list(argv)) or 0
    except SystemExit as e:
        return e.code


# ---------------------------------------------------------------- profile

ITEMS = [f'data.name="{PL}:items"', "data.num_workers=0", 'train.loss="cross_entropy"', "model.args={}"]


def profile(tmp_path, model: str, *overrides) -> tuple[dict, str, list[str]]:
    base = [str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f'model.name="{PL}:{model}"', *ITEMS, *overrides]
    assert cli("profile", "--active", "3", *base) == 0
    out = tmp_path / "fault" / "profile"
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text(), base


def check_report(report: dict, md: str, base: list[str]) -> None:
    """The numbers add up, the markdown says what the JSON says, and every advised key loads as config."""
    shares, ms = report["breakdown_share"], report["breakdown_ms"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
    assert all(v >= 0 and math.isfinite(v) for v in [*shares.values(), *ms.values()])
    # the parts are per-step means of the profiled steps: they sum to the mean step wall time
    times = report["step_ms_profiled"]
    assert sum(ms.values()) == pytest.approx(sum(times) / len(times), rel=1e-6)
    assert f"mean step {sum(ms.values()):.2f} ms" in md
    assert f"**Verdict: {report['verdict']}**" in md
    for k, v in shares.items():
        assert f"| {k.replace('_', ' ')} | {ms[k]:.2f} | {v:.1%} |" in md
    for rec in report["recommendations"]:
        if rec["set"]:  # pasted as it is, each key=value must be accepted on this machine
            load_config(base[0], [*base[1:], *rec["set"].split()])


def test_items_that_sleep_are_data_bound_and_workers_come_first(tmp_path):
    # 8 items x 10 ms = 80 ms of sleep a step against a 2-layer MLP's few hundred µs
    report, md, base = profile(tmp_path, "small", "data.args={delay=0.01}")
    check_report(report, md, base)
    assert report["verdict"] == "data-bound" and report["bottleneck"] == "data"
    assert report["recommendations"][0]["set"].startswith("data.num_workers=")
    assert "data wait" in md.split("**Verdict:")[1].splitlines()[0]


def test_a_hundred_tiny_parameters_and_a_slow_optimizer_are_optimizer_bound(tmp_path):
    # the user's own optimizer, 50 ms of host time a step on top of AdamW over 100 tiny parameters
    report, md, base = profile(tmp_path, "many_tiny", "data.args={}", "model.args={n=100}",
                               f'train.optimizer="{PL}:slow_adamw"')
    check_report(report, md, base)
    assert report["verdict"] == "optimizer-bound", report["breakdown_share"]
    assert report["optimizer"]["name"] == "SlowAdamW" and report["optimizer"]["params"] == 100 * 4 + 32 * 4 + 4
    # no config key reaches a user optimizer's kernel: the advice must not pretend one does
    assert not any("optimizer_impl" in r["set"] for r in report["recommendations"])
    assert any(r.get("do") == "train fewer parameters" for r in report["recommendations"])


def test_a_compute_heavy_model_is_compute_bound_with_no_invented_fix(tmp_path):
    # 512 samples through 1M weights: ~3 GFLOP of forward and backward against one AdamW pass over 1M
    # (on in-memory vectors: a dataset building 512 items in Python a step is a data cost of its own)
    report, md, base = profile(tmp_path, "heavy", 'data.name="synthetic"', "data.batch_size=512",
                               'data.args={kind="vectors", in_features=32, num_classes=4, size=1024}')
    check_report(report, md, base)
    assert report["verdict"] == "compute-bound", report["breakdown_share"]
    # no compute lever exists on a CPU in fp32 eager: the only advice may be the optimizer's, where its share
    # passes the secondary threshold (AdamW over 1M weights can, on a loaded machine)
    opt = report["breakdown_share"]["optimizer"]
    recs = report["recommendations"]
    assert all(r["evidence_share"] == pytest.approx(opt, abs=1e-4) for r in recs), recs
    assert (recs == []) == (opt < prof.OPTIMIZER_SECONDARY) and ("spent in compute" in md) == (recs == [])


def test_a_forward_that_sleeps_outside_torch_ops_is_host_overhead_not_compute(tmp_path):
    """A 100 ms sleep around a 32x4 linear layer: the step is host time, not compute; calling it compute-bound
    with "no obvious lever left" hides the one fix there is."""
    report, md, base = profile(tmp_path, "host_work", "data.args={}", "model.args={delay=0.1}")
    check_report(report, md, base)
    assert report["verdict"] == "host-overhead-bound", report["breakdown_share"]
    assert any("move host work out of the step" == r.get("do") for r in report["recommendations"])
    assert "spent in compute" not in md


def test_callbacks_that_profile_does_not_run_are_said(tmp_path, capsys):
    report, md, base = profile(tmp_path, "small", "data.args={}", f'train.callbacks=["{PL}:SleepyCallback"]')
    check_report(report, md, base)
    assert any("train.callbacks" in n and "not in this breakdown" in n for n in report["notes"])
    assert "**Warning:** train.callbacks" in md
    assert "warning: train.callbacks" in capsys.readouterr().out


# ---------------------------------------------------------------- monitor alerts on real runs


def train(tmp_path, *overrides, config=str(BASE_TOML)) -> tuple[int, Path]:
    rc = cli("train", config, f"run.out_dir={lit(tmp_path)}", 'monitor.trackers=["jsonl"]', *overrides)
    name = load_config(config, [f"run.out_dir={lit(tmp_path)}", *overrides]).run.name
    return rc, tmp_path / name


# the timing rules: another process on the machine can slow 10+ steps, or the host's share of a step, for real
LOAD = {"throughput_drop", "data_wait"}


def alerts(run_dir: Path, timing: set = LOAD) -> list[dict]:
    """alerts.jsonl, each line checked: one JSON object with the documented fields, of a documented rule; the
    timing rule's lines left out of what is returned (their verdict is the machine's load, not the plant's)."""
    path = run_dir / "alerts.jsonl"
    lines = [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
    documented = set(re.findall(r"^\| `(\w+)` \|", DOCS.read_text(), re.M))
    for a in lines:
        assert set(a) == ALERT_KEYS, a
        assert a["rule"] in RULES and a["rule"] in documented, a
        assert isinstance(a["step"], int) and a["rank"] == 0 and a["message"] and "\n" not in a["message"]
        assert all(isinstance(a[k], (int, float)) and math.isfinite(a[k]) for k in ("value", "threshold", "time"))
    return [a for a in lines if a["rule"] not in timing]


def alert_counts(run_dir: Path) -> dict:
    counts = json.loads((run_dir / "summary.json").read_text())["alerts"]
    return {k: v for k, v in counts.items() if k not in LOAD}


REG = [f'model.name="{PL}:linear"', f'data.name="{PL}:regression"']


def test_bad_labels_in_one_batch_are_one_loss_spike_at_that_step(tmp_path):
    rc, run = train(tmp_path, *REG, "data.args={spike_from=96}", "train.steps=24")
    assert rc == 0
    got, losses = alerts(run), dict(loss_rows(run))
    median = sorted(losses.values())[len(losses) // 2]
    spiked = [s for s, v in losses.items() if v > 1e3 * median]  # the planted bad labels (1 or 2 batches)
    assert spiked and spiked == list(range(spiked[0], spiked[0] + len(spiked))) and spiked[0] > 3
    assert [(a["rule"], a["step"]) for a in got] == [("loss_spike", spiked[0])], got  # repeats held back
    assert alert_counts(run) == {"loss_spike": len(spiked)}


def test_an_lr_far_too_high_is_loss_diverging(tmp_path):
    rc, run = train(tmp_path, *REG, "data.args={}", "train.steps=12", "train.lr=0.6", 'train.optimizer="sgd"',
                    "train.grad_clip=0.0")
    assert rc == 0
    got = {a["rule"]: a for a in alerts(run)}
    assert "loss_diverging" in got and got["loss_diverging"]["step"] == 10  # the first full 10-step window
    assert set(got) <= {"loss_diverging", "loss_spike"}


def test_a_flat_noisy_loss_is_a_plateau_and_not_diverging(tmp_path):
    """Targets that are noise and an LR too small to move: the loss stays flat. Before the losses had to rank
    in step order, seven rises out of nine steps in one window of that noise read as divergence."""
    rc, run = train(tmp_path, f'model.name="{PL}:linear"', f'data.name="{PL}:noise"', "data.args={}",
                    "train.steps=30", "train.lr=1e-9", "monitor.loss_plateau_window=10",
                    "monitor.loss_plateau_delta=0.1")  # a 1 % stall is not told from this noise in 30 log steps
    assert rc == 0
    assert [a["rule"] for a in alerts(run)] == ["loss_plateau"]


def test_noise_around_a_flat_or_falling_loss_never_reads_as_divergence():
    """The rule on 3000 log steps of iid noise (flat, and falling slowly): ~1% of noise windows rise at 7 of 9
    steps, which alone fired every few hundred log steps."""
    rng = random.Random(0)
    for trend in (0.0, -1e-4):
        rules = LossRules(MonitorConfig(loss_spike_factor=0, loss_plateau_window=0))
        fired = [i for i in range(3000) if rules.check((2 + trend * i) * rng.lognormvariate(0, 0.3))]
        assert fired == [], fired
    # and a real divergence, noisy, still fires
    rules = LossRules(MonitorConfig(loss_spike_factor=0, loss_plateau_window=0))
    assert any(rules.check(3 * 1.3 ** i * rng.lognormvariate(0, 0.3)) for i in range(30))


def test_a_hiccup_of_a_few_steps_is_no_throughput_drop_but_a_lasting_one_is():
    """log_every = 1 on short steps: another process's burst slows a few one-step windows 2x; that is no drop.
    The same drop over 10 steps is one (as 2 windows of train.log_every >= 5 always were)."""
    def run(every: int, n_slow: int) -> list[int]:
        rules, out = RowRules(MonitorConfig()), []
        rates = [1000.0] * 10 + [400.0] * n_slow + [1000.0] * 5
        for i, rate in enumerate(rates, 1):
            out += [i * every for f in rules.check({"step": i * every, "samples_per_s": rate})
                    if f.rule == "throughput_drop"]
        return out
    assert run(1, 2) == [] and run(1, 9) == []
    assert run(1, 10) == [20] and run(5, 2) == [60]


def test_a_slow_dataset_is_a_data_wait_alert(tmp_path):
    rc, run = train(tmp_path, f'model.name="{PL}:small"', "model.args={}", *ITEMS, "data.args={delay=0.025}",
                    "train.steps=6")  # 200 ms of sleep a step: the wait dominates even on a machine at full load
    assert rc == 0
    got = alerts(run, timing={"throughput_drop"})  # the plant is a wait far above any load's
    # step 1 is warm-up (not judged); steps 2, 3, 4 are the 3 log steps in a row
    assert [a["rule"] for a in got] == ["data_wait"] and got[0]["step"] == 4
    assert "data.num_workers" in got[0]["message"]


def test_nan_targets_stop_the_run_with_its_checkpoints_kept(tmp_path, capsys):
    rc, run = train(tmp_path, *REG, "data.args={nan_from=56}", "train.steps=12", "checkpoint.every=2")
    assert rc == 2
    line = error_line(capsys.readouterr().err)
    assert "non-finite for 3 step(s)" in line and "targets" in line and "clean the data" in line
    bad = [s for s, v in loss_rows(run) if v is None]  # a non-finite loss is written as null
    assert len(bad) == 3 and bad == list(range(bad[0], bad[0] + 3))
    ckpts = sorted(int(p.name[5:]) for p in (run / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert ckpts and ckpts[-1] < bad[0] and all(s % 2 == 0 for s in ckpts)  # none of a non-finite model
    assert not (run / "final").exists() and not (run / "summary.json").exists()
    got = alerts(run)
    assert {a["rule"] for a in got} == {"loss_nonfinite"} and got[0]["step"] == bad[0]


TINY_SHAKESPEARE = ["model.args.n_layer=1", "model.args.n_embd=32", "model.args.n_head=2", "data.args.block_size=32",
                    "data.batch_size=8", "data.eval_batches=2", "train.eval_every=10", "checkpoint.every=10",
                    "train.warmup_steps=4", "compile.enabled=false", "precision.dtype=fp32"]


@pytest.mark.parametrize("log_every", [1, 5])
def test_the_default_preset_with_eval_checkpoints_and_a_resume_raises_no_alert(tmp_path, log_every):
    over = [*TINY_SHAKESPEARE, f"train.log_every={log_every}"]
    rc, run = train(tmp_path, *over, "train.steps=20", config="gpt-shakespeare")
    assert rc == 0
    rc, run = train(tmp_path, *over, "train.steps=40", config="gpt-shakespeare")  # resumes from step 20
    assert rc == 0 and loss_rows(run)[-1][0] == 40
    assert alerts(run) == [] and alert_counts(run) == {}


# ---------------------------------------------------------------- tune


def test_tune_finds_the_loader_fix_and_reports_only_what_it_measured(tmp_path):
    """Items that sleep 20 ms, 4 a batch, no workers: loader workers overlap the sleeps whatever the load (a
    minute of budget: at half of it a loaded machine may fit only the input config)."""
    over = [f"run.out_dir={lit(tmp_path)}", "data.args.delay=0.02", "data.batch_size=4", "train.grad_accum=1"]
    r = subprocess.run([sys.executable, "-m", "turbotrain", "tune", str(USERPKG / "tune.toml"), *over,
                        "--budget-min", "1", "--repeats", "1"], capture_output=True, text=True, timeout=180,
                       env=userpkg_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    tune = tmp_path / "tune-slow" / "tune"
    result, md, toml = (json.loads((tune / "tune.json").read_text()), (tune / "tune.md").read_text(),
                        (tune / "tuned.toml").read_text())
    w = result["winner"]
    assert w["changes"].get("data.num_workers", 0) > 0, md
    # every trial that ran is backed by its own run's summary.json, and the table shows those figures
    for t in result["trials"]:
        if t["status"] in ("ok", "slower"):
            runs = [p for p in (tune / "trials").glob(f"{t['id']}-*/summary.json") if "-r" not in p.parent.name]
            assert len(runs) == 1, runs  # the screening run, not the finalists' re-runs (-r1, -r2...)
            s = json.loads(runs[0].read_text())
            assert t["samples_per_s"] == s["samples_per_s"]
            assert f"| {t['id']} | {t['dimension']} |" in md and f"{s['samples_per_s']:.1f}" in md
        else:
            # skipped, or on a loaded machine ended at its share of the budget: either way no figure of its own
            assert t["status"] in ("skipped", "timeout") and t.get("reason") and t.get("samples_per_s") is None
    # the winner's speedup is the ratio of the finalists' medians of their measured runs
    finals = {f["id"]: f for f in result["finalists"]}
    for f in finals.values():
        screened = next(t["samples_per_s"] for t in result["trials"] if t["id"] == f["id"])
        reruns = [json.loads((tune / "trials" / f"{f['id']}-r{i}" / "summary.json").read_text())["samples_per_s"]
                  for i in range(1, len(f["rates"]))]
        assert sorted(f["rates"]) == sorted([screened, *reruns])
        rates = sorted(f["rates"])
        assert f["median_samples_per_s"] == pytest.approx((rates[(len(rates) - 1) // 2] + rates[len(rates) // 2]) / 2)
    base = finals[result["baseline"]["id"]]["median_samples_per_s"]
    assert w["speedup"] == pytest.approx(finals[w["trial"]]["median_samples_per_s"] / base)
    assert f"{w['speedup']:.2f}x the input config" in md and f"{w['speedup']:.2f}x" in toml
    # tuned.toml loads, keeps the math, and trains
    cfg = load_config(str(tune / "tuned.toml"), [])
    assert cfg.data.batch_size * cfg.train.grad_accum == 4 and cfg.data.num_workers == w["changes"]["data.num_workers"]
    rc, run = train(tmp_path, "train.steps=2", "train.log_every=1", "data.args.delay=0.0",
                    config=str(tune / "tuned.toml"))
    assert rc == 0 and len(loss_rows(run)) == 2
