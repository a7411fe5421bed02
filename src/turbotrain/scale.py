"""`turbotrain scale`: the same workload through torchrun at each world size (weak scaling: the
per-device batch stays fixed), per-device throughput and efficiency against 1 device.

Usage: `turbotrain scale gpt2-124m --gpus 1,2 --strategies ddp,fsdp`. On a CPU the ranks are processes
over gloo: the table then checks the wiring, it is not a performance figure.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from turbotrain.bench import (
    Interrupted,
    check_derived_names,
    check_repeats,
    check_timed_steps,
    check_unique,
    interrupts,
    measured,
    refuse_under_torchrun,
    run_until,
    write_results,
)
from turbotrain.config import literal, load_config
from turbotrain.errors import UserError
from turbotrain.files import make_dir
from turbotrain.log import run_progress, say

TARGETS = {2: 0.85, 4: 0.80, 8: 0.75}  # the seed's efficiency targets by world size


def _torchrun(n: int, config: str | None, overrides: list[str], log: Path, what: str, run_dir: Path,
              steps: int) -> int:
    """One world size through torchrun; every 10 s the console says what runs, its step and ETA."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           "-m", "turbotrain", "train", *([config] if config else []), *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return run_until(cmd, log, what, run_progress(run_dir, steps), env)


STRATEGIES = ("ddp", "fsdp")


def check_args(gpus: list[int], strategies: list[str], repeats: int) -> None:
    """--gpus, --strategies and --repeats, each named with its wrong value."""
    if not gpus:
        raise UserError("--gpus names no world size; give a comma list of process counts, e.g. --gpus 1,2,4")
    bad = [n for n in gpus if n < 1]
    if bad:
        raise UserError(f"--gpus {bad[0]}: a world size is a positive integer; e.g. --gpus 1,2,4")
    if not strategies:  # `--strategies ""` (an unset shell variable) would write an empty table over the last one
        raise UserError(f"--strategies names no strategy; give {', '.join(STRATEGIES)} or both, e.g. "
                        f"--strategies ddp,fsdp")
    unknown = [x for x in strategies if x not in STRATEGIES]
    if unknown:
        raise UserError(f"--strategies {unknown[0]}: unknown strategy; choose {', '.join(STRATEGIES)}")
    check_unique("--gpus", [str(n) for n in gpus])
    check_unique("--strategies", strategies)
    check_repeats(repeats)


def run_scale(config: str | None, overrides: list[str], gpus: list[int], strategies: list[str],
              repeats: int = 1) -> dict:
    """Each (strategy, world size) `repeats` times; a row holds the median run and the spread. Repeats go in
    rounds over the world sizes (1, 2, 1, 2, ...), so a machine that drifts during the call moves every world
    size alike instead of one efficiency (a call's first job can run slow: benchmarks/NOTES.md). On SIGTERM
    or Ctrl-C the running torchrun is killed with its workers, then one `error:` line, exit 128 + signal."""
    with interrupts():
        try:
            return _run_scale(config, overrides, gpus, strategies, repeats)
        except Interrupted as e:
            print(f"error: {e} during scale; the running torchrun and its workers were stopped and no scale.md was "
                  f"written; rerun the same command", file=sys.stderr, flush=True)
            raise SystemExit(128 + e.signum) from None


def _run_scale(config: str | None, overrides: list[str], gpus: list[int], strategies: list[str],
               repeats: int) -> dict:
    from turbotrain.report import refuse_links

    check_args(gpus, strategies, repeats)
    refuse_under_torchrun("scale", "turbotrain scale ... --gpus 1,2,... (it starts torchrun itself)")
    cfg = load_config(config, overrides)  # validate once, before launching anything
    check_timed_steps(cfg.train.steps, "scale")
    on_gpu = torch.cuda.is_available() and cfg.run.device != "cpu"
    if on_gpu and max(gpus) > torch.cuda.device_count():
        raise UserError(f"--gpus asks for {max(gpus)} GPUs, {torch.cuda.device_count()} visible")
    runs_dir, out = Path(cfg.run.out_dir), Path(cfg.run.out_dir) / f"{cfg.run.name}-scale"
    names = {(st, n, r): f"{cfg.run.name}-scale-{st}-{n}" + (f"-r{r}" if repeats > 1 else "")
             for st in strategies for n in gpus for r in range(repeats)}
    check_derived_names(cfg.run.name, [out.name, *names.values()], "scale")
    refuse_links([out / "scale.json", out / "scale.md"] + [out / f"{n}.log" for n in names.values()])
    make_dir(out)
    rows = []
    for strategy in strategies:
        runs: dict[int, list[dict]] = {n: [] for n in sorted(gpus)}
        errors: dict[int, str] = {}
        for r in range(repeats):
            for n in runs:
                if n in errors:
                    continue
                unit = ("GPU" if on_gpu else "CPU process") + ("es" if n > 1 and not on_gpu else "s" if n > 1 else "")
                name = names[strategy, n, r]
                # never resumed: a run of that name with checkpoints (the user's, an earlier tool's) would train
                # from its step on, or not at all, and the row would time a different run
                extra = [f"parallel.strategy={strategy}", literal("run.name", name), "checkpoint.every=0",
                         'checkpoint.resume="never"', "checkpoint.final=false"]
                if not on_gpu:
                    extra.append("run.device=\"cpu\"")
                what = f"scale: {strategy} on {n} {unit}" + (f" (repeat {r + 1}/{repeats})" if repeats > 1 else "")
                say(what)
                rc = _torchrun(n, config, [*overrides, *extra], out / f"{name}.log", what, runs_dir / name,
                               cfg.train.steps)
                res = measured(rc, out / f"{name}.log", runs_dir / name / "summary.json")
                if "error" in res:
                    errors[n] = res["error"]
                    say(f"scale: {strategy} on {n} {unit} failed ({errors[n]}); log: {out / f'{name}.log'}")
                    continue
                runs[n].append(res)
        rows += _strategy_rows(strategy, runs, errors, on_gpu)
    nccl_env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_NCCL_"))}
    result = {"config": config or "gpt-shakespeare", "overrides": overrides, "weak_scaling": True,
              "performance_figure": on_gpu,
              "note": None if on_gpu else "CPU processes over gloo: a wiring check, not a performance figure",
              "torch": torch.__version__, "repeats": repeats, "nccl_env": nccl_env, "rows": rows}
    write_results(out, "scale", result, format_table(result))
    say(f"scale: wrote {out / 'scale.json'}")
    if all("error" in r for r in rows):  # the record is written, yet nothing was measured
        first = rows[0]
        raise UserError(f"scale: no world size ran to the end ({first['strategy']} on {first['world_size']}: "
                        f"{first['error']}); every row is in {out / 'scale.md'}, each run's output in its .log there")
    return result


def _strategy_rows(strategy: str, runs: dict[int, list[dict]], errors: dict[int, str], on_gpu: bool) -> list[dict]:
    """A strategy's rows, one per world size, with the efficiency against its world size 1."""
    rows, base = [], None
    for n, done in runs.items():
        if n in errors:
            rows.append({"world_size": n, "strategy": strategy, "error": errors[n]})
            continue
        row = _row(strategy, n, done)
        base = row["samples_per_s_per_device"] if n == 1 else base
        # CPU processes share the host's cores: their ratio is no efficiency, and the GPU targets do not apply
        row["efficiency"] = row["samples_per_s_per_device"] / base if base and on_gpu else None
        row["target"] = row["target"] if on_gpu else None
        row["below_target"] = bool(row["target"] and row["efficiency"] is not None
                                   and row["efficiency"] < row["target"])
        rows.append(row)
    return rows


def _row(strategy: str, n: int, runs: list[dict]) -> dict:
    """One table row from a world size's runs: the median run (the lower middle one for an even count), so
    every figure of the row comes from one run."""
    runs = sorted(runs, key=lambda x: x["samples_per_s"])
    s = runs[(len(runs) - 1) // 2]
    per_dev = s["samples_per_s"] / n
    return {"world_size": n, "strategy": strategy, "samples_per_s": s["samples_per_s"],
            "samples_per_s_per_device": per_dev, "tokens_per_s": s.get("tokens_per_s"),
            "tokens_per_s_per_device": s["tokens_per_s"] / n if s.get("tokens_per_s") else None,
            "runs": len(runs), "spread_per_device": [runs[0]["samples_per_s"] / n, runs[-1]["samples_per_s"] / n],
            "target": TARGETS.get(n), "peak_mem_gib_per_device": s.get("peak_mem_gib"), "mfu": s.get("mfu"),
            "final_loss": s.get("final_loss"), "device": s.get("device_name"), "dtype": s.get("dtype")}


def format_table(result: dict) -> str:
    from turbotrain.report import md_cell

    unit = "tok/s" if any(r.get("tokens_per_s") for r in result["rows"]) else "samples/s"
    lines = [f"| strategy | devices | {unit} total | {unit} per device | efficiency | target | peak GiB/device |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['strategy']} | {r['world_size']} | failed: {md_cell(r['error'], 200)} | | | | |")
            continue
        total = r["tokens_per_s"] or r["samples_per_s"]
        per = r["tokens_per_s_per_device"] or r["samples_per_s_per_device"]
        eff = f"{r['efficiency']:.1%}" if r["efficiency"] is not None else "—"
        flag = " ⚠ below target" if r["below_target"] else ""
        target = f"≥ {r['target']:.0%}" if r["target"] else "—"
        lo, hi = r["spread_per_device"]
        spread = f" ({lo / r['samples_per_s_per_device'] - 1:+.1%}/{hi / r['samples_per_s_per_device'] - 1:+.1%})" \
            if r["runs"] > 1 else ""
        lines.append(f"| {r['strategy']} | {r['world_size']} | {total:,.0f} | {per:,.0f}{spread} | {eff}{flag} | "
                     f"{target} | {r['peak_mem_gib_per_device']:.2f} |")
    if result.get("repeats", 1) > 1:
        lines.append(f"\n_Median of {result['repeats']} runs per row; "
                     "per device in brackets: the slowest and fastest run._")
    if result.get("nccl_env"):
        lines.append("\n_Environment: " + " ".join(f"{k}={v}" for k, v in result["nccl_env"].items()) + "_")
    if result["note"]:
        lines.append(f"\n_{result['note']}_")
    return "\n".join(lines)
