"""`turbotrain bench`: the same workload once per technique — speed, memory and the loss reached.

Every variant is the baseline (fp32, eager, foreach optimizer, no data workers, nothing else) plus the
one technique it names; `all` is the best combination. Same seed, same data, same steps, each in a fresh
process (no shared compile cache or allocator state), throughput over the timed region after warm-up
(compile excluded and reported apart), median over repeats.

Usage: `turbotrain bench gpt2-124m --variants baseline,bf16,compile,all --compare accelerate,fabric`.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from turbotrain.accel.convnet import convnet_targets
from turbotrain.accel.triton_adamw import triton_problem
from turbotrain.config import Config, literal, load_config
from turbotrain.errors import UserError
from turbotrain.files import make_dir
from turbotrain.log import Heartbeat, run_progress, say
from turbotrain.models.gelu_epilogue import applies_in as gelu_applies_in
from turbotrain.models.packed_attention import callers
from turbotrain.models.structure import find_blocks, supports_fused_loss
from turbotrain.rundir import RunConfig

BASELINE = ["precision.dtype=fp32", "compile.enabled=false", "memory.channels_last=false",
            'memory.activation_checkpointing="none"', 'train.optimizer_impl="foreach"', "data.num_workers=0",
            "data.pin_memory=false", "data.device_resident=false", "data.persistent_workers=false",
            "kernels.fused_loss=false", "kernels.convnet=false", "kernels.packed_attention=false",
            "kernels.gelu_epilogue=false", 'precision.weight_copies="auto"']
AUTO_DATA = ['data.num_workers="auto"', 'data.pin_memory="auto"', 'data.device_resident="auto"',
             'data.persistent_workers="auto"']
MIN_STEPS = 2  # a fresh run's first step is warm-up (monitor/run_monitor.py's n_warm), so it times from the second


def variant_overrides(name: str, cfg: Config) -> list[str]:
    """What a variant changes over the baseline."""
    b, a = cfg.data.batch_size, cfg.train.grad_accum
    table = {
        "baseline": [],
        "tf32": ["precision.dtype=tf32"],
        "bf16": ["precision.dtype=bf16"],
        "fp16": ["precision.dtype=fp16"],
        "compile": ["compile.enabled=true"],
        "accum": [f"data.batch_size={b // 2}", f"train.grad_accum={a * 2}"],
        "channels_last": ["memory.channels_last=true"],
        "act_ckpt": ['memory.activation_checkpointing="full"'],
        "fused_opt": ['train.optimizer_impl="fused"'],
        "triton_opt": ['train.optimizer_impl="triton"'],  # adamw's one-launch kernel (accel/triton_adamw.py)
        "fused_loss": ['kernels.fused_loss="auto"'],  # on where the model and config allow it
        # the packed op runs in bf16/fp16 only: read this row against the bf16 one
        "packed_attn": ["precision.dtype=bf16", 'kernels.packed_attention="auto"'],
        "gelu_epilogue": ["precision.dtype=bf16", 'kernels.gelu_epilogue="auto"'],  # bf16/fp16 only, as packed_attn
        # bf16 copies written by the Triton AdamW kernel: read this row against the bf16 and triton_opt ones
        "weight_copies": ["precision.dtype=bf16", 'train.optimizer_impl="triton"', 'precision.weight_copies="auto"'],
        "convnet": ["kernels.convnet=true", 'memory.channels_last="auto"'],  # the pool kernels need NHWC
        # the tuned DataLoader itself: device residency (which needs no loader) stays off here, on in "all"
        "workers": ['data.num_workers="auto"', 'data.pin_memory="auto"', 'data.persistent_workers="auto"'],
        "all": ['precision.dtype="auto"', "compile.enabled=true", 'train.optimizer_impl="auto"',
                'memory.channels_last="auto"', 'kernels.fused_loss="auto"', 'kernels.convnet="auto"',
                'kernels.packed_attention="auto"', 'kernels.gelu_epilogue="auto"', 'precision.weight_copies="auto"',
                *AUTO_DATA],
    }
    if name not in table:
        raise UserError(f"--variants: unknown variant {name!r}; choose from {', '.join(table)}")
    if name == "accum" and b % 2:
        raise UserError(f"--variants accum halves data.batch_size and doubles train.grad_accum (same global batch); "
                        f"data.batch_size = {b} is odd: use an even one")
    return table[name]


def _gelu_auto_gpu(cfg: Config) -> bool:
    """The run's GPU is a Hopper or newer with cuBLASLt loaded, where kernels.gelu_epilogue="auto" turns on
    (a capability this torch cannot read: listed)."""
    from turbotrain.models.gelu_epilogue import library_problem
    from turbotrain.resolve import _capability
    from turbotrain.workload import resolve_device

    cap = _capability(resolve_device(cfg.run.device))
    return cap is None or (cap[0] >= 9 and library_problem() is None)


def default_variants(cfg: Config, on_gpu: bool) -> list[str]:
    from dataclasses import replace

    from turbotrain.data.loader import build_dataset
    from turbotrain.models import args_from_data, build_model
    from turbotrain.workload import data_meta

    meta = data_meta(build_dataset(cfg.data, "train"))
    model = build_model(replace(cfg.model, args={**args_from_data(cfg.model, meta), **cfg.model.args}))
    conv = any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    blocks = find_blocks(model) is not None
    if not on_gpu:  # CPU: no tensor cores, compile costs minutes; keep it to what can tell something
        return ["baseline", "bf16"] + (["accum"] if cfg.data.batch_size % 2 == 0 else []) + ["workers"] \
            + (["act_ckpt"] if blocks else [])
    out = ["baseline", "tf32", "bf16", "fp16", "compile"] + (["accum"] if cfg.data.batch_size % 2 == 0 else [])
    out += _optimizer_variants(cfg, model)
    out += ["workers"] + (["fused_loss"] if supports_fused_loss(model) else [])
    out += ["packed_attn"] if callers(model) else []
    out += ["gelu_epilogue"] if gelu_applies_in(model) and _gelu_auto_gpu(cfg) else []  # else "auto" is off: a rerun
    out += (["channels_last"] if conv else []) + (["convnet"] if convnet_targets(model, torch.device("cuda")) else [])
    out += ["act_ckpt"] if blocks else []
    return out + ["all"]


def _optimizer_variants(cfg: Config, model: torch.nn.Module) -> list[str]:
    """fused_opt for torch's optimizers (a user's factory picks its own kernel: the row would rerun the baseline);
    triton_opt for AdamW where its kernel would step this model, which the baseline keeps float32 and contiguous
    (a parameter it cannot take hands the step to torch's fused kernel: the fused_opt row again)."""
    from turbotrain.accel.optim import OPTIMIZERS

    if cfg.train.optimizer not in OPTIMIZERS:
        return []
    plain = all(p.dtype == torch.float32 and p.is_contiguous() for p in model.parameters() if p.requires_grad)
    triton = cfg.train.optimizer == "adamw" and plain and not triton_problem(torch.device("cuda"))
    return ["fused_opt"] + (["triton_opt", "weight_copies"] if triton else [])


def _check_optimizer_variant(name: str, cfg: Config) -> None:
    """An optimizer variant every run of which the resolver would refuse, or resolve to the baseline's kernel:
    refused before anything runs, with what to run instead."""
    from turbotrain.accel.optim import OPTIMIZERS
    from turbotrain.workload import resolve_device

    if name not in ("fused_opt", "triton_opt", "weight_copies"):
        return
    if cfg.train.optimizer not in OPTIMIZERS:
        raise UserError(f"--variants {name}: train.optimizer = {cfg.train.optimizer!r} is the user's factory, which "
                        "picks its own kernel (train.optimizer_impl does not reach it): the row would rerun the "
                        "baseline; drop it from --variants")
    if name != "fused_opt":  # weight_copies runs triton_opt's kernel too: the copies are its to write
        problem = ("the kernel is AdamW's" if cfg.train.optimizer != "adamw"
                   else triton_problem(resolve_device(cfg.run.device)))
        if problem:
            raise UserError(f"--variants {name} with train.optimizer = {cfg.train.optimizer!r}: {problem}; "
                            "drop it from --variants (fused_opt measures torch's fused kernel)")


def refuse_under_torchrun(command: str, fix: str) -> None:
    """bench, scale and tune start every run themselves: under torchrun each rank would start them all. A
    malformed launcher variable (WORLD_SIZE=abc) is the training's own one-line error (distributed/env.py).
    `fix`: the command to run instead; "{world}" in it becomes the world size asked for."""
    from turbotrain.distributed.env import DistEnv

    world = DistEnv.from_environ().world_size
    if world > 1:
        raise UserError(f"{command} starts its runs itself; run it once, not under torchrun (WORLD_SIZE={world}): "
                        + fix.replace("{world}", str(world)))


def check_timed_steps(steps: int, command: str) -> None:
    """A run of fewer than MIN_STEPS steps measures no throughput: refused before anything runs."""
    if steps < MIN_STEPS:
        raise UserError(f"train.steps = {steps}: {command} times the steps after the warm-up step, and there are "
                        f"none; set train.steps >= {MIN_STEPS} (a few dozen for a steady figure)")


def check_derived_names(run_name: str, names: list[str], command: str) -> None:
    """The run names a command derives from run.name (NAME-bench-VARIANT, ...) must be legal too, or every one of
    its runs fails: checked before the first runs."""
    longest, limit = max(names, key=len), RunConfig.NAME_MAX
    if len(longest) > limit:
        extra = len(longest) - len(run_name)
        raise UserError(f"run.name is {len(run_name)} characters and {command} adds up to {extra} to it "
                        f"({longest[len(run_name):]!r}), past the {limit}-character limit of a run name: set "
                        f"run.name to at most {limit - extra} characters")


def check_unique(flag: str, names: list[str]) -> None:
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"{flag}: {', '.join(twice)} given more than once; name each once")


def _run(args: list[str], log: Path, what: str, run_dir: Path, steps: int, timeout_s: float | None = None,
         module: bool = True) -> int:
    """A variant in a fresh process (`python -m args`, or `python args` for a script); every 10 s the console
    says which one runs, its step and ETA. With `timeout_s` (tune's budget) the process and its children are
    killed past it and 124 returned."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, *(["-m"] if module else []), *args]
    return run_until(cmd, log, what, run_progress(run_dir, steps), env, timeout_s)


def run_until(cmd: list[str], log: Path, what: str, status, env: dict, timeout_s: float | None = None) -> int:
    """Run a child process (its output in `log`, `what` said every 10 s with `status()`), killed with its whole
    process tree past `timeout_s` (then 124) and on any exception here, `Interrupted` included: no child of
    bench, tune or scale outlives them."""
    import subprocess

    from turbotrain.rundir import open_run_file

    with open_run_file(log) as f, Heartbeat(what, status=status):
        proc = None
        try:
            with _SignalsWait():
                # its own process group, so the kill below never reaches this process
                proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            return proc.wait(timeout=None if timeout_s is None else max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return 124
        finally:  # also on Ctrl-C, SIGTERM (`interrupts`) or any error in the parent: no trial outlives it
            if proc is not None and proc.poll() is None:
                with _SignalsWait():
                    kill_tree(proc.pid)
                    proc.wait()


class Interrupted(BaseException):
    """SIGTERM or SIGINT while `interrupts()` is in force. A BaseException, as KeyboardInterrupt is: no
    `except Exception` on the way takes it for a failed trial."""

    def __init__(self, signum: int):
        import signal

        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


class _SignalsWait:
    """Held while a trial's process starts and while it is killed: a signal caught by `interrupts` waits until
    the block ends, then is raised. Raised where it landed it would leave a trial nobody kills (between the
    fork and `proc`), or stopped half-killed."""

    active, pending = False, 0

    def __enter__(self) -> None:
        _SignalsWait.active = True

    def __exit__(self, *exc) -> None:
        import signal

        _SignalsWait.active = False
        if _SignalsWait.pending:
            signum, _SignalsWait.pending = _SignalsWait.pending, 0
            signal.raise_signal(signum)  # `interrupts`' handler raises it now, where `finally` still kills


@contextmanager
def interrupts():
    """SIGTERM and SIGINT raise `Interrupted` in the main thread while the block runs, so `finally` blocks
    run (SIGTERM's default ends the process without them, and a trial in its own session would outlive it).
    Only the first one: later ones are ignored while the caller stops its trial and writes what it has."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
        yield
        return
    sigs = (signal.SIGTERM, signal.SIGINT)

    def handle(signum, frame) -> None:
        if _SignalsWait.active:
            _SignalsWait.pending = signum
            return
        for sig in sigs:
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    old = {sig: signal.signal(sig, handle) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def kill_tree(pid: int, wait_s: float = 10.0) -> None:
    """SIGKILL the process group of `pid` and those of all its descendants, then wait (at most `wait_s`) until
    they are gone. Killing `pid`'s group alone is not enough: torchrun starts each worker in a session of its
    own. Each group is stopped first and the tree read again until no new group shows (a stopped process
    cannot fork), so nothing started in between escapes."""
    import signal
    import time

    groups: list[int] = []
    pids: set[int] = set()
    while True:
        tree = _tree(pid)
        pids |= set(tree)
        new = [g for g in dict.fromkeys([pid, *tree.values()]) if g not in groups and g != os.getpgrp()]
        if not new:
            break
        groups += new
        for g in new:
            _signal_group(g, signal.SIGSTOP)
    for g in groups:
        _signal_group(g, signal.SIGKILL)
    pids.discard(pid)  # the caller's wait() reaps it
    deadline = time.monotonic() + wait_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal_group(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # gone already


def _tree(pid: int) -> dict[int, int]:
    """`pid` and its descendants → their process groups, read from /proc (elsewhere: `pid` alone)."""
    children: dict[int, list[int]] = {}
    group = {pid: pid}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        entries = []
    for e in entries:
        try:
            stat = Path(f"/proc/{e}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while listed
        children.setdefault(int(stat[1]), []).append(int(e))
        group[int(e)] = int(stat[2])
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        if p not in out:
            out[p] = group[p]
            todo += children.get(p, [])
    return out


def _alive(pid: int) -> bool:
    """Running or stopped; a zombie (dead, waiting for its new parent to reap it) is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


MAX_REPEATS = 100  # a median needs a few runs; 10**6 is a typo that would run for days


def check_repeats(repeats: int, least: int = 1, note: str = "") -> None:
    """--repeats of bench, scale and tune: an integer from `least` (`note` says what it means) to MAX_REPEATS."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < least:
        raise UserError(f"--repeats must be >= {least}{note}, not {repeats!r}")
    if repeats > MAX_REPEATS:
        raise UserError(f"--repeats must be at most {MAX_REPEATS} (runs per measurement), not {repeats}")


def run_bench(config: str | None, overrides: list[str], variants: list[str] | None, repeats: int = 1,
              converge: bool = False, compare: list[str] = ()) -> dict:
    """Each variant (and comparator) as its own `turbotrain train` run, then bench.{json,md,png}. On SIGTERM or
    Ctrl-C the running one is killed with its whole process tree (as tune's trials are) and the process exits
    128 + the signal's number after one `error:` line."""
    with interrupts():
        try:
            return _run_bench(config, overrides, variants, repeats, converge, compare)
        except Interrupted as e:
            print(f"error: {e} during bench; the running variant was stopped and no bench.md was written (the "
                  f"variants finished so far keep their run folders); rerun the same command", file=sys.stderr,
                  flush=True)
            raise SystemExit(128 + e.signum) from None


def _run_bench(config: str | None, overrides: list[str], variants: list[str] | None, repeats: int,
               converge: bool, compare: list[str]) -> dict:
    from turbotrain.report import refuse_links

    refuse_under_torchrun("bench", "turbotrain bench ... (each variant trains as one process)")
    check_repeats(repeats)
    cfg = load_config(config, overrides)
    on_gpu = torch.cuda.is_available() and cfg.run.device != "cpu"
    if converge and cfg.data.name == "synthetic":
        raise UserError("--converge compares the loss reached on real data; synthetic data has nothing to learn")
    check_timed_steps(cfg.train.steps, "bench")
    variants = variants or default_variants(cfg, on_gpu)
    check_unique("--variants", variants)  # a variant twice would share its run folder and be judged against itself
    check_unique("--compare", list(compare))
    for v in variants:
        variant_overrides(v, cfg)  # validate names before running anything
        _check_optimizer_variant(v, cfg)
    for tool in compare:
        _check_compare(tool)
    runs_dir, out = Path(cfg.run.out_dir), Path(cfg.run.out_dir) / f"{cfg.run.name}-bench"
    names = {(v, r): _run_name(cfg.run.name, v, r, repeats) for v in [*variants, *compare] for r in range(repeats)}
    check_derived_names(cfg.run.name, [out.name, *names.values()], "bench")
    refuse_links([out / f"bench.{ext}" for ext in ("json", "md", "png")] + [out / f"{n}.log" for n in names.values()])
    make_dir(out)
    rows = []
    for v in variants:
        runs = []
        for r in range(repeats):
            name = names[v, r]
            args = ["turbotrain", "train", *([config] if config else []), *overrides, *BASELINE,
                    *variant_overrides(v, cfg), literal("run.name", name), "checkpoint.every=0",
                    'checkpoint.resume="never"', "checkpoint.final=false"]
            what = (f"bench: {v} ({variants.index(v) + 1}/{len(variants)})"
                    + (f", repeat {r + 1}/{repeats}" if repeats > 1 else ""))
            say(what)
            rc = _run(args, out / f"{name}.log", what, runs_dir / name, cfg.train.steps)
            runs.append(measured(rc, out / f"{name}.log", runs_dir / name / "summary.json"))
        rows.append(_row(v, runs, variant_overrides(v, cfg)))
        if off := _resolved_off(v, runs_dir / names[v, 0]) or _optimizer_off(v, out / f"{names[v, 0]}.log"):
            rows[-1]["resolved_off"] = off
    for tool in compare:
        rows.append(_compare_row(tool, config, overrides, cfg, out, [names[tool, r] for r in range(repeats)]))
    _judge(rows, converge, cfg.data.name == "synthetic")
    result = {"config": config or "gpt-shakespeare", "overrides": overrides, "device": _device_name(rows),
              "torch": torch.__version__, "repeats": repeats, "converge": converge,
              "synthetic_data": cfg.data.name == "synthetic", "steps": cfg.train.steps, "rows": rows}
    write_results(out, "bench", result, format_table(result), plot=_plot)
    say(f"bench: wrote {out}/bench.json, bench.md, bench.png")
    if not any(r.get("samples_per_s") for r in rows[:len(variants)]):  # the record is written, yet nothing measured
        first = rows[0]
        raise UserError(f"bench: no variant ran to the end ({first['variant']}: {first['error']}); every row is in "
                        f"{out / 'bench.md'}, each run's output in its .log there; check the config with: "
                        f"turbotrain train {config or ''} ...".replace("  ", " "))
    return result


KERNEL_VARIANTS = {"fused_loss": "kernels.fused_loss", "packed_attn": "kernels.packed_attention",
                   "gelu_epilogue": "kernels.gelu_epilogue", "convnet": "kernels.convnet",
                   "weight_copies": "precision.weight_copies"}  # variants turning a technique "auto": the key resolved


def _resolved_off(variant: str, run_dir: Path) -> str | None:
    """For a technique's variant whose run resolved it off (a CPU, an older GPU, a model it does not apply to),
    what to say: the row then measures the baseline's other settings under the technique's name."""
    import tomllib

    key = KERNEL_VARIANTS.get(variant)
    try:
        section, name = key.split(".") if key else (None, None)
        value = tomllib.loads((run_dir / "config.toml").read_text())[section][name] if key else None
    except (OSError, ValueError, KeyError, TypeError):  # the run failed before writing it: its error says why
        return None
    return f"{key} resolved off on this run (its config.toml): measured without it" if value is False else None


# what accel/optim.py and accel/triton_adamw.py say where "triton" hands the step to torch's kernels
TRITON_FELL_BACK = ("optimizer: the Triton AdamW kernel does not run here",
                    "optimizer: the Triton AdamW kernels failed")


def _optimizer_off(variant: str, log: Path) -> str | None:
    """For triton_opt and weight_copies, where the run's optimizer did not step with the kernel (a parameter it
    cannot take, a kernel that failed to build; said in the run's log): the row measures torch's kernel under the
    Triton kernel's name."""
    if variant not in ("triton_opt", "weight_copies"):
        return None
    try:
        said = next((line[line.index(m) + len("optimizer: "):].strip() for line in
                     log.read_text(errors="replace").splitlines() for m in TRITON_FELL_BACK if m in line), None)
    except OSError:
        return None
    return f"the Triton AdamW kernel did not step this run ({said}): measured without it" if said else None


def _run_name(run_name: str, variant: str, repeat: int, repeats: int) -> str:
    return f"{run_name}-bench-{variant}" + (f"-r{repeat}" if repeats > 1 else "")


def measured(rc: int, log: Path, summary: Path) -> dict:
    """A run's summary.json, or {"error": why} where it measured nothing: its own `error:` line (tune's
    `_failure`), an unreadable summary, or a run with no timed step."""
    from turbotrain.tune import _failure

    if rc != 0:
        return {"error": f"exit {rc}: {_failure(log) or 'no output'}"}
    try:
        s = json.loads(summary.read_text())
    except (OSError, ValueError):
        return {"error": f"exit 0 but no readable {summary}"}
    if not isinstance(s, dict) or not s.get("samples_per_s"):
        return {"error": "no timed steps: the run ended within its warm-up"}
    return s


def write_results(folder: Path, stem: str, data: dict, markdown: str, plot=None) -> None:
    """{stem}.json, {stem}.md (and with `plot` {stem}.png) in `folder`, never through a symbolic link, and the
    markdown on the console."""
    from turbotrain.report import refuse_links
    from turbotrain.rundir import strict_json, write_run_file

    if plot is not None:
        png = folder / f"{stem}.png"
        refuse_links([png])  # a link planted while the runs ran: savefig would follow it
        plot(data, png)
    write_run_file(folder / f"{stem}.json", strict_json(data, indent=2))
    write_run_file(folder / f"{stem}.md", markdown + "\n")
    print(markdown)


def _device_name(rows: list[dict]) -> str:
    return next((r["device"] for r in rows if r.get("device")), "unknown")


def _row(variant: str, runs: list[dict], overrides: list[str]) -> dict:
    ok = [r for r in runs if "error" not in r and r.get("samples_per_s")]
    if not ok:
        return {"variant": variant, "error": next((r["error"] for r in runs if "error" in r), "no timed steps"),
                "overrides": overrides}
    rates = [r.get("samples_per_s_median_window") or r["samples_per_s"] for r in ok]
    last = ok[-1]
    rate = statistics.median(rates) if rates else None
    tokens = rate * (last["tokens_per_s"] / last["samples_per_s"]) if rate and last.get("tokens_per_s") else None
    return {"variant": variant, "samples_per_s": rate, "tokens_per_s": tokens,
            "spread": [min(rates), max(rates)] if rates else None,
            "step_ms": last["global_batch"] / rate * 1e3 if rate else None, "peak_mem_gib": last["peak_mem_gib"],
            "compile_s": last.get("compile_s"), "final_loss": last.get("final_loss"), "val_loss": last.get("val_loss"),
            "val_acc": last.get("val_acc"), "mfu": last.get("mfu"), "dtype": last.get("dtype"),
            "device": last.get("device_name"), "overrides": overrides}


PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers.py"  # the comparator, in a source checkout
PEER_PACKAGES = {"accelerate": "accelerate", "fabric": "lightning"}  # --compare name -> the package it runs on


def _check_compare(tool: str) -> None:
    """A --compare name this checkout can run; checked before the first variant runs."""
    import importlib.util

    if tool not in PEER_PACKAGES:
        raise UserError(f"--compare: unknown framework {tool!r}; choose {', '.join(PEER_PACKAGES)}")
    if not PEERS.is_file():
        raise UserError(f"--compare runs the comparator benchmarks/peers.py of a source checkout; {PEERS} is not "
                        "there: run turbotrain from a clone of its repository (pip install -e .)")
    package = PEER_PACKAGES[tool]
    if importlib.util.find_spec(package) is None:
        raise UserError(f"--compare {tool}: {package} is not installed; pip install {package}, or leave {tool} out "
                        "of --compare")


def _compare_row(tool: str, config: str | None, overrides: list[str], cfg: Config, out: Path,
                 names: list[str]) -> dict:
    """The same model, data and steps through another framework (bf16 + compile, see benchmarks/peers.py), as
    many runs as our rows (`names`), each in a fresh process."""
    runs = []
    for r, name in enumerate(names):
        summary = Path(cfg.run.out_dir) / name / "summary.json"
        what = f"bench: comparator {tool}" + (f" (repeat {r + 1}/{len(names)})" if len(names) > 1 else "")
        say(what)
        rc = _run([str(PEERS), tool, str(summary), *([config] if config else []), *overrides,
                   literal("run.name", name)], out / f"{name}.log", what, Path(cfg.run.out_dir) / name,
                  cfg.train.steps, module=False)
        runs.append(measured(rc, out / f"{name}.log", summary))
    # benchmarks/peers.py trains without evaluating: its null val loss is no divergence (bench._convergence_notes)
    return {**_row(f"{tool} (bf16 + compile)", runs, []), "evaluates": False}


def _judge(rows: list[dict], converge: bool, synthetic: bool = False) -> None:
    """Speedup, memory saving and a verdict per row. With --converge, parity is the issue's criterion for
    the workload: a language model's val loss within 1 % of the baseline's, a classifier's accuracy within
    0.3 pt (its val loss, noisier at the same accuracy, stays in the table but does not decide). On
    synthetic data (random labels) the loss says nothing about convergence: no verdict on it."""
    base = next((r for r in rows if r["variant"] == "baseline" and r.get("samples_per_s")), None)
    lm = base is not None and base.get("tokens_per_s") is not None
    for r in rows:
        if not r.get("samples_per_s") or base is None:
            if base is None and "error" not in r:
                r["verdict"] = ("no speedup: the baseline row failed" if any(x["variant"] == "baseline" for x in rows)
                                else "no speedup: add baseline to --variants to compare with")
            continue
        r["speedup"] = r["samples_per_s"] / base["samples_per_s"]
        r["mem_saving"] = 1 - r["peak_mem_gib"] / base["peak_mem_gib"] if base["peak_mem_gib"] else None
        notes = [r["resolved_off"]] if r.get("resolved_off") else []
        if r is not base and r["speedup"] < 0.97:
            notes.append(f"slower than baseline ({r['speedup']:.2f}x)")
        elif r is not base and r["speedup"] < 1.0:  # within run-to-run noise, yet no gain: never a plain "ok"
            notes.append(f"no speedup ({r['speedup']:.3f}x, within 3 % of the baseline)")
        notes += _convergence_notes(r, base, lm, converge, synthetic)
        r["verdict"] = "; ".join(notes) or "ok"


def _convergence_notes(r: dict, base: dict, lm: bool, converge: bool, synthetic: bool) -> list[str]:
    """What row `r`'s val loss and accuracy say against the baseline's. A val loss of null (NaN/inf in
    evaluation, step.evaluate) where the baseline's is a number is a diverged model, never parity; with
    --converge, parity is stated only where the deciding figure was compared on both sides."""
    notes, decided = [], False
    by_acc = converge and not lm and r.get("val_acc") is not None  # a classifier's accuracy decides
    if _number(base.get("val_loss")) and r is not base and r.get("val_loss") is None and r.get("evaluates", True):
        notes.append("hurts convergence (val loss null: NaN/inf in its evaluation, the model diverged)")
    elif _number(base.get("val_loss")) and _number(r.get("val_loss")) and not synthetic:
        r["val_loss_delta"] = r["val_loss"] / base["val_loss"] - 1 if base["val_loss"] else 0.0
        decided = not by_acc
        if r["val_loss_delta"] > (0.01 if converge else 0.05) and not by_acc:
            notes.append(f"hurts convergence (val loss {r['val_loss_delta']:+.1%})")
    if _number(base.get("val_acc")) and _number(r.get("val_acc")):
        r["val_acc_delta_pt"] = 100 * (r["val_acc"] - base["val_acc"])
        decided = decided or by_acc
        if by_acc and r["val_acc_delta_pt"] < -0.3:
            notes.append(f"hurts accuracy ({r['val_acc_delta_pt']:+.2f} pt)")
    if converge and r is not base:
        if any("hurts" in n for n in notes):
            notes.append("parity missed")
        else:
            notes.append("parity held" if decided else "parity not known (no val loss or accuracy of both this "
                         "variant and the baseline to compare: the baseline's evaluation gave null or none ran)")
    return notes


def _number(v) -> bool:
    """A finite figure of a summary (not None, not a bool)."""
    import math

    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _num(v: float | None, fmt: str) -> str:
    """`v` as `fmt` writes it, "—" for none; a figure that rounds to zero is written 0, never -0 (a peak 0.1 %
    above the baseline's is no negative saving)."""
    if v is None:
        return "—"
    text = format(v, fmt)
    return text[1:] if text.startswith("-") and not any(c in "123456789" for c in text) else text


def format_table(result: dict) -> str:
    from turbotrain.report import md_cell

    unit = "tok/s" if any(r.get("tokens_per_s") for r in result["rows"]) else "samples/s"
    head = (f"Device: {result['device']}, torch {result['torch']}, {result['steps']} steps"
            + (", synthetic data" if result["synthetic_data"] else "") + f", median of {result['repeats']} run(s)")
    lines = [head, "", f"| variant | {unit} | speedup | step ms | peak GiB | memory saved | compile s | loss "
             f"| val loss | val acc | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | {md_cell(r['error'], 200)} | | | | | | | | | |")
            continue
        rate = r["tokens_per_s"] or r["samples_per_s"]
        f = _num
        speedup = "—" if r.get("speedup") is None else f"{f(r['speedup'], '.2f')}x"
        lines.append(f"| {r['variant']} | {rate:,.0f} | {speedup} | {f(r['step_ms'], '.1f')} | "
                     f"{f(r['peak_mem_gib'], '.2f')} | {f(r.get('mem_saving'), '.0%')} | {f(r['compile_s'], '.1f')} | "
                     f"{f(r['final_loss'], '.4f')} | {f(r['val_loss'], '.4f')} | {f(r['val_acc'], '.2%')} | "
                     f"{md_cell(r.get('verdict', ''))} |")
    return "\n".join(lines)


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r.get("speedup") is not None]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["variant"] for r in rows]
    ax1.barh(names, [r["speedup"] for r in rows], color="tab:blue")
    ax1.axvline(1.0, color="gray", lw=1)
    ax1.set_xlabel("speedup vs baseline (x)")
    ax2.barh(names, [r["peak_mem_gib"] for r in rows], color="tab:orange")
    ax2.set_xlabel("peak memory (GiB)")
    for ax in (ax1, ax2):
        ax.invert_yaxis()
    fig.suptitle(f"turbotrain bench — {result['config']} on {result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
