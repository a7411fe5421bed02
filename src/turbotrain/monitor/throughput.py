"""Step timing: log windows for the per-row figures, and a timed region for the summary that leaves
out warm-up (compile, CUDA-graph capture) and the time spent logging and evaluating."""
from __future__ import annotations

import statistics
import time


class Meter:
    def __init__(self, n_warm: int, start_step: int = 0):
        self.n_warm, self.start_step = n_warm, start_step
        self.t_loop = self.window_t0 = time.perf_counter()
        self.window_start, self.window_wait0 = start_step, 0.0
        self.timed_t0: float | None = None
        self.excluded_s = 0.0
        self.windows: list[float] = []  # samples/s of each post-warm-up window

    def warm_done(self) -> None:
        """Call on a drained device at the end of warm-up."""
        self.timed_t0 = time.perf_counter()

    def window(self, done: int, wait_s: float) -> tuple[float, int, float]:
        """At a log step (device drained): (seconds, steps, data-wait seconds) since the last window."""
        self.t_log = time.perf_counter()
        dt, n = self.t_log - self.window_t0, done - self.window_start
        return dt, n, wait_s - self.window_wait0

    def record(self, rate: float) -> None:
        if self.window_start - self.start_step >= self.n_warm:
            self.windows.append(rate)

    def restart(self, done: int, wait_s: float, overlapped: bool = False) -> None:
        """After logging/eval: the next window starts now; that time stays out of the summary. `overlapped`: the
        row was built while the device ran the next step (RunMonitor.snapshot), so no time is left out."""
        self.window_t0 = self.t_log if overlapped else time.perf_counter()
        self.window_start, self.window_wait0 = done, wait_s
        if self.timed_t0 is not None:
            self.excluded_s += self.window_t0 - self.t_log

    def exclude(self, seconds: float) -> None:
        """Time outside training (a checkpoint save) leaves the window and the timed region."""
        self.window_t0 += seconds
        if self.timed_t0 is not None:
            self.excluded_s += seconds

    def timed_rate(self, steps_done: int, samples_per_step: int) -> float | None:
        n = steps_done - self.start_step - self.n_warm
        if self.timed_t0 is None or n <= 0:
            return None
        return n * samples_per_step / (self.window_t0 - self.timed_t0 - self.excluded_s)

    def overall_rate(self, steps_done: int, samples_per_step: int) -> float | None:
        """Like timed_rate, but the log steps' own work (metrics, alerts, evaluation) counts as time too."""
        n = steps_done - self.start_step - self.n_warm
        if self.timed_t0 is None or n <= 0:
            return None
        return n * samples_per_step / (self.window_t0 - self.timed_t0)

    @property
    def warm_s(self) -> float:
        return (self.timed_t0 or self.window_t0) - self.t_loop

    @property
    def median_window(self) -> float | None:
        return statistics.median(self.windows) if self.windows else None
