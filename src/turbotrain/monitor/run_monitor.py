"""One object owns a run's monitoring: the step meter, the non-finite streak, NVML readings, alerts,
straggler detection, the metrics logger and the final summary. The loop calls it at three points:
`after_step` every step (no device sync), `measure` + `write` at log steps, `summary` at the end."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from turbotrain.distributed.env import DistEnv, all_mean
from turbotrain.monitor.alerts import Alerts
from turbotrain.monitor.logger import MetricsLogger
from turbotrain.monitor.nvml import GpuStats
from turbotrain.monitor.stragglers import ForwardTimer, StragglerWatch
from turbotrain.monitor.throughput import Meter
from turbotrain.workload import peak_mem_gib, sync


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """What one optimizer step processes, for rates and MFU."""

    global_batch: int
    tokens_per_sample: int | None
    flops_per_sample: float
    flops_source: str
    peak_flops: float | None  # of one device at the run's dtype; None = unknown (MFU null)


class RunMonitor:
    def __init__(self, run_dir: Path, env: DistEnv, device: torch.device, cost: StepCost, *, steps: int,
                 start_step: int, max_bad_steps: int, straggler_ratio: float):
        self.env, self.device, self.cost, self.steps = env, device, cost, steps
        self.logger = MetricsLogger(run_dir, steps, enabled=env.is_main, start_step=start_step)
        self.gpu, self.alerts = GpuStats(device), Alerts(max_bad_steps)
        self.fwd_timer = ForwardTimer(device, enabled=env.world_size > 1)
        self.stragglers = StragglerWatch(straggler_ratio, device, env.rank)
        self.n_warm = min(3, max(1, (steps - start_step) // 10))  # compile / CUDA-graph capture / allocator warm-up
        self.meter, self.start_step, self.last = Meter(self.n_warm, start_step), start_step, {}
        self.bad_streak = torch.zeros((), dtype=torch.int32, device=device)  # non-finite losses in a row
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def after_step(self, done: int, loss: torch.Tensor) -> None:
        """Every step, on the device only (no sync), except once: the end of warm-up."""
        self.bad_streak = torch.where(torch.isfinite(loss), 0, self.bad_streak + 1)
        self.logger.tick(done)  # host-side progress bar only
        if done - self.start_step == self.n_warm:  # the timed region starts on a drained device
            sync(self.device)
            self.meter.warm_done()

    def measure(self, done: int, loss: torch.Tensor, grad_norm: torch.Tensor | None, lr: float,
                data_wait_s: float) -> dict:
        """The metrics row of a log step. Sync point: reads the clock and the loss. Stops the window clock, so
        what runs before `write` (evaluation) stays out of the throughput."""
        sync(self.device)
        dt, n, wait = self.meter.window(done, data_wait_s)
        rate = n * self.cost.global_batch / dt
        self.meter.record(rate)
        loss_v, peak, streak = all_mean([loss.item(), peak_mem_gib(self.device), self.bad_streak.item()], self.device)
        row = {"step": done, "loss": loss_v, "lr": lr, "grad_norm": grad_norm.item() if grad_norm is not None else None,
               **self._rates(rate, dt / n, wait / dt), "peak_mem_gib": round(peak, 4)}
        if self.env.world_size > 1:
            row.update(self.stragglers.update((self.fwd_timer.take() + wait) / n, done))
        self.alerts.check_loss(loss_v, done, streak, final=done == self.steps)
        self.alerts.check_rate(rate, done)
        row.update(self.gpu.read())
        return row

    def write(self, row: dict, data_wait_s: float) -> None:
        """Log the row (JSONL, TensorBoard, console); the next throughput window starts now."""
        self.logger.log(row)
        self.last = row
        self.meter.restart(row["step"], data_wait_s)

    def exclude(self, seconds: float) -> None:
        """Time spent outside training (a checkpoint save) stays out of throughput and its alerts."""
        self.meter.exclude(seconds)

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
        timed = self._rates(rate, c.global_batch / rate, 0.0) if rate else {}
        steady_step_s = c.global_batch / rate if rate else 0.0
        return {
            "steps": last.get("step"), "final_loss": last.get("loss"), "val_loss": last.get("val_loss"),
            "val_acc": last.get("val_acc"), "samples_per_s": rate, "samples_per_s_median_window": m.median_window,
            "samples_per_s_per_device": rate / self.env.world_size if rate else None,
            "tokens_per_s": timed.get("tokens_per_s"), "step_ms": timed.get("step_ms"), "mfu": timed.get("mfu"),
            "peak_mem_gib": last.get("peak_mem_gib"), "data_wait_pct": last.get("data_wait_pct"),
            # warm-up steps' time beyond what they would take at steady speed (≈ compile + first-call costs)
            "compile_s": max(0.0, m.warm_s - m.n_warm * steady_step_s) if compiled else 0.0,
            "warmup_s": m.warm_s, "warmup_steps_excluded": m.n_warm, "wall_s": wall_s,
            "flops_per_sample": c.flops_per_sample, "flops_source": c.flops_source, "peak_flops": c.peak_flops, **info,
        }

    def close(self) -> None:
        self.logger.close()
