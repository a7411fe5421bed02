"""One object owns a run's monitoring: the step meter, the non-finite streak, NVML readings, alerts (rules,
sinks, the hung-step watchdog), straggler detection, the metrics logger and the final summary. The loop
calls it at three points: `after_step` every step (no device sync), `measure` + `write` at log steps (or, on
one GPU, `snapshot` there and `deferred` + `write` once the next step is queued), `summary` at the end; `close` in
a finally."""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from turbotrain.distributed.env import DistEnv, all_mean
from turbotrain.errors import UserError
from turbotrain.log import say
from turbotrain.monitor import sinks
from turbotrain.monitor.alerts import Alerts, NonFiniteLoss
from turbotrain.monitor.logger import MetricsLogger
from turbotrain.monitor.nvml import GpuStats
from turbotrain.monitor.rules import Fired, MonitorConfig, straggler
from turbotrain.monitor.stragglers import ForwardTimer, StragglerWatch
from turbotrain.monitor.throughput import Meter
from turbotrain.monitor.watchdog import HUNG_EXIT_CODE, Watchdog, end_children, hang_cause, stuck_in
from turbotrain.rundir import regular_fd
from turbotrain.workload import peak_mem_gib, sync

__all__ = ["MonitorConfig", "RunMonitor", "StepCost"]  # MonitorConfig lives beside its rules (rules.py)


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """What one optimizer step processes, for rates and MFU."""

    global_batch: int
    tokens_per_sample: int | None
    flops_per_sample: float
    flops_source: str
    peak_flops: float | None  # of one device at the run's dtype; None = unknown (MFU null)


# every name the monitor may put in a metrics row (some only with 2+ ranks, NVML, tokens or a known peak): a
# callback's extra metrics may take none of them, present on a given row or not (callbacks.py)
ROW_NAMES = frozenset({
    "step", "loss", "lr", "grad_norm", "samples_per_s", "step_ms", "data_wait_pct", "tokens_per_s", "mfu",
    "peak_mem_gib", "sync_ms", "rank_time_ratio", "slowest_rank", "gpu_util_pct", "gpu_mem_used_gib",
    "gpu_temp_c", "gpu_mem_pct", "nonfinite"})  # nonfinite: the marks of NaN/inf values written as null


class RunMonitor:
    def __init__(self, run_dir: Path, env: DistEnv, device: torch.device, cost: StepCost, *, steps: int,
                 start_step: int, max_bad_steps: int, straggler_ratio: float, cfg: MonitorConfig | None = None,
                 scaler: torch.amp.GradScaler | None = None, read_step: Callable[[int], list] | None = None):
        """`read_step`: the micro-batches of a (0-based) step read again (the loader's `read_step`), so that a
        loss gone non-finite between log steps is traced to the batch of the step it went non-finite at."""
        self.env, self.device, self.cost, self.steps = env, device, cost, steps
        self.read_step = read_step
        self.skips = SkipCounter(scaler, device) if scaler is not None and scaler.is_enabled() else None
        self.scaled = self.skips is not None  # fp16: inf gradients are skipped steps, not a fault
        self.cfg = cfg = cfg or MonitorConfig()
        if start_step:  # the rules go on from the checkpoint's step as if the run had not stopped (read first: a
            # file that cannot be read ends the run before anything is opened)
            rows = [r for r in _records(run_dir / "metrics.jsonl") if _step(r) is not None and _step(r) <= start_step]
            sent = _records(run_dir / "alerts.jsonl")
        self.logger = MetricsLogger(run_dir, steps, enabled=env.is_main, trackers=cfg.trackers, start_step=start_step)
        self.gpu = GpuStats(device)
        self.mem_total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        try:  # a port in use is a user error: the logger's trackers opened so far end cleanly
            self.alerts = _build_alerts(run_dir, env, cfg, max_bad_steps)
        except BaseException:
            self.logger.close()
            raise
        if start_step:
            self.alerts.resume(rows, sent, grads=not self.scaled)
        self.fwd_timer = ForwardTimer(device, enabled=env.world_size > 1)
        self.stragglers = StragglerWatch(straggler_ratio, device, env.rank)
        self.n_warm = min(3, max(1, (steps - start_step) // 10))  # compile / CUDA-graph capture / allocator warm-up
        self.meter, self.start_step, self.last = Meter(self.n_warm, start_step), start_step, {}
        self.pending: Pending | None = None
        self._host: torch.Tensor | None = None  # pinned on a GPU: the copy in snapshot does not wait
        self.bad_streak = torch.zeros((), dtype=torch.int32, device=device)  # non-finite losses in a row
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        self.watchdog = Watchdog(cfg.hang_timeout_s, self._on_hang, start_step) if cfg.hang_timeout_s else None

    def after_step(self, done: int, loss: torch.Tensor) -> None:
        """Every step, on the device only (no sync), except once: the end of warm-up."""
        self.bad_streak = torch.where(torch.isfinite(loss), 0, self.bad_streak + 1)
        if self.skips is not None:
            self.skips.after_step()
        self.logger.tick(done)  # host-side progress bar only
        if self.watchdog is not None:
            self.watchdog.beat(done)  # a host clock reading
        if done - self.start_step == self.n_warm:  # the timed region starts on a drained device
            sync(self.device)
            self.meter.warm_done()

    def measure(self, done: int, loss: torch.Tensor, grad_norm: torch.Tensor | None, lr: float,
                data_wait_s: float, batch: object = None) -> dict:
        """The metrics row of a log step. Sync point: reads the clock and the loss. Stops the window clock, so
        what runs before `write` (evaluation) stays out of the throughput. Runs the alert rules. `batch`: the
        step's micro-batches, for naming NaN/inf data as the cause of a non-finite loss."""
        sync(self.device)
        window = self.meter.window(done, data_wait_s)
        # the non-finite streak is the longest on any rank (a mean would stop a NaN on one of N ranks N times late)
        loss_v, peak, streak = all_mean([loss.item(), peak_mem_gib(self.device), self.bad_streak.item()], self.device,
                                        maxed=(2,))
        return self._row(done, window, loss_v, grad_norm.item() if grad_norm is not None else None, lr, peak, streak,
                         data_wait_s, batch=batch)

    @property
    def can_defer(self) -> bool:
        """Whether log rows may be built a step late (`snapshot`): only one GPU gains (a CPU runs each op as it is
        called, and several ranks average the row in a collective that every rank must reach at once)."""
        return self.device.type == "cuda" and self.env.world_size == 1

    def snapshot(self, done: int, loss: torch.Tensor, grad_norm: torch.Tensor | None, lr: float, data_wait_s: float,
                 batch: object = None) -> None:
        """A log step's values, copied off the device without waiting for it; `deferred` builds the row once the
        next step is queued behind it. A sync here would leave the GPU idle while the host reads, logs and
        relaunches (with train.log_every=1, a few % of a GPT-2 step: docs/benchmarks.md)."""
        nan = torch.full((), math.nan, device=loss.device)
        norm = grad_norm.detach().float().reshape(()) if grad_norm is not None else nan
        values = torch.stack([loss.detach().float().reshape(()), norm, self.bad_streak.float()])
        if self._host is None:
            self._host = torch.empty(3, pin_memory=self.device.type == "cuda")
        self._host.copy_(values, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self.pending = Pending(done, lr, data_wait_s, grad_norm is not None, event, batch)

    def deferred(self, checks: bool = True) -> dict:
        """The row of the pending `snapshot`; waits for that step only (the next one is queued behind it)."""
        p, self.pending = self.pending, None
        if p.event is not None:
            p.event.synchronize()
        window = self.meter.window(p.done, p.wait_s)
        loss_v, norm, streak = self._host.tolist()
        return self._row(p.done, window, loss_v, norm if p.has_norm else None, p.lr, peak_mem_gib(self.device),
                         streak, p.wait_s, overlapped=True, checks=checks, batch=p.batch)

    def _row(self, done: int, window: tuple, loss_v: float, grad_v: float | None, lr: float, peak: float,
             streak: float, wait_s: float, overlapped: bool = False, checks: bool = True, batch: object = None) -> dict:
        warm = self.meter.window_start - self.start_step >= self.n_warm  # no compile / warm-up in this window
        dt, n, wait = window
        rate = n * self.cost.global_batch / dt
        self.meter.record(rate)
        # a NaN/inf norm (fp16's skipped step, or NaN gradients: alerted below) is no figure: null, which JSON holds
        norm = grad_v if grad_v is not None and math.isfinite(grad_v) else None
        row = {"step": done, "loss": loss_v, "lr": lr, "grad_norm": norm,
               **self._rates(rate, dt / n, wait / dt), "peak_mem_gib": round(peak, 4)}
        if self.env.world_size > 1:
            row.update(self._sync_probe())
            row.update(self.stragglers.update((self.fwd_timer.take() + wait) / n, done))
            self._straggler_alert(row, done)
        row.update(self._gpu_row())
        if not checks:  # a row written as the run fails for another reason (close)
            return row
        nan_data, nan_at = (None, None) if math.isfinite(loss_v) else self._nan_data(batch, done, streak)
        try:
            self.alerts.check_loss(loss_v, done, streak, final=done == self.steps, nan_data=nan_data, nan_at=nan_at)
        except NonFiniteLoss:  # the run ends here: its last row, with the NaN that ended it, is kept
            self.write(row, wait_s, overlapped)
            raise
        if math.isfinite(loss_v) and not self.scaled:
            self.alerts.check_grad(grad_v, done, loss_v)
        self.alerts.check_row(row, done, warm)
        return row

    def _nan_data(self, batch: object, done: int, streak: float) -> tuple[str | None, int | None]:
        """(part, step): the part of a batch holding NaN/inf and the step it was read at: this log step's, else
        (train.log_every > 1) the batch of the step the loss went non-finite at, read again, whose NaN weights
        carried the loss on to here; (None, None) when both are clean or cannot be read."""
        if part := _nonfinite_part(batch):
            return part, done
        first = done - max(1, math.ceil(streak)) + 1
        if first == done or self.read_step is None:
            return None, None
        try:
            part = _nonfinite_part(self.read_step(first - 1))
        except Exception:  # noqa: BLE001 - no verdict on the data (a source that cannot be read again)
            return None, None
        return (part, first) if part else (None, None)

    def _sync_probe(self) -> dict:
        """Distributed synchronisation latency: one small all-reduce right after the row's own (which lined the
        ranks up), timed on the host; `tolist` inside waits for it."""
        t0 = time.perf_counter()
        all_mean([0.0], self.device)
        return {"sync_ms": (time.perf_counter() - t0) * 1e3}

    def _straggler_alert(self, row: dict, done: int) -> None:
        s = self.stragglers
        if (got := straggler(s.streak, s.patience, s.ratio, row["rank_time_ratio"], s.detail)) is not None:
            self.alerts.emit(got[1], done, rank=got[0])

    def _gpu_row(self) -> dict:
        out = self.gpu.read()
        if self.mem_total and "gpu_mem_used_gib" in out:
            out["gpu_mem_pct"] = round(100 * out["gpu_mem_used_gib"] * 2**30 / self.mem_total, 2)
        return out

    def _on_hang(self, since: float, step: int, stacks: str) -> None:
        """The watchdog's verdict (its own thread; the loop is stuck): alert with every thread's stack, let the
        sinks finish (bounded), then end the process — torchrun then tears the other ranks down."""
        rank = self.env.rank
        msg = (f"no step completed for {since:.1f} s after step {step} (monitor.hang_timeout_s = "
               f"{self.cfg.hang_timeout_s:g}), {hang_cause(stuck_in())}; ending the run (every thread's stack of "
               f"rank {rank} follows)\n{stacks}")
        self.alerts.emit(Fired("hung_step", since, self.cfg.hang_timeout_s, msg), step, repeat=True)
        print(f"{stacks}\n[turbotrain] rank {rank}: hung after step {step} (nothing completed for {since:.1f} s, "
              f"monitor.hang_timeout_s = {self.cfg.hang_timeout_s:g}); every thread's stack is above",
              file=sys.stderr, flush=True)
        self.alerts.close(wait_s=min(self.cfg.webhook_timeout_s, 5.0))
        sys.stdout.flush()
        end_children()
        os._exit(HUNG_EXIT_CODE)

    def write(self, row: dict, data_wait_s: float, overlapped: bool = False) -> None:
        """Log the row (JSONL, TensorBoard, console); the next throughput window starts now (`overlapped`, a
        `deferred` row: where the window ended, as the device ran on while the host logged)."""
        self.logger.log(row)
        self.last = row
        if "val_loss" in row and row["val_loss"] is None:  # evaluation's NaN/inf, logged as null (step.evaluate)
            self.alerts.emit(Fired("loss_nonfinite", math.nan, math.inf,
                                   f"validation loss is NaN/inf at step {row['step']} (logged as null): the model "
                                   "diverges in eval mode, or the val data holds NaN/inf"), row["step"])
        if self.alerts.prometheus is not None:
            self.alerts.prometheus.update(row)
        if self.watchdog is not None:
            self.watchdog.beat(row["step"])  # evaluation is not a hang
        self.meter.restart(row["step"], data_wait_s, overlapped)

    def exclude(self, seconds: float) -> None:
        """Time spent outside training (a checkpoint save) stays out of throughput and its alerts."""
        self.meter.exclude(seconds)
        if self.watchdog is not None:
            self.watchdog.beat(self.watchdog.last_step)  # a save is not a hang

    def _rates(self, samples_per_s: float, step_s: float, wait_frac: float) -> dict:
        c = self.cost
        row = {"samples_per_s": samples_per_s, "step_ms": step_s * 1e3, "data_wait_pct": 100 * wait_frac}
        if c.tokens_per_sample:
            row["tokens_per_s"] = samples_per_s * c.tokens_per_sample
        per_device = samples_per_s / self.env.world_size
        row["mfu"] = min(1.0, per_device * c.flops_per_sample / c.peak_flops) if c.peak_flops else None
        return row

    def summary(self, done: int, wall_s: float, compiled: bool, info: dict) -> dict:
        """Final figures: throughput over the timed region (warm-up, logging and evaluation left out)."""
        m, c, last = self.meter, self.cost, self.last
        rate = m.timed_rate(done, c.global_batch)
        skipped = (self.skips.report(done - self.start_step, self.start_step) if self.skips is not None
                   else None if self.scaled else 0)  # None: loss scaling without its scaler to count from
        timed = self._rates(rate, c.global_batch / rate, 0.0) if rate else {}
        steady_step_s = c.global_batch / rate if rate else 0.0
        return {
            "steps": last.get("step"), "final_loss": last.get("loss"), "val_loss": last.get("val_loss"),
            "val_acc": last.get("val_acc"), "samples_per_s": rate, "samples_per_s_median_window": m.median_window,
            # the same steps with the log steps' own work (metrics, alerts, evaluation) counted as time
            "samples_per_s_overall": m.overall_rate(done, c.global_batch),
            "samples_per_s_per_device": rate / self.env.world_size if rate else None,
            "tokens_per_s": timed.get("tokens_per_s"), "step_ms": timed.get("step_ms"), "mfu": timed.get("mfu"),
            "peak_mem_gib": last.get("peak_mem_gib"), "data_wait_pct": last.get("data_wait_pct"),
            # warm-up steps' time beyond what they would take at steady speed (≈ compile + first-call costs)
            "compile_s": max(0.0, m.warm_s - m.n_warm * steady_step_s) if compiled else 0.0,
            "warmup_s": m.warm_s, "warmup_steps_excluded": m.n_warm, "wall_s": wall_s,
            "flops_per_sample": c.flops_per_sample, "flops_source": c.flops_source, "peak_flops": c.peak_flops,
            "alerts": dict(self.alerts.counts), "alerts_undelivered": w.failed if (w := self.alerts.webhook) else 0,
            "skipped_steps": skipped,  # optimizer steps fp16's loss scaling skipped (this process's)
            **info,
        }

    def close(self) -> None:
        """Watchdog, alerts, /metrics, then the metrics files: each part closes even when one before it
        fails (a full disk under alerts.jsonl must not leave metrics.jsonl unflushed); the failure is raised."""
        self.read_step = None  # the loader's: a failed run's traceback keeps the monitor, not its loader workers
        with contextlib.ExitStack() as parts:  # runs the callbacks last-registered first, each whatever happens
            parts.callback(self.logger.close)
            parts.callback(self._write_pending)
            if self.alerts.prometheus is not None:
                parts.callback(self.alerts.prometheus.close)
            parts.callback(self.alerts.close, wait_s=self.cfg.webhook_timeout_s)
            if self.watchdog is not None:
                parts.callback(self.watchdog.stop)

    def _write_pending(self) -> None:
        """A run failing in the step after a log step still writes that step's row, when the device can give it."""
        if self.pending is not None:
            with contextlib.suppress(RuntimeError):  # a failed device (a CUDA error is sticky) gives nothing back
                self.logger.log(self.deferred(checks=False))


class SkipCounter:
    """The optimizer steps fp16's GradScaler skipped (their gradients overflowed at the scale in force), counted
    on the device: its `update()` backs the scale off after such a step, and only then, so a scale below the one
    before the step is a skip. Its `get_scale()` would wait for the device at every step: the tensor is read."""

    def __init__(self, scaler: torch.amp.GradScaler, device: torch.device):
        self.scaler, self.first = scaler, scaler._init_scale  # the scale of the first step (a resume's: its own)
        self.count = torch.zeros((), dtype=torch.int64, device=device)
        self.before: torch.Tensor | None = None  # the scale in force for the next step (None: `first`)

    def after_step(self) -> None:
        now = self.scaler._scale  # made at the first scale(), updated in place by every update()
        if now is None:
            return
        self.count += now < (self.first if self.before is None else self.before)
        if self.before is None:
            self.before = now.clone()
        else:
            self.before.copy_(now)

    def report(self, steps: int, start_step: int) -> int:
        """The count (a sync, once at the end), said in a warning when any step was skipped."""
        n = int(self.count.item())
        of = f"{steps} optimizer steps" + (f" since the resume at step {start_step}" if start_step else "")
        if n and n >= steps:
            say(f"warning: the run trained nothing: fp16 loss scaling skipped all {of} (the gradients overflowed "
                f"at every scale tried: it started at {self.first:g} and is now {self.scaler.get_scale():g}), so "
                f"the weights are the ones it started from; train for more steps (each skip halves the scale) or "
                f"use precision.dtype=\"bf16\" (no loss scaling)")
        elif n:
            say(f"warning: fp16 loss scaling skipped {n} of {of} (gradients overflowed at the scale in force); "
                f"those steps left the weights unchanged")
        return n


@dataclass
class Pending:
    """A log step's row, waiting for its values to come off the device (RunMonitor.snapshot)."""

    done: int
    lr: float
    wait_s: float
    has_norm: bool
    event: torch.cuda.Event | None  # recorded after the copy; None on a CPU, where the copy is done at once
    batch: object  # the step's batch, for naming a NaN it holds (Run.blame_batch)


def _build_alerts(run_dir: Path, env: DistEnv, cfg: MonitorConfig, max_bad_steps: int) -> Alerts:
    """Every rank writes its own alerts to alerts.jsonl (and the webhook); /metrics is rank 0's, or each
    rank's on prometheus_port + LOCAL_RANK with monitor.prometheus_per_rank."""
    webhook = prometheus = None
    if cfg.webhook_url:
        undelivered = sinks.JsonlFile(run_dir / "alerts_undelivered.jsonl")
        webhook = sinks.Webhook(cfg.webhook_url, cfg.webhook_timeout_s, cfg.webhook_retries, undelivered)
    if cfg.prometheus_port and (env.is_main or cfg.prometheus_per_rank):
        port = cfg.prometheus_port + (env.local_rank if cfg.prometheus_per_rank else 0)
        prometheus = sinks.Prometheus(port, cfg.prometheus_addr, env.rank)
    return Alerts(max_bad_steps, cfg, rank=env.rank, jsonl=sinks.JsonlFile(run_dir / "alerts.jsonl"),
                  webhook=webhook, prometheus=prometheus)


def _nonfinite_part(batch: object) -> str | None:
    """"inputs" / "targets" when a micro-batch of the step (a list of them, or one) holds NaN/inf there, else None.
    Read only once the loss is non-finite: nothing on the good path; a batch of another shape says nothing."""
    from turbotrain.contract import nonfinite_part

    micro = batch if isinstance(batch, list) else [batch] if batch is not None else []
    for b in micro:
        with contextlib.suppress(Exception):  # a batch of the user's own structure: no verdict, not a failure
            if part := nonfinite_part(b):
                return part
    return None


def _records(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file of the run, leniently: a line cut short or damaged is skipped (the
    resume goes on with what is readable), a file that is not there is no records. Anything else there that is
    no regular file (a FIFO, whose read waits for a writer forever; a link, a folder) is one UserError, as the
    resume's trim of metrics.jsonl says it (rundir.trim_metrics)."""
    try:
        with os.fdopen(regular_fd(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as e:
        reason = "a symbolic link" if e.errno == errno.ELOOP else e.strerror or type(e).__name__
        raise UserError(f"cannot read {path} ({reason}); move it aside to resume this run") from None
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            obj = json.loads(line)
            if isinstance(obj, dict):
                out.append(obj)
    return out


def _step(row: dict) -> int | None:
    s = row.get("step")
    return s if isinstance(s, int) and not isinstance(s, bool) else None
