"""`turbotrain tune`: the fastest configuration that fits, for the user's own model, measured.

Short trials, each a fresh `turbotrain train` process through bench's runner (warm-up and compile outside
the timed window: summary.json's samples_per_s), over the dimensions of `tune_space` in the order of their
expected gain on the device. The search keeps the best so far and builds each candidate on top of it; it
prunes what cannot win (a micro-batch the memory estimate says will not fit, a policy that does more of
what was already slower, more workers past the fastest count) and stops at the budget, killing a trial
that would overrun it. A trial that fails (out of memory, compile error, bad combination) is a recorded
result. The finalists are re-run and compared by their median. No candidate changes the math: same global
batch, LR, schedule and model; fp16 only where bf16 is missing or allowed; FP8 only where allowed
(`--allow-fp8`, or `--converge`, which re-checks the winner's loss).

Usage: `turbotrain tune my.toml --budget-min 10` → {out_dir}/{name}/tune/{tuned.toml,tune.json,tune.md,tune.png}.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

import torch

from turbotrain.checkpoint import CheckpointConfig
from turbotrain.config import DEFAULT_PRESET, literal, load_config
from turbotrain.errors import UserError
from turbotrain.files import make_dir
from turbotrain.log import say
from turbotrain.tune_space import (
    COMPILE_GUESS_S,
    NUMERICS_KEYS,
    Candidate,
    Ctx,
    Dimension,
    dimensions,
    probe_workload,
)

TRIAL_STEPS = 40  # 3 warm-up steps (compile) + 37 timed
NO_SAVES = ["checkpoint.every=0", 'checkpoint.resume="never"', 'monitor.trackers=["jsonl"]'] + \
    (["checkpoint.final=false"] if "final" in {f.name for f in fields(CheckpointConfig)} else [])  # no weights out
TRIAL_FIXED = ["train.eval_every=0", "data.eval_batches=0", "train.log_every=10", *NO_SAVES]
MIN_GAIN = 0.01  # a trial replaces the best so far only when faster by more than this
# a kept change whose one screening run gained less than this is weakly measured: one run on a busy machine swings
# more, so the finalists also re-run the best without such changes (kept by noise, they would ride into tuned.toml)
WEAK_GAIN = 0.10
FINAL_GAIN = 0.02  # the winner must beat the input config's median by more than this, or nothing changes

Runner = Callable[[str, dict, float, str], dict]  # (name, changes, timeout_s, what) -> outcome


class Budget:
    """Wall-clock budget of the whole tune, less the time the report takes to write; the search stops
    `finals_s + checks_s` early, for the finalists' re-runs and the convergence check. It counts from `since`
    (default now); the CLI passes the process's start, so the imports count too (a long-lived caller's own
    earlier time never does)."""

    WRITE_S = 5.0

    def __init__(self, minutes: float, since: float | None = None):
        self.total_s, self.finals_s, self.checks_s = minutes * 60, 0.0, 0.0
        self.t0 = time.perf_counter() if since is None else since

    def left(self) -> float:
        return self.total_s - self.WRITE_S - self.elapsed()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left_for_search(self, finals: bool = True) -> float:
        """Time the search may still use: the finalists' share is kept only where there will be finalists
        to compare (`finals`); otherwise it goes to more trials rather than to nothing."""
        return self.left() - self.checks_s - (self.finals_s if finals else 0.0)

    def bar(self, width: int = 20) -> str:
        used = min(1.0, max(0.0, 1 - self.left() / self.total_s))
        return "[" + "#" * round(used * width) + "·" * (width - round(used * width)) + "]"


def process_start() -> float:
    """This process's start as a perf_counter reading: the CLI's budget counts its imports too."""
    return time.perf_counter() - _process_age()


def _process_age() -> float:
    """Seconds since this process started (Linux /proc; 0 elsewhere)."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


class TrialRunner:
    """One trial = `turbotrain train CONFIG OVERRIDES CHANGES` in a fresh process (through torchrun at
    `nproc` processes), `steps` steps, under `{tune_dir}/trials/NAME`."""

    def __init__(self, config: str | None, overrides: list[str], tune_dir: Path, nproc: int = 1):
        self.config, self.overrides, self.nproc = config, overrides, nproc
        self.dir = tune_dir / "trials"
        make_dir(self.dir)

    def __call__(self, name: str, changes: dict, timeout_s: float, what: str, steps: int = TRIAL_STEPS,
                 fixed: list[str] = TRIAL_FIXED) -> dict:
        from turbotrain.bench import _run

        args = ["turbotrain", "train", *([self.config] if self.config else []), *self.overrides,
                *(literal(k, v) for k, v in changes.items()), *fixed, f"train.steps={steps}",
                literal("run.out_dir", str(self.dir)), literal("run.name", name)]
        if self.nproc > 1:
            args = ["torch.distributed.run", "--standalone", f"--nproc_per_node={self.nproc}", "-m", *args]
        t0 = time.perf_counter()
        rc = _run(args, self.dir / f"{name}.log", what, self.dir / name, steps, timeout_s=timeout_s)
        return outcome(rc, self.dir / f"{name}.log", self.dir / name / "summary.json", time.perf_counter() - t0)


def outcome(rc: int, log: Path, summary: Path, wall_s: float) -> dict:
    """A trial's status (ok / oom / error / timeout), its reason and its measured figures."""
    out: dict[str, Any] = {"wall_s": round(wall_s, 2)}
    if rc == 0 and summary.is_file():
        s = json.loads(summary.read_text())
        out.update({k: s.get(k) for k in ("samples_per_s", "samples_per_s_median_window", "tokens_per_s",
                                          "peak_mem_gib", "compile_s", "mfu", "dtype", "final_loss", "val_loss",
                                          "val_acc", "device_name", "global_batch")})
        out["window_spread"] = _window_spread(summary.parent / "metrics.jsonl")
        out["steady_spread"] = _window_spread(summary.parent / "metrics.jsonl", after_warm_up=True)
        if s.get("compile_fell_back"):  # the lever it names is one a candidate changes (eager may run)
            return {**out, "status": "error", "reason": "compile failed and fell back to eager (see the trial log)",
                    "levers": ["compile.enabled"]}
        return {**out, "status": "ok" if s.get("samples_per_s") else "error",
                "reason": None if s.get("samples_per_s") else "no timed steps"}
    if rc == 124:
        return {**out, "status": "timeout", "reason": "killed: it ran past the budget's time for it"}
    if rc < 0 or rc == 128 + 9:  # ended by a signal: it wrote no error line, its log ends mid-run
        import signal

        num = -rc if rc < 0 else 9
        name = signal.Signals(num).name if num in set(signal.Signals) else f"signal {num}"
        if num == signal.SIGKILL:  # tune sends none (its kills end in 124): mostly the kernel out of memory
            return {**out, "status": "oom", "reason": f"exit {rc}: killed by SIGKILL, most often the kernel's "
                    "out-of-memory killer: the host ran out of memory"}
        return {**out, "status": "error", "reason": f"exit {rc}: killed by {name} (a crash: see the trial's log)"}
    reason = _failure(log) or f"exit {rc}"
    # under torchrun a rank killed by SIGKILL (the kernel's OOM killer, as above) ends torchrun with exit 1
    status = "oom" if "out of memory" in reason.lower() or "sigkill" in reason.lower() else "error"
    return {**out, "status": status, "reason": f"exit {rc}: {reason}"}


WARM_STEPS = 3  # the most warm-up steps a run leaves out of its timed figure (RunMonitor's n_warm)


def _window_spread(metrics: Path, after_warm_up: bool = False) -> float | None:
    """The run's own noise: the range of its log windows' samples/s over their median (None: under two windows).
    A busy machine swings a window by tens of percent; a gain within that was not told apart from it.
    `after_warm_up`: only the windows that start after the warm-up steps, as the timed samples/s does (a first
    window holding a compile reads several times slower: the spread of a steady run, not its noise)."""
    rates, start = [], 0
    try:
        for line in metrics.read_text(errors="replace").splitlines():
            row = json.loads(line) if line.strip().startswith("{") else {}
            rate, warm = row.get("samples_per_s"), start < WARM_STEPS and after_warm_up
            start = row["step"] if type(row.get("step")) is int else start
            if type(rate) in (int, float) and 0 < rate < float("inf") and not warm:
                rates.append(float(rate))
    except (OSError, ValueError, AttributeError):
        return None
    return (max(rates) - min(rates)) / statistics.median(rates) if len(rates) >= 2 else None


def _failure(log: Path) -> str:
    """A run's own one-line error (what `turbotrain train` prints before exit 2, prefixed `[rankN]:` under
    torchrun), else the log's last lines (a traceback's exception, torchrun's summary of a crash). Shared by
    tune's trials, bench's variants and scale's world sizes."""
    import re

    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    for line in lines:
        m = re.search(r"(?:^|\]:)\s*error: (.+)", line)
        if m:
            return m.group(1)[:300]
    return " | ".join(lines[-3:])[:300]


class Search:
    """Best-so-far search over the dimensions; every trial (run or pruned) is recorded in `trials`."""

    def __init__(self, ctx: Ctx, run: Runner, budget: Budget):
        self.ctx, self.run, self.budget = ctx, run, budget
        self.trials: list[dict] = []
        self.finals: list[dict] = []  # the finalists and their runs so far (a partial report keeps them)
        self.best: dict | None = None  # the fastest trial so far
        self.trial_s = 120.0  # a trial's expected wall time, from the baseline once it ran
        self.compile_s: float | None = None

    def baseline(self) -> dict:
        """The input config as given: the reference, the probe step of the memory estimate, and the
        expected wall time of a trial."""
        base = self.trial("baseline", Candidate("input config", {}))
        if base["status"] in ("ok", "oom"):
            self.trial_s = base["wall_s"]
        return base

    def explore(self, dims: list[Dimension]) -> None:
        """Two passes: the most promising candidate of every dimension first (so a short budget still
        measures each dimension once), then the rest of each, rebuilt on top of the best so far."""
        if self.trials and self.trials[0]["status"] == "oom":  # nothing else can be measured before it fits
            dims = sorted(dims, key=lambda d: not d.makes_fit)
        blamed = _blamed(self.trials[0]) if self.trials else set()
        if blamed:  # the input config fails for a lever: what changes it comes first, the rest builds on it
            dims = sorted(dims, key=lambda d: not any(set(c.changes) & blamed for c in d.build(self.ctx)))
        for first_only in (True, False):
            for dim in dims:
                prev, limit = None, 1 if first_only and self.ctx.best_fits else None
                for cand in dim.build(self.ctx)[:limit]:
                    done = self._tried(dim.name, cand)
                    t = done if done is not None else self.trial(dim.name, cand)
                    # a failed run's figure (a compile that fell back, another math) orders nothing
                    rate = t.get("samples_per_s") if t.get("status") in ("ok", "slower") else None
                    if dim.monotone and rate and prev and rate < prev:
                        break  # ordered candidates past their best: the rest cannot win
                    prev = rate or prev

    def _tried(self, dimension: str, cand: Candidate) -> dict | None:
        """The trial that already ran or was pruned with this configuration, or with this candidate in the
        first pass (the budget only shrinks: what it left out once stays out)."""
        config = {**self.ctx.best, **cand.changes}
        if config and self.trials and self._is_input(config):  # the input config spelled out: its own trial t00
            return self.trials[0]
        key = _key(config)
        return next((t for t in self.trials if _key(t["config"]) == key
                     or (t["dimension"] == dimension and t["tried"] == cand.changes)), None)

    def _is_input(self, config: dict) -> bool:
        """Every key at the input config's effective value (as the winner's changes are told): measured again, it
        is no rival of the input config but the same configuration, whose faster run is noise."""
        input_value = Ctx(self.ctx.probe, self.ctx.eff).value
        return all(input_value(k) == v for k, v in config.items())

    def trial(self, dimension: str, cand: Candidate) -> dict:
        config = {**self.ctx.best, **cand.changes}
        t = {"id": f"t{len(self.trials):02d}", "dimension": dimension, "label": cand.label, "tried": cand.changes,
             "config": config, "est_mem_gib": cand.est_mem_gib, **({"numerics": True} if cand.numerics else {})}
        self.trials.append(t)
        skip = cand.skip or self._base_failed(cand) or self._pruned(cand) or self._over_budget(cand)
        if skip:
            t.update(status="skipped", reason=skip)
            say(f"tune: skipped {cand.label}: {skip}")
            return t
        n = sum(1 for x in self.trials if x.get("status") != "skipped")
        left = self.budget.left()
        say(f"tune {self.budget.bar()} trial {n} · {max(0.0, left) / 60:.1f} min of budget left · {dimension}: "
            f"{cand.label}")
        # a candidate that outruns its estimate is stopped where the finalists' share begins, not at the end
        limit = self._search_left() if cand.changes else left
        t.update(self.run(f"{t['id']}-{_slug(cand.label)}", config, limit, f"tune: trial {n} ({cand.label})"))
        self._learn(t, cand)
        say(f"tune: {cand.label}: " + (f"{t['samples_per_s']:,.1f} samples/s, {t['status']}"
                                       if t.get("samples_per_s") else f"{t['status']} ({t['reason']})"))
        return t

    def _base_failed(self, cand: Candidate) -> str | None:
        """A candidate changes speed levers only: where the input config itself fails (not out of memory, which
        a smaller micro-batch may cure), every candidate built on it fails the same way, each costing a trial's
        time. Except one that changes a lever the failure names (compile falling back: eager; an error line
        naming a key), and any built on a configuration that ran: those no longer carry the failure."""
        base = self.trials[0] if cand.changes and self.trials else {}
        if base.get("status") != "error" or self.best is not None or set(cand.changes) & _blamed(base):
            return None
        return f"the input config fails ({base['id']}): fix it first"

    def _pruned(self, cand: Candidate) -> str | None:
        if cand.unless_slower and self.ctx.best_fits:
            if any(x["label"] == cand.unless_slower and x["status"] == "slower" for x in self.trials):
                return f"cannot win: {cand.unless_slower} (less recompute) was already slower"
        return None

    def _over_budget(self, cand: Candidate) -> str | None:
        if not cand.changes:
            return None  # the baseline always runs (until the budget's end)
        need = self.trial_s
        if cand.compile:
            guess = self.compile_s or COMPILE_GUESS_S["cuda" if self.ctx.probe.on_gpu else "cpu"]
            need += guess * cand.compile_factor
        left = self._search_left()
        return f"budget: needs ~{need:.0f} s, {max(0.0, left):.0f} s left for the search" if need > left else None

    def _search_left(self) -> float:
        """The search's time left: the finalists' share counts once two configurations have run (the
        finalists re-run only to compare two or more)."""
        measured = {_key(t["config"]) for t in self.trials
                    if t.get("samples_per_s") and t["status"] in ("ok", "slower")}
        return self.budget.left_for_search(finals=len(measured) >= 2)

    def _learn(self, t: dict, cand: Candidate) -> None:
        """Keep the trial if it beats the best so far; learn the memory per sample from it. A candidate whose
        run trained another global batch than the input config's changed the math: it is no result."""
        ctx, rate, gb = self.ctx, t.get("samples_per_s"), self._input_global_batch()
        if t["status"] == "ok" and cand.changes and gb and t.get("global_batch") not in (None, gb):
            t.update(status="error", reason=f"it changed the math: global batch {t['global_batch']}, the input "
                     f"config's {gb} (samples a step must stay the same)")
        micro, ckpt = ctx.value("data.batch_size"), ctx.value("memory.activation_checkpointing")
        micro, ckpt = (t["config"].get("data.batch_size", micro),
                       t["config"].get("memory.activation_checkpointing", ckpt))
        if t["status"] == "oom":
            ctx.learn_memory(None, micro, ckpt, oom=True)
        if cand.compile and t.get("compile_s"):
            self.compile_s = max(self.compile_s or 0.0, t["compile_s"])
        if t["status"] != "ok":
            return
        if self.best is not None and rate <= self.best["samples_per_s"] * (1 + MIN_GAIN):
            t["status"] = "slower"
            return
        if self.best is not None:
            t["gain"] = rate / self.best["samples_per_s"]  # over the best before it: its measured effect
        self.best, ctx.best, ctx.best_fits = t, dict(t["config"]), True
        ctx.learn_memory(t.get("peak_mem_gib") if ctx.probe.on_gpu else None, micro, ckpt, oom=False)

    def _input_global_batch(self) -> int | None:
        """The samples a step of the input config: its own run's figure; where it failed before reporting one,
        that of the first run that kept its micro-batch and accumulation (a candidate then builds on the input)."""
        keep = {"data.batch_size", "train.grad_accum"}
        return next((x["global_batch"] for i, x in enumerate(self.trials) if x.get("global_batch")
                     and (i == 0 or not keep & set(x["config"]))), None)

    def lean(self) -> dict | None:
        """A trial record (not yet run) of the best so far rebuilt without its weakly measured changes, each a
        change kept on one screening run whose gain was within noise (WEAK_GAIN, or the spread of the log windows
        of its run or of the best before it); None where there is none (or only the input config would be left:
        it is a finalist already)."""
        config: dict = {}
        weak: list[dict] = []
        prev: dict = {}
        for t in (x for x in self.trials if x["status"] == "ok"):  # the chain of bests, in order
            # weak: a gain within WEAK_GAIN, or within the window spread of its run or of the best before it
            noise = max(WEAK_GAIN, t.get("window_spread") or 0.0, prev.get("window_spread") or 0.0)
            if t.get("gain") and t["gain"] < 1 + noise:
                weak.append(t)
            elif t["tried"]:
                config.update(t["tried"])
            prev = t
        if not weak or not config:
            return None
        label = "the best without " + ", ".join(f"{t['label']} ({t['gain']:.2f}x on one run)" for t in weak)
        t = {"id": f"t{len(self.trials):02d}", "dimension": "finalists", "label": label, "tried": {},
             "config": config, "est_mem_gib": None, "without": [t["id"] for t in weak]}
        self.trials.append(t)
        return t


def _blamed(base: dict) -> set[str]:
    """The config keys a failed input config's failure is put down to: the lever its outcome names, and the
    dotted keys its error line names (`error: data.num_workers = 8: ...`). Empty unless it failed (not OOM)."""
    import re

    if base.get("status") != "error":
        return set()
    return set(base.get("levers", ())) | set(re.findall(r"\b[a-z_]+\.[a-z_][a-z0-9_]*\b", base.get("reason") or ""))


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-")[:40]


def _key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def finalists(search: Search, repeats: int, budget: Budget, run: Runner, keep_s: float = 0.0) -> list[dict]:
    """The input config and the two fastest other configurations, re-run `repeats` times in rounds (so a
    drifting machine moves them alike) while the budget allows, less `keep_s` (the convergence check's);
    each ranked by its median."""
    ok = sorted((t for t in search.trials if t.get("samples_per_s") and t["status"] in ("ok", "slower")),
                key=lambda t: -t["samples_per_s"])
    picked: dict[str, dict] = {}
    # each round re-runs the input config first and the fastest next: a round the budget cuts short loses the least
    # promising re-run, never the reference every speedup and the noise rule compare with
    for t in [*[x for x in ok if not x["config"]], *[x for x in ok if x["config"]][:2]]:
        picked.setdefault(_key(t["config"]), {"id": t["id"], "label": t["label"], "config": t["config"],
                                              "rates": [t["samples_per_s"]], "rounds": [t["samples_per_s"]],
                                              "spread": t.get("steady_spread"), "trial": t})
    fins = search.finals = list(picked.values())
    lean = search.lean() if repeats and len(fins) > 1 else None
    known = lean is not None and (_key(lean["config"]) in picked or search._is_input(lean["config"]))
    if lean is not None and not known and _run_lean(lean, budget, run, keep_s, search):
        # its screening run is its round 0; it re-runs right after the fastest, whose rival it is
        at = next((i + 1 for i, f in enumerate(fins) if f["config"]), len(fins))
        fins.insert(at, {"id": lean["id"], "label": lean["label"], "config": lean["config"], "trial": lean,
                         "rates": [lean["samples_per_s"]], "rounds": [lean["samples_per_s"]],
                         "spread": lean.get("steady_spread")})
    elif lean is not None:
        search.trials.remove(lean)  # already a finalist: nothing to run
    for r in range(repeats if len(fins) > 1 else 0):
        for f in fins:
            if budget.left() - keep_s < f["trial"]["wall_s"] * 1.2:
                say("tune: budget spent; finalists compared on the runs so far")
                return _rank(fins)
            say(f"tune {budget.bar()} finalist {f['label']}, repeat {r + 1}/{repeats} · "
                f"{budget.left() / 60:.1f} min left")
            res = run(f"{f['id']}-r{r + 1}", f["config"], budget.left(),
                      f"tune: finalist {f['label']} ({r + 1}/{repeats})")
            f["rounds"].append(res.get("samples_per_s"))  # None: a failed re-run; the rounds stay aligned
            if res.get("status") in ("oom", "error"):  # the configuration itself failed (a timeout: the budget's end)
                f.setdefault("failed", []).append(f"re-run {r + 1}: {res['status']} ({res.get('reason')})")
            if res.get("samples_per_s"):
                f["rates"].append(res["samples_per_s"])
    return _rank(fins)


def _run_lean(lean: dict, budget: Budget, run: Runner, keep_s: float, search: Search) -> bool:
    """Screen the best without its weakly measured changes (a trial of its own, `finalists`); True if it ran."""
    if budget.left() - keep_s < search.trial_s * 1.2:
        lean.update(status="skipped", reason="budget: no time left to re-check the weakly measured changes")
        return False
    say(f"tune {budget.bar()} finalist {lean['label']} · {budget.left() / 60:.1f} min left")
    lean.update(run(f"{lean['id']}-lean", lean["config"], budget.left() - keep_s, f"tune: finalist {lean['label']}"))
    if lean["status"] != "ok":
        say(f"tune: {lean['label']}: {lean['status']} ({lean['reason']})")
    return lean["status"] == "ok"


def _rank(fins: list[dict]) -> list[dict]:
    for f in fins:
        f["median_samples_per_s"] = statistics.median(f["rates"])
        f.pop("trial", None)
    return sorted(fins, key=lambda f: -f["median_samples_per_s"])


def choose(fins: list[dict]) -> tuple[dict | None, dict | None, str | None]:
    """(winner, baseline finalist, what noise decided), of the finalists that ran without failing: one whose re-run
    ran out of memory or crashed fails some runs of the same configuration (memory at the edge, a flaky kernel),
    so it is no recommendation, however fast its other runs were (the input config stays the reference)."""
    failed = [f for f in fins if f.get("failed") and f["config"]]
    winner, base, note = _choose([f for f in fins if f not in failed])
    if failed:
        said = "; ".join(f"{f['label']} failed {', '.join(f['failed'])}" for f in failed)
        note = f"{said}: not a recommendation" + (f"; {note}" if note else "")
    return winner, base, note


def _choose(fins: list[dict]) -> tuple[dict | None, dict | None, str | None]:
    """(winner, baseline finalist, what noise decided): the fastest median, unless it beats the input config by
    noise only; of two finalists within noise of each other, the one with fewer changes (the extra ones
    measured nothing)."""
    base = next((f for f in fins if not f["config"]), None)
    if not fins:
        return None, base, None
    top, note = fins[0], None
    close = [f for f in fins[1:] if f is not base and not _beats(top, f)]
    if top is not base and close:  # within noise of the fastest: the fewest changes (the rest measured nothing)
        runner = min(close, key=lambda f: len(f["config"]))
        note = f"{top['label']} ({_runs(top)}) and {runner['label']} ({_runs(runner)}) are within noise of each other"
        if len(runner["config"]) < len(top["config"]):
            top, note = runner, f"{note}: the one with fewer changes is kept"
    if base is not None and top is not base and not _beats(top, base):
        return base, base, (f"{top['label']} ({_runs(top)}) is within the noise of the input config ({_runs(base)}): "
                            f"it must be faster by more than {FINAL_GAIN:.0%} by median, in every round of runs, "
                            "and in each of its runs than the input config's median")
    single = [f["label"] for f in (top, base) if f is not None and top is not base and len(f["rates"]) < 2]
    spread = max((f.get("spread") or 0.0) for f in (top, base) if f is not None)
    if single and base is not None and top["median_samples_per_s"] <= base["median_samples_per_s"] * (1 + spread):
        # no re-run to compare: the one measure of noise is the runs' own log windows, and the gain is inside it
        return base, base, (f"{top['label']} ({_runs(top)}) is faster than the input config ({_runs(base)}) by less "
                            f"than the {spread:.0%} its runs' own log windows swing, measured once (--repeats 0, or "
                            "no budget left to re-run it): not told apart from noise")
    if single:
        once = (f"{' and '.join(single)} {'was' if len(single) == 1 else 'were'} measured once (--repeats 0, or no "
                "budget left to re-run it): the comparison's noise is unknown")
        note = f"{note}; {once}" if note else once
    return top, base, note


def _beats(a: dict, b: dict) -> bool:
    """`a` faster than `b` beyond noise: its median by more than FINAL_GAIN, in every round both ran (a round runs
    the finalists back to back, so a drifting machine moves them alike), and in each of its own runs than `b`'s
    median (a run `b` has no partner for, its round cut by the budget or a failed re-run, still counts)."""
    pairs = [(x, y) for x, y in zip(a.get("rounds", a["rates"]), b.get("rounds", b["rates"])) if x and y]
    floor = b["median_samples_per_s"]
    return (a["median_samples_per_s"] > floor * (1 + FINAL_GAIN) and all(x > y for x, y in pairs)
            and all(r > floor for r in a["rates"]))


def _runs(f: dict) -> str:
    return "runs " + ", ".join(f"{r:,.1f}" for r in f["rates"]) + " samples/s"


def converge_check(winner: dict, base: dict | None, fins: list[dict], steps: int, budget: Budget,
                   run: Runner) -> tuple[dict, dict]:
    """Train the input config and the winner for the config's own steps with evaluation and apply bench's
    parity rule; if parity is missed, the fastest finalist that keeps the input's precision wins instead."""
    from turbotrain.bench import _judge, _row

    if base is None:  # the input config failed or was never re-run: no loss of its own to compare with
        return winner, {"checked": False, "why": "the input config has no finished run to compare the loss with"}
    if winner is base:
        return winner, {"checked": False, "why": "the winner is the input config"}
    rows = []
    for name, f in (("baseline", base), ("winner", winner)):
        if budget.left() <= 0:
            return winner, {"checked": False, "why": "no budget left; run turbotrain bench ... --converge"}
        res = run(f"converge-{name}", f["config"], budget.left(), f"tune: convergence check, {name}", steps, NO_SAVES)
        rows.append(_row(name, [res] if res["status"] == "ok" else [{"error": res.get("reason")}], []))
    _judge(rows, converge=True)
    failed = next((f"{r['variant']}: {r['error']}" for r in rows if r.get("error")), None)
    verdict = rows[1].get("verdict", "")
    info = {"checked": failed is None, "verdict": failed or verdict, "baseline_val_loss": rows[0].get("val_loss"),
            "winner_val_loss": rows[1].get("val_loss"), "winner_val_acc": rows[1].get("val_acc")}
    keeps_precision = not set(NUMERICS_KEYS) & set(winner["config"])
    if "parity held" in verdict or (failed and keeps_precision):  # unchecked, but its rounding is the input's
        return winner, info
    safe = next((f for f in fins if not set(NUMERICS_KEYS) & set(f["config"])), base)
    say(f"tune: convergence parity missed by {winner['label']} ({verdict}); keeping {safe['label']}")
    return safe, {**info, "replaced_by": safe["label"]}


MAX_BUDGET_MIN = 7 * 24 * 60  # one week: nan fails every comparison; 1e308 minutes would be inf seconds


def check_args(budget_min: float, repeats: int, nproc: int) -> None:
    """--budget-min, --repeats and --nproc, each named with its wrong value."""
    from turbotrain.bench import check_repeats

    if not 0 < budget_min <= MAX_BUDGET_MIN:
        raise UserError(f"--budget-min must be a number of minutes > 0 (not inf or nan) and at most {MAX_BUDGET_MIN} "
                        f"(one week), not {budget_min:g}")
    check_repeats(repeats, least=0, note=" (0: the finalists are not re-run)")
    if nproc < 1:
        raise UserError(f"--nproc must be >= 1 (processes per trial), not {nproc}")


def run_tune(config: str | None, overrides: list[str], budget_min: float = 10.0, repeats: int = 2,
             converge: bool = False, nproc: int = 1, allow_fp16: bool = False, since: float | None = None,
             allow_fp8: bool = False) -> dict:
    """Search, pick, write the four files; returns tune.json's content. `since`: when the budget started
    (a perf_counter reading; the CLI passes its process's start), default now. FP8 is searched with
    `allow_fp8` or `converge` (its loss is re-checked then). On SIGTERM/SIGINT the running trial is killed,
    the report of the trials finished so far is written (marked partial, no tuned.toml) and the process
    exits 128 + the signal's number after one `error:` line; on any other error the same report, then the
    error as it was."""
    from turbotrain.bench import Interrupted, check_derived_names, interrupts, refuse_under_torchrun
    from turbotrain.report import refuse_links

    check_args(budget_min, repeats, nproc)
    refuse_under_torchrun("tune", f"turbotrain tune {config or ''} ... --nproc {{world}}".replace("  ", " "))
    budget = Budget(budget_min, since)
    cfg = load_config(config, overrides)  # a bad CONFIG or KEY=VALUE: one error line before anything runs
    if converge and cfg.data.name == "synthetic":
        raise UserError("--converge compares the loss reached on real data; synthetic data has nothing to learn")
    check_derived_names(cfg.run.name, [f"{cfg.run.name}-tuned"], "tune (tuned.toml's run.name)")
    _say_untimed(cfg, config)
    tuning = Tuning(config, overrides, cfg, budget, repeats, nproc)
    out = tuning.tune_dir  # the report's files and temporary png (tune_report.write_outputs), the trials' folder
    refuse_links([out / f for f in ("tuned.toml", "tune.json", "tune.md", "tune.png", ".tune.png.tmp")],
                 folders=[out, out / "trials"])
    with interrupts():
        try:
            return tuning.run(converge, allow_fp16, allow_fp8)
        except Interrupted as e:
            where = tuning.stop(str(e))
            print(f"error: {e} {where}; rerun the same command to tune again", file=sys.stderr, flush=True)
            raise SystemExit(128 + e.signum) from None
        except BaseException as e:
            tuning.stop(f"stopped by an error: {' '.join(str(e).split()) or type(e).__name__}")
            raise


def _say_untimed(cfg, config: str | None) -> None:
    """Trials time the training step only (TRIAL_FIXED): evaluation and checkpoint saves the input config does
    are not in the speed-up, which overstates a run that spends much of its time there."""
    t, every, outside = cfg.train, cfg.checkpoint.every, []
    if t.eval_every and cfg.data.eval_batches:
        outside.append(f"evaluation every {t.eval_every} steps")
    if every:
        outside.append(f"a checkpoint every {every} steps")
    if outside:
        say(f"tune: trials time the training step alone; the {' and '.join(outside)} this config does are not in "
            f"the speed-up (`turbotrain profile {config or DEFAULT_PRESET}` measures their share)")


class Tuning:
    """One tune: probe, baseline, search, finalists, convergence check and report; `stop` writes the report
    of what was measured when it ends early."""

    def __init__(self, config: str | None, overrides: list[str], cfg, budget: Budget, repeats: int, nproc: int):
        self.config, self.overrides, self.cfg, self.budget = config, overrides, cfg, budget
        self.repeats, self.nproc = repeats, nproc
        self.tune_dir = Path(cfg.run.out_dir) / cfg.run.name / "tune"
        self.phase, self.probe, self.eff, self.search, self.written = "probing the workload", None, None, None, False

    def run(self, converge: bool, allow_fp16: bool, allow_fp8: bool) -> dict:
        from turbotrain.tune_report import write_outputs

        cfg, budget, repeats = self.cfg, self.budget, self.repeats
        say(f"tune: probing {self.config or DEFAULT_PRESET} (data and model on the CPU) …")
        self.probe, self.eff = probe_workload(cfg, self.nproc)
        probe = self.probe
        if probe.micro_batch_math:
            say(f"tune: micro-batch x accumulation not searched: {probe.micro_batch_math}; it would change the math")
        if allow_fp8 and not probe.fp8:
            say("tune: --allow-fp8: FP8 does not apply here (it needs an sm89+ GPU, bf16 and torchao); not searched")
        run = TrialRunner(self.config, self.overrides, self.tune_dir, self.nproc)
        ctx = Ctx(probe, self.eff, allow_fp16=allow_fp16, allow_fp8=allow_fp8 or converge, best_fits=False)
        self.search = search = Search(ctx, run, budget)
        self.phase = "the search"
        search.baseline()  # its wall time sizes the reserve for the finalists (and the convergence check)
        # finalists (the input, the two fastest, the best without its weakly measured changes) take at most a quarter
        # of the budget (they re-run only while it lasts); a convergence check
        # needs its two full runs: up to half
        budget.finals_s = min(0.25 * budget.total_s, search.trial_s * 4 * repeats)
        budget.checks_s = (min(0.5 * budget.total_s, search.trial_s * 2 * cfg.train.steps / TRIAL_STEPS)
                           if converge else 0.0)
        search.explore(dimensions(probe))
        self.phase = "the finalists' re-runs"
        fins = finalists(search, repeats, budget, run, keep_s=budget.checks_s)
        winner, base, noise = choose(fins)
        if noise:
            say(f"tune: {noise}")
        conv = None
        if converge and winner is not None:
            self.phase = "the convergence check"
            winner, conv = converge_check(winner, base, fins, cfg.train.steps, budget, run)
        self.phase = "writing the report"
        result = {**self.result(fins, winner, base, conv), "noise": noise}
        write_outputs(self.tune_dir, result)
        self.written = True
        if winner is None:
            raise UserError(_nothing_measured(search.trials, budget.total_s / 60, self.tune_dir))
        return result

    def stop(self, why: str) -> str:
        """Write the report of the trials finished so far, marked partial (the trial that was running:
        `interrupted`; no winner, no tuned.toml: nothing was compared by the finalists' medians); returns
        what the error line says about it."""
        from turbotrain.tune_report import write_outputs

        if self.search is None or self.written:
            return f"while {self.phase}, before any trial ran: nothing written" if self.search is None else \
                f"after the report was written ({self.tune_dir / 'tune.md'})"
        trials = self.search.trials
        running = [t for t in trials if "status" not in t]
        for t in running:
            t.update(status="interrupted", reason=f"killed: tune was {why}")
        done = sum(1 for t in trials if t["status"] not in ("interrupted", "skipped"))
        fins = _rank(self.search.finals) if self.search.finals else []
        result = self.result(fins, None, next((f for f in fins if not f["config"]), None), None)
        best = self.search.best
        result["partial"] = {"why": why, "during": self.phase, "running": [t["id"] for t in running],
                             "best_so_far": best and {k: best.get(k) for k in ("id", "label", "speedup")}}
        try:
            write_outputs(self.tune_dir, result)
        except Exception as e:  # a full disk, say: the line still says what happened
            return f"during {self.phase}; the partial report could not be written ({' '.join(str(e).split())})"
        stopped = f"; the running trial {', '.join(t['id'] for t in running)} was stopped" if running else ""
        finished = f"the {done} trial(s) finished so far are" if done else "no trial had finished; the record is"
        return f"during {self.phase}{stopped}; {finished} in {self.tune_dir / 'tune.md'} (partial: no tuned.toml)"

    def result(self, fins: list[dict], winner: dict | None, base: dict | None, conv: dict | None) -> dict:
        """tune.json's content. Each table compares like with like: a trial's speedup is over the input
        config's own screening trial (t00, one run each), a finalist's and the winner's over the input
        config's median of the same re-runs."""
        search, probe = self.search, self.probe
        base_rate = base["median_samples_per_s"] if base else None
        t00 = search.trials[0] if search.trials else {}
        # a failed input config's figure (a compile that fell back: eager's speed) is no speed of the input config
        screen = t00.get("samples_per_s") if t00.get("status") == "ok" else None
        for t in search.trials:
            t.pop("speedup", None)
            if t.get("samples_per_s") and screen:
                t["speedup"] = t["samples_per_s"] / screen
        for f in fins:
            f["speedup"] = f["median_samples_per_s"] / base_rate if base_rate else None
        device = next((t["device_name"] for t in search.trials if t.get("device_name")),
                      "cuda" if probe.on_gpu else "cpu")
        return {"config": self.config or DEFAULT_PRESET, "overrides": self.overrides, "run_name": self.cfg.run.name,
                "device": device, "torch": torch.__version__, "world_size": self.nproc,
                "budget_min": self.budget.total_s / 60, "elapsed_min": self.budget.elapsed() / 60,
                "repeats": self.repeats, "trial_steps": TRIAL_STEPS, "probe": dict(vars(probe)),
                "baseline": t00 or None, "baseline_samples_per_s": screen, "baseline_median_samples_per_s": base_rate,
                "speedup_of": {"trials": "over the input config's screening trial t00 (one run each)",
                               "finalists": "median over the input config's median of the finalists' runs",
                               "winner": "median over the input config's median of the finalists' runs"},
                "trials": search.trials, "finalists": fins, "winner": self._winner(winner, base_rate),
                "converge": conv, "python": sys.executable}

    def _winner(self, winner: dict | None, base_rate: float | None) -> dict | None:
        if winner is None:
            return None
        input_value = Ctx(self.probe, self.eff).value  # only the keys whose value differs from the input's
        w = {"label": winner["label"], "trial": winner["id"],
             "changes": {k: v for k, v in winner["config"].items() if input_value(k) != v},
             "samples_per_s": winner["median_samples_per_s"],
             "speedup": winner["median_samples_per_s"] / base_rate if base_rate else None}
        trial = next(t for t in self.search.trials if t["id"] == winner["id"])
        w["tokens_per_s"] = (trial["tokens_per_s"] / trial["samples_per_s"] * w["samples_per_s"]
                             if trial.get("tokens_per_s") else None)
        w["peak_mem_gib"] = trial.get("peak_mem_gib")
        return w


def _nothing_measured(trials: list[dict], budget_min: float, tune_dir: Path) -> str:
    """Why no configuration ran to the end (then there is nothing to train with): the budget or the config."""
    base = trials[0] if trials else {}
    if base.get("status") == "timeout":
        return (f"--budget-min {budget_min:g}: the input config did not finish one {TRIAL_STEPS}-step trial within "
                f"the budget ({base.get('wall_s', 0):.0f} s); give it more minutes (see {tune_dir / 'tune.md'})")
    return (f"no configuration trained to the end; the input config: {base.get('reason') or base.get('status')} "
            f"(every trial in {tune_dir / 'tune.md'}); fix the config, check it with: turbotrain train CONFIG ...")
