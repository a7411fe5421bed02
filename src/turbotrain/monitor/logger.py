"""Where metrics go: the trackers (metrics.jsonl, one object per logged step, always; TensorBoard, CSV, W&B,
MLflow as configured) and the console (a rich progress bar on a terminal, plain lines with the ETA otherwise).
Rank 0 only."""
from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from turbotrain.errors import UserError
from turbotrain.log import console, say
from turbotrain.monitor.trackers import Tracker, build_tracker


def _fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.1f}"


def console_line(row: dict, total: int) -> str:
    parts = [f"step {row['step']}/{total}"]
    if "loss" in row:
        parts.append(f"loss {row['loss']:.4f}")
    if "val_loss" in row:
        parts.append(f"val_loss {row['val_loss']:.4f}" if row["val_loss"] is not None else "val_loss null")
    if row.get("val_acc") is not None:
        parts.append(f"val_acc {row['val_acc']:.2%}")
    if row.get("tokens_per_s"):
        parts.append(f"{_fmt_rate(row['tokens_per_s'])} tok/s")
    elif row.get("samples_per_s"):
        parts.append(f"{_fmt_rate(row['samples_per_s'])} samples/s")
    if row.get("mfu") is not None:
        parts.append(f"mfu {row['mfu']:.1%}")
    if "data_wait_pct" in row:
        parts.append(f"data wait {row['data_wait_pct']:.1f}%")
    if row.get("peak_mem_gib"):
        parts.append(f"mem {row['peak_mem_gib']:.2f} GiB")
    return " | ".join(parts)


class MetricsLogger:
    """Rank 0's metric rows: to every tracker (metrics.jsonl always; TensorBoard, CSV, W&B, MLflow or one of
    the user's as `trackers` names them; see monitor/trackers.py) and to the console.
    Usage: `MetricsLogger(run_dir, steps, enabled=env.is_main, trackers=cfg.trackers, start_step=start)`."""

    def __init__(self, run_dir: Path, total_steps: int, enabled: bool = True,
                 trackers: Sequence[str | Tracker] = ("jsonl", "tensorboard"), start_step: int = 0):
        self.enabled, self.total, self.start_step = enabled, total_steps, start_step
        self.t0 = self.last_line = time.perf_counter()
        self.trackers: list[Tracker] = []
        self.progress = None
        if enabled:  # jsonl first and always: the run's record, whatever else is asked for
            specs = ["jsonl", *(t for t in trackers if t != "jsonl")]
            try:
                for spec in dict.fromkeys(specs):
                    if (tracker := build_tracker(spec, run_dir, start_step)) is not None:
                        self.trackers.append(tracker)
            except BaseException:
                self.close()  # the trackers opened so far (a W&B run, files) end cleanly
                raise
        if enabled and sys.stdout.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("[bold]train"), BarColumn(),
                                     TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                     TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step, info="")
            self.progress.start()

    def tick(self, step: int) -> None:
        """Every step, on the host: the bar (and its ETA) moves; in a log file a plain progress line appears
        when 10 s passed without one, so a run with sparse log steps never goes silent."""
        if self.progress is not None:
            self.progress.update(self.task, completed=step)
        elif self.enabled and time.perf_counter() - self.last_line > 10 and step - self.start_step >= 2:
            console(f"step {step}/{self.total} | ETA {self.eta(step)}")
            self.last_line = time.perf_counter()

    def eta(self, step: int) -> str:
        done = step - self.start_step
        if done < 2:
            return "-:--:--"
        left = (time.perf_counter() - self.t0) / done * (self.total - step)
        return f"{int(left // 3600)}:{int(left % 3600 // 60):02d}:{int(left % 60):02d}"

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        for tracker in list(self.trackers):
            try:
                tracker.log(row)
            except Exception as e:
                if not getattr(tracker, "best_effort", False):
                    raise _log_error(tracker, e, row) from None
                self._turn_off(tracker, e, row)
        line = console_line(row, self.total)
        if self.progress is not None:
            self.progress.update(self.task, completed=row["step"], info=line.split(" | ", 1)[-1])
            if "val_loss" in row:
                self.progress.console.print(line)
        else:  # a log file (batch job): plain lines with the ETA
            console(f"{line} | ETA {self.eta(row['step'])}")
            self.last_line = time.perf_counter()

    def _turn_off(self, tracker: Tracker, e: Exception, row: dict) -> None:
        """A dashboard elsewhere (W&B, MLflow: `best_effort`) that fails mid-run is turned off, not the run: hours of
        training must not end over a tracking server gone away, and metrics.jsonl holds every row all the same."""
        self.trackers.remove(tracker)
        say(f"warning: monitor: {_name(tracker)} failed at step {row.get('step')} ({_reason(e)[:200]}); it is turned "
            f"off for the rest of the run (metrics.jsonl keeps every row: sync it later from there)")
        try:
            tracker.close()
        except Exception:  # noqa: BLE001 - the same server gone away, said above
            pass

    def close(self) -> None:
        """Close every tracker, even after one fails. Called while an exception is on its way out (the
        trainer's `finally`, e.g. the UserError of a full disk), a tracker's failure to close is not raised over
        that first error, which is the one the user must see; otherwise the first failure is raised."""
        if self.progress is not None:
            self.progress.stop()
        trackers, self.trackers, failed = self.trackers, [], None
        for tracker in trackers:
            try:
                tracker.close()
            except Exception as e:  # noqa: BLE001 - the other trackers close all the same
                if getattr(tracker, "best_effort", False):  # the run's own record is whole: a warning, not a failure
                    say(f"warning: monitor: closing {_name(tracker)} failed ({_reason(e)[:200]}); metrics.jsonl "
                        f"keeps every row")
                    continue
                failed = failed or (tracker, e)
        if failed is None:
            return
        tracker, e = failed
        if sys.exc_info()[1] is not None:
            if not isinstance(e, (UserError, OSError)):  # not the same disk again: worth a line
                say(f"monitor: closing {_name(tracker)} failed too ({_reason(e)})")
            return
        if isinstance(e, OSError):
            raise UserError(f"monitor.trackers: cannot close {_name(tracker)} ({_reason(e)}); fix where it writes "
                            f"(free space, permissions) or remove it from monitor.trackers") from None
        raise e


def _log_error(tracker: Tracker, e: Exception, row: dict) -> Exception:
    """The error that ends the run for a tracker's failed log: a write error of a tracker of the user's as one
    UserError (the built-in ones raise a UserError themselves), anything else as it was."""
    if not isinstance(e, OSError):
        return e
    return UserError(f"monitor.trackers: {_name(tracker)} cannot log step {row.get('step')} ({_reason(e)}); "
                     f"fix where it writes (free space, permissions) or remove it from monitor.trackers")


def _name(tracker: Tracker) -> str:
    return type(tracker).__name__


def _reason(e: BaseException) -> str:
    return (e.strerror if isinstance(e, OSError) and e.strerror else " ".join(str(e).split())) or type(e).__name__
