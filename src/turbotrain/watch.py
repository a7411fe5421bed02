"""`turbotrain watch RUN_DIR [--once]`: a live terminal view of a run, from its files alone (it works from
any machine that sees the run directory, and touches nothing in it).

Usage:
    turbotrain watch runs/gpt-shakespeare          # redraws every 2 s while the run goes on (Ctrl-C leaves)
    turbotrain watch runs/gpt-shakespeare --once   # one frame
"""
from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

from turbotrain.report import (
    RunFiles,
    _finite,
    alert_notes,
    describe_state,
    file_notes,
    load_run,
    run_path,
    skipped_text,
    val_loss_text,
)

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 60) -> str:
    """Unicode bars of the last `width` values (or of `width` buckets of them, by mean)."""
    if not values:
        return ""
    if len(values) > width:
        per = len(values) / width
        values = [sum(b) / len(b) for i in range(width)
                  if (b := values[int(i * per):max(int((i + 1) * per), int(i * per) + 1)])]
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(BARS[min(len(BARS) - 1, int((v - lo) / span * len(BARS)))] for v in values)


def _last(run: RunFiles, key: str) -> float | None:
    """The value of the latest row that holds `key`, None when that one is not a number (a NaN validation loss
    is logged as null): an earlier row's figure shown as the current one would be a wrong number."""
    v = next((r[key] for r in reversed(run.rows) if key in r), None)
    return v if _finite(v) else None


def _num(v: float | None, fmt: str = ".4g", unit: str = "") -> str:
    return "–" if v is None else f"{v:{fmt}}{unit}"


def frame(run: RunFiles, width: int = 60) -> str:
    """One screen of the view, as text."""
    losses = run.series("loss")[1]
    last = run.last_row  # the last row's own loss, NaN included: a finite one from before would mislead
    rate = _last(run, "tokens_per_s")
    rate_s = f"{_num(rate, '.4g')} tokens/s" if rate is not None else f"{_num(_last(run, 'samples_per_s'))} samples/s"
    mfu = _last(run, "mfu")
    loss = last.get("loss")
    if not (isinstance(loss, float) or _finite(loss)):  # NaN and inf say what ended a run; "x" or 10**400 do not
        loss = losses[-1] if losses else None
    lines = [
        f"turbotrain watch — {run.path}   [{describe_state(run)}]",
        f"step {last.get('step', '–')}   loss {_num(loss)}   val_loss {val_loss_text(run, _num)}",
        f"loss   {sparkline(losses, width)}",
        f"       min {_num(min(losses) if losses else None)}  max {_num(max(losses) if losses else None)}",
        f"speed  {rate_s}   step {_num(_last(run, 'step_ms'), '.1f', ' ms')}   "
        f"MFU {_num(None if mfu is None else mfu * 100, '.1f', ' %')}",
        f"thru   {sparkline(run.series('samples_per_s')[1], width)}",
        f"memory peak {_num(_last(run, 'peak_mem_gib'), '.2f', ' GiB')}   "
        f"device {_num(_last(run, 'gpu_mem_used_gib'), '.2f', ' GiB')}",
        f"GPU    util {_num(_last(run, 'gpu_util_pct'), '.0f', ' %')}   "
        f"temp {_num(_last(run, 'gpu_temp_c'), '.0f', ' °C')}",
        f"data   wait {_num(_last(run, 'data_wait_pct'), '.1f', ' %')} of step time   "
        f"sync {_num(_last(run, 'sync_ms'), '.1f', ' ms')}"
        + (f"   exposed comm {run.exposed_comm_share:.1%} (profile)" if run.exposed_comm_share is not None else ""),
        *([f"fp16   ! optimizer steps skipped: {skipped}"] if (skipped := skipped_text(run)) else []),
        *[f"files  ! {note}" for note in file_notes(run)],
        *_alert_lines(run, width),
    ]
    return "\n".join(lines)


def _alert_lines(run: RunFiles, width: int) -> list[str]:
    """The latest alerts; "none" only where nothing says alerts were lost (report.alert_notes)."""
    notes = alert_notes(run)
    lines = [f"alerts ({len(run.alerts)}{' readable, incomplete' if notes else ''}):"]
    lines += [f"  ! {note}" for note in notes]
    for a in run.alerts[-5:]:
        msg = str(a.get("message", "")).split("\n", 1)[0]
        # wrapped, not cut: an alert's message ends with its fix
        lines += textwrap.wrap(f"  step {a.get('step')} rank {a.get('rank')} {a.get('rule')}: {msg}", max(width, 40),
                               subsequent_indent="      ")
    if not run.alerts and not notes:
        lines.append("  none")
    return lines


def watch(run_dir: str | Path, once: bool = False, interval_s: float = 2.0) -> None:
    """Print frames while the run goes on (report.run_state: its lock held), then its last frame; `once`: one
    frame. Where the lock cannot be tested it goes on until a summary.json appears (or Ctrl-C)."""
    path = run_path(run_dir)
    while True:
        run = load_run(path)
        text = frame(run)
        if once:
            print(text)
            return
        if sys.stdout.isatty():
            sys.stdout.write("\x1b[H\x1b[2J")  # home + clear: redraw in place
        print(text, flush=True)
        if run.state in ("finished", "stopped"):  # no process writes to it now: a further frame would be the same
            return
        try:
            time.sleep(interval_s)
        except KeyboardInterrupt:
            return
