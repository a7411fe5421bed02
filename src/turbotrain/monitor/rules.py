"""Alert rules: the `[monitor]` section's thresholds and the checks that read them.

Each check looks at host floats of a log step (never a tensor: the row is already read by then) and returns
a `Fired` when its rule trips, or None. They keep what history they need (a window of losses, the past
throughput windows, streaks of log steps) and nothing else, so they are tested on synthetic series.

Rule names (the `rule` of an alerts.jsonl line): loss_nonfinite, grad_nonfinite, loss_spike, loss_diverging,
loss_plateau, throughput_drop, data_wait, gpu_util_low, gpu_temp_high, gpu_mem_high, memory_growth, sync_latency,
straggler, hung_step, grad_exploding, grad_vanishing.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from turbotrain.errors import UserError

RULES = ("loss_nonfinite", "grad_nonfinite", "loss_spike", "loss_diverging", "loss_plateau", "throughput_drop",
         "data_wait", "gpu_util_low", "gpu_temp_high", "gpu_mem_high", "memory_growth", "sync_latency", "straggler",
         "hung_step", "grad_exploding", "grad_vanishing")
DIVERGING_RHO = 0.85  # loss_diverging: the least rank correlation of the window's losses with their order
THROUGHPUT_DROP_STEPS = 10  # throughput_drop: the least steps the slow log windows in a row must span
THROUGHPUT_DIP_MAX = 8  # throughput_drop: a dip of at most this many slow windows that recovered twice is the
# run's rhythm (an eval's or a save's cadence): its recurrences are no drop. One that came once was a drop
DIVERGING_SCALES = (1, 2, 4, 8)  # loss_diverging: the trend windows, in multiples of loss_diverging_window
DIVERGING_BLOWUP = 100.0  # loss_diverging: 2 log steps in a row this many times the run's first loss: a blow-up
DIVERGING_T = 8.0  # loss_diverging: the least t-statistic of the shortest window's trend (linear or log scale)
DIVERGING_FLOOR = 0.1  # loss_diverging: a trend rises by loss_diverging_rise x at least this fraction of the run's
# first loss too: a loss brought down 100x+ bounces up several-fold at its LR's peak (momentum overshoot) and
# comes back down; a rise relative to its own tiny level says nothing of the run
SPIKE_POSITIVE_STEPS = 50  # loss_spike: log steps since the last loss <= 0 (the running average forgets it by then)
SPIKE_SIGMAS = 5.0  # loss_spike: the least distance above the running average, in the loss's own noise
SPIKE_NOISE_STEPS = 5  # loss_spike: log steps of the loss's noise known before it sets the threshold alone; until
SPIKE_EARLY = 10.0  # then a spike is this many times the average: 2 or 3 close first losses say nothing of its scatter
GRAD_EXPLODING_FACTOR = 10.0  # grad_exploding: gradient norms this many times the median of the recent ones on 2
GRAD_EXPLODING_ONCE = 100.0  # log steps in a row, or one norm this many times it (a lone clipped spike of ~10-30x is
# routine in a healthy run's warm-up: the default preset has one)
GRAD_EXPLODING_RUN = 1000.0  # grad_exploding: ... or norms this many times the run's first 5 on 2 log steps in a row
GRAD_SIGMAS = 6.0  # grad_exploding: ... and this many of the recent norms' own scatter (log space) above it
GRAD_VANISHING_RATIO = 1e-3  # grad_vanishing: a gradient norm below this fraction of the run's first ones ...
GRAD_VANISHING_FLOOR = 1e-8  # grad_vanishing: a norm at most this is gone, whatever the first ones were
GRAD_VANISHING_STEPS = 3  # ... for this many log steps in a row, while the loss stays above 80% of its level then
PLATEAU_PACE = 4.0  # loss_plateau: a stall this many times the longest the run took to improve before, ...
PLATEAU_AGE = 0.2  # ... and this fraction of the run's age (in log steps)
PLATEAU_NOISE = 1.0  # ... and this x (sigma / delta)^2 log steps: the loss's noise averaged out to delta
PLATEAU_JUMP = 5.0  # loss_plateau: an average this many deltas, and this many times the noise of a 10-log-step
# average of the loss (sigma / sqrt(19)), above the last progress: a new phase
PLATEAU_UNTRAINED = 0.1  # loss_plateau: an average that never fell this fraction below step 1's loss: untrained
MEM_GROWTH_WINDOW = 10  # log steps: a leak raises the peak at nearly every one, a healthy run's peak settles


@dataclass
class MonitorConfig:
    """The `[monitor]` section: where metrics and alerts go, and when alerts fire."""

    trackers: list[str] = field(default_factory=lambda: ["jsonl", "tensorboard"])
    """Metric sinks: "jsonl" (always on) | "tensorboard" | "csv" | "wandb" | "mlflow" (these two need
    turbotrain[trackers]) | "pkg.module:factory" (your own: see turbotrain.monitor.trackers)."""
    webhook_url: str = ""
    """POST every alert as JSON to this URL ("" = off); never blocks training."""
    webhook_timeout_s: float = 5.0
    """Seconds one webhook POST may take before it counts as failed (at most 3600)."""
    webhook_retries: int = 3
    """Tries per alert, 1 to 100 (with a short backoff), before it is recorded as undelivered in
    alerts_undelivered.jsonl."""
    prometheus_port: int = 0
    """Serve /metrics on this port (0 = off); needs the [monitor] extra (prometheus-client)."""
    prometheus_addr: str = "0.0.0.0"
    """Address the /metrics endpoint binds ("127.0.0.1" keeps it local to the host)."""
    prometheus_per_rank: bool = False
    """Every rank serves /metrics on prometheus_port + LOCAL_RANK (default: rank 0 only)."""
    hang_timeout_s: float = 0.0
    """Fail the run when no step completes for this many seconds (>= 1), with every thread's stack (0 = off);
    5x this before the first step (building, the first data reads, compiling)."""
    alert_repeat_s: float = 600.0
    """An alert of one rule is sent at most once per this many seconds (repeats are counted, not sent)."""
    loss_spike_factor: float = 2.0
    """loss_spike: a logged loss above this factor (> 1) times its running average, for positive losses (0 = off)."""
    loss_diverging_window: int = 10
    """loss_diverging: log steps in the trend window (0 = off)."""
    loss_diverging_rise: float = 0.2
    """loss_diverging: the fitted trend rises by more than this fraction over the window, mostly step by step and
    in step order (rank correlation >= 0.85)."""
    loss_plateau_window: int = 50
    """loss_plateau: log steps without improvement that make a plateau, at least: a loss slowing down as it goes
    must also stall 4x the longest the run took to improve before and 20% of its age (0 = off). One alert a
    plateau."""
    loss_plateau_delta: float = 0.01
    """loss_plateau: the relative improvement of the loss's running average that counts as progress."""
    throughput_drop_ratio: float = 0.7
    """throughput_drop: the samples/s of 2+ log windows in a row, spanning >= 10 steps, below this fraction of the
    median of the earlier windows (0 = off)."""
    data_wait_pct: float = 50.0
    """data_wait: the share of the time spent waiting for data above this % ... (100 = off)."""
    data_wait_steps: int = 3
    """... over this many log windows together, weighted by their time (and with any one of them left out: one
    long stall is no starved loader)."""
    gpu_util_low_pct: float = 10.0
    """gpu_util_low: NVML GPU utilisation below this % ... (0 = off)."""
    gpu_util_low_steps: int = 5
    """... over this many log windows together, weighted by their time (and with any one of them left out)."""
    gpu_temp_high_c: float = 85.0
    """gpu_temp_high: GPU temperature above this many °C (0 = off)."""
    gpu_mem_high_pct: float = 95.0
    """gpu_mem_high: device memory in use above this % of the device (0 = off)."""
    mem_growth_pct: float = 5.0
    """memory_growth: the peak memory (device allocated; host RSS on a CPU) rose at most of the last 10 log steps
    and is this % above its first reading after warm-up: a leak (0 = off)."""
    sync_latency_ms: float = 100.0
    """sync_latency: a small all-reduce at a log step takes longer than this many ms (0 = off; 2+ ranks)."""

    def __post_init__(self) -> None:
        from turbotrain.monitor.trackers import trackers_problem

        if problem := trackers_problem(self.trackers):  # at the config load: before the run directory is touched
            raise UserError(problem)
        if not 0 <= self.prometheus_port <= 65535:
            raise UserError(f"monitor.prometheus_port = {self.prometheus_port}: expected 0 (off) or a port 1-65535")
        if self.webhook_url and (problem := _url_problem(self.webhook_url)):
            raise UserError(f"monitor.webhook_url = {self.webhook_url!r}: {problem}; expected an http:// or "
                            f"https:// URL, or \"\" (off)")
        for key in ("hang_timeout_s", "alert_repeat_s", "loss_spike_factor", "loss_diverging_rise", "mem_growth_pct",
                    "loss_plateau_delta", "throughput_drop_ratio", "gpu_temp_high_c", "sync_latency_ms",
                    "loss_diverging_window", "loss_plateau_window"):
            if getattr(self, key) < 0:
                raise UserError(f"monitor.{key} = {getattr(self, key)}: must be >= 0 (0 = off)")
        for key in ("data_wait_pct", "gpu_util_low_pct", "gpu_mem_high_pct"):
            if not 0 <= getattr(self, key) <= 100:
                raise UserError(f"monitor.{key} = {getattr(self, key)}: expected a percentage in [0, 100]")
        for key in ("webhook_retries", "data_wait_steps", "gpu_util_low_steps"):
            if getattr(self, key) < 1:
                raise UserError(f"monitor.{key} = {getattr(self, key)}: must be >= 1")
        if self.webhook_retries > 100:  # each try waits out its timeout: more would hold one alert for the whole run
            raise UserError(f"monitor.webhook_retries = {self.webhook_retries}: at most 100 tries an alert")
        if not 0 < self.webhook_timeout_s <= 3600:  # a socket timeout past that overflows; an hour is plenty
            raise UserError(f"monitor.webhook_timeout_s = {self.webhook_timeout_s}: must be > 0 and at most 3600")
        if self.loss_diverging_window in (1, 2):
            raise UserError("monitor.loss_diverging_window: a trend needs at least 3 log steps (0 = off)")
        if 0 < self.loss_spike_factor <= 1:  # every loss above its own running average would be a spike
            raise UserError(f"monitor.loss_spike_factor = {self.loss_spike_factor}: must be > 1 (0 = off)")
        if 0 < self.hang_timeout_s < 1:  # shorter than a step's own host work: every run would "hang"
            raise UserError(f"monitor.hang_timeout_s = {self.hang_timeout_s}: must be >= 1 second (0 = off)")
        if self.loss_plateau_delta >= 1:  # a loss would have to fall below 0 to improve: every window a plateau
            raise UserError(f"monitor.loss_plateau_delta = {self.loss_plateau_delta}: a fraction of the best loss, "
                            "must be < 1 (0.01: 1%)")
        if self.throughput_drop_ratio >= 1:
            raise UserError(f"monitor.throughput_drop_ratio = {self.throughput_drop_ratio}: must be < 1 (0 = off)")

    def check_sinks(self, local_rank: int = 0, is_main: bool = True) -> None:
        """What the config load leaves to the machine that trains, checked before the run directory is touched,
        as train.callbacks are: the trackers' extras installed and your factories importable (not at the config
        load: a finished run's config.toml must still load for `export` on a machine without them), and the
        Prometheus port free on this host."""
        from turbotrain.monitor.sinks import check_port
        from turbotrain.monitor.trackers import check_trackers

        check_trackers(self.trackers)
        if self.prometheus_port and (is_main or self.prometheus_per_rank):
            check_port(self.prometheus_port + (local_rank if self.prometheus_per_rank else 0), self.prometheus_addr)


def _url_problem(url: str) -> str | None:
    """What makes `url` one that urllib cannot POST to, or None: checked at the config load, not by the
    webhook's thread at the first alert."""
    from urllib.parse import urlsplit

    if not url.startswith(("http://", "https://")):
        return "not an http(s) URL"
    if any(c.isspace() or ord(c) < 32 for c in url):
        return "it holds whitespace or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # raises on a port that is not a number in 0-65535
    except ValueError as e:
        return str(e)
    return None if parts.hostname else "it names no host"


@dataclass(frozen=True)
class Fired:
    """A rule that tripped: its name, the value it saw, the threshold it crossed, a one-line message."""

    rule: str
    value: float
    threshold: float
    message: str


class LossRules:
    """loss_spike (one point over the running average), loss_diverging (a rising trend over a window) and
    loss_plateau (no improvement of the best loss over a window). Non-finite losses are skipped here: the
    non-finite stop in alerts.py owns them."""

    def __init__(self, cfg: MonitorConfig):
        self.cfg, self.ema, self.n = cfg, None, 0
        self.noise, self.prev = None, None  # running mean of |ln(loss / previous loss)|; the previous loss
        self.noise_run = 0.0  # the same over the whole run: the plateau rule's, steady where the other one wanders
        # the longest trend window: DIVERGING_SCALES x the configured one, so a slow rise is seen too
        self.window: deque[float] = deque(maxlen=max(cfg.loss_diverging_window, 1) * DIVERGING_SCALES[-1])
        # the loss at the last progress and the log-step count then; the best (lowest) loss since
        self.ref, self.best_at, self.best = math.inf, 0, math.inf
        self.gap = 0  # the longest stretch of log steps between two improvements so far: the run's own pace
        self.slow: float | None = None  # the plateau rule's average of the loss ...
        self.span = 10.0  # ... over about this many log steps
        self.lowest = math.inf  # the lowest that average has been in the run (a new phase does not reset it)
        self.climb = False  # the average rises in a new phase (PLATEAU_JUMP): the reference follows it up
        # after a plateau alert, the average must fall below this to end that plateau: an improvement of
        # 3 x delta, not a dip of the noise (one plateau, one alert)
        self.rearm: float | None = None
        self.first: float | None = None  # the run's first loss: the untrained model's, the highest a run should see
        self.first_at = 0  # the step of that first loss (1: the untrained model's; later, with train.log_every > 1)
        self.blown = Streak(2)  # log steps in a row far above `first`
        self.nonpositive_at = -SPIKE_POSITIVE_STEPS  # the log-step count at the last loss <= 0

    def check(self, loss: float, step: int | None = None) -> list[Fired]:
        """`step`: the log step's (None: not known, taken for the n-th)."""
        if not math.isfinite(loss):
            return []
        self.n += 1
        if self.first is None:
            self.first, self.first_at = loss, step if step is not None else self.n
        if loss <= 0:
            self.nonpositive_at = self.n
        spike = self._spike(loss)
        out = [f for f in (spike, self._diverging(loss, spike is not None)) if f]
        # the plain mean of the first 10 losses, then an EMA: seeding an EMA with the first loss alone would
        # weigh that one batch at 73% three log steps later, and a noisy loss would "spike" against it. A spike
        # enters at the threshold it crossed: one bad batch must not lift the baseline the next one is judged by
        a, x = max(0.1, 1 / self.n), min(loss, spike.threshold) if spike else loss
        self.ema = x if self.ema is None else (1 - a) * self.ema + a * x
        if self.prev is not None and self.prev > 0 and loss > 0:
            # the step-to-step change in log space: the noise of the loss, free of its trend; capped so that a
            # spike (up and back down) widens it by little
            d = min(abs(math.log(loss / self.prev)), max(math.log(2.0), 3 * (self.noise or 0.0)))
            b = max(0.05, 1 / self.n)  # slower than the EMA: the threshold must not follow a few quiet steps
            self.noise = d if self.noise is None else (1 - b) * self.noise + b * d
            self.noise_run += (d - self.noise_run) / self.n
        self.prev = loss
        plateau = self._plateau(x)  # a spike enters at its threshold here too
        return out + [plateau] if plateau else out

    def _sigma(self) -> float:
        """The loss's noise in log space (the mean |difference| of two draws is 1.128 sigma); 0 before any."""
        return (self.noise or 0.0) / 1.128

    def _spike(self, loss: float) -> Fired | None:
        k = self.cfg.loss_spike_factor
        # from the 3rd log step: the first losses of a run fall fast and say nothing about spikes. A ratio to the
        # average means nothing for a loss that crosses zero (a log-likelihood, a GAN's): an average near 0 makes
        # any positive loss "many times" it, so the loss must have stayed positive for SPIKE_POSITIVE_STEPS
        if not (k and self.ema is not None and self.n > 2 and loss > 0 and self.ema > 0
                and self.n - self.nonpositive_at > SPIKE_POSITIVE_STEPS):
            return None
        # a noisy loss (small batches) crosses k x its average by chance: the point must also stand
        # SPIKE_SIGMAS of the loss's own noise above it, and SPIKE_EARLY x while that noise is a guess from a few
        factor = max(k, math.exp(SPIKE_SIGMAS * self._sigma()), SPIKE_EARLY if self.n <= SPIKE_NOISE_STEPS + 1 else 0)
        if loss > factor * self.ema:
            return Fired("loss_spike", loss, factor * self.ema,
                         f"loss {loss:.4g} is {loss / self.ema:.1f}x its running average {self.ema:.4g}: a bad batch "
                         "(check the data read at this step) or an LR too high here; keep train.grad_clip on, "
                         "lower train.lr")
        return None

    def _diverging(self, loss: float, spiked: bool) -> Fired | None:
        w = self.cfg.loss_diverging_window
        if not w:
            return None
        self.window.append(loss)
        blown = self._blown_up(loss, spiked) if self.n <= w else None
        return self._trend(w) or blown

    def _blown_up(self, loss: float, spiked: bool) -> Fired | None:
        """A loss DIVERGING_BLOWUP x the run's first one, 2 log steps in a row, within the first trend window: an LR
        far too high blows the loss up within a step or two and leaves it there, finite; the trend windows (and the
        spike rule, from the 3rd log step) would take that new level for the run's own. Later a jump that high is
        a loss_spike against the running average. Not for a loss that has crossed zero (a ratio to a
        first loss near 0 means nothing), nor for a spike (a batch or two of bad labels: loss_spike says it)."""
        positive = self.nonpositive_at < 1  # no loss <= 0 yet
        if not self.blown.update(positive and not spiked and self.first > 0 and loss > DIVERGING_BLOWUP * self.first):
            return None
        # in the trend's units (a relative rise, over loss_diverging_rise): one rule, one kind of record
        return Fired("loss_diverging", loss / self.first - 1, self.cfg.loss_diverging_rise,
                     f"loss {loss:.4g} is {loss / self.first:.3g}x the run's first loss {self.first:.4g}: training "
                     "blew up; lower train.lr or raise train.warmup_steps")

    def _trend(self, w: int) -> Fired | None:
        # the configured window, then 2x, 4x, 8x it: a rise of 1% a log step never rises 20% within 10 log
        # steps, yet it is 2x in 70; over the longer windows the rank order alone tells a trend from noise
        for scale in DIVERGING_SCALES:
            if len(self.window) < w * scale:
                break
            ys = list(self.window)[-w * scale:]
            start, end = _fit_ends(ys)
            rise = (end - start) / max(abs(start), 1e-12)
            ups = sum(b > a for a, b in zip(ys, ys[1:])) / (len(ys) - 1)
            # the losses must also rank in step order (whatever the curve's shape): a flat, noisy loss rises at
            # most steps of a window by chance often enough to be a steady false alarm. Over the shortest window
            # it also ranks in order by chance now and then, so there the rise must also be a clean trend (its
            # slope DIVERGING_T standard errors of the scatter around it); a real blow-up shows in the longer ones
            noisy = scale == 1 and _slope_t(ys) < DIVERGING_T
            floor = DIVERGING_FLOOR * abs(self.first or 0.0) * self.cfg.loss_diverging_rise
            if (rise > self.cfg.loss_diverging_rise and end - start > floor and (ups >= 0.7 or scale > 1)
                    and ys[-1] > ys[0] and not noisy and _rank_corr(ys) >= DIVERGING_RHO):
                return Fired("loss_diverging", rise, self.cfg.loss_diverging_rise,
                             f"loss rose from {ys[0]:.4g} to {ys[-1]:.4g} over the last {len(ys)} log steps "
                             f"(trend +{rise:.0%}); lower train.lr or raise train.warmup_steps")
        return None

    def skipped(self, k: int) -> None:
        """`k` log steps of a resumed run that its replay left out: they count in the run's age, not as a stall
        (their improvements went unseen)."""
        self.n, self.best_at = self.n + max(k, 0), self.best_at + max(k, 0)

    def _plateau(self, loss: float) -> Fired | None:
        # judged on an average: the best of single noisy losses is a lucky batch, one that a loss still falling
        # slowly does not beat again for long. It spans enough log steps that its noise is half of delta, up to
        # the run's pace or loss_plateau_window (at least 10; on an alerted plateau all of them: what ends it is
        # the loss training again, not a dip of the noise)
        delta = self.cfg.loss_plateau_delta
        pace = max(self.gap, self.cfg.loss_plateau_window) if self.rearm is None else math.inf
        self.span = max(10.0, min(pace, 2 * (self._sigma() / max(delta, 1e-6)) ** 2))
        a = max(1 / self.n, 1 / self.span)
        self.slow = avg = loss if self.slow is None else (1 - a) * self.slow + a * loss
        self.lowest = min(self.lowest, avg)
        # progress is measured from the average at the last progress (`ref`), not from the lowest since: a loss
        # falling 0.2% a log step would lower that by less than delta every time, and be called a plateau
        # an average far above the reference, beyond its noise, is a new phase (harder data, unfrozen layers, an
        # LR restart): the reference follows it up to its peak, and the loss falling from there is progress, not a
        # stall against the old best
        jumped = avg > self.ref + PLATEAU_JUMP * max(delta, self._sigma() / math.sqrt(19)) * abs(self.ref)
        self.climb = (jumped and self.n > self.span) or (self.climb and avg > self.ref - delta * abs(self.ref))
        if self.climb and avg > self.ref:
            self.ref = self.best = avg
            self.best_at, self.rearm = self.n, None
            return None
        if avg < self.ref - delta * abs(self.ref) or not math.isfinite(self.ref):
            if math.isfinite(self.ref):
                self.gap = max(self.gap, self.n - self.best_at)
            self.ref = self.best = avg
            self.best_at = self.n
            self.rearm = None if self.rearm is None or avg < self.rearm else self.rearm
            return None
        if self.n <= self.span:  # the average is still the plain mean of the first losses: the reference is not
            self.ref = max(self.ref, avg)  # the first one alone, a lucky batch that the trend would have to beat
        self.best = min(self.best, avg)
        stalled, w = self.n - self.best_at, self.cfg.loss_plateau_window
        # a healthy loss slows down as it goes (a power law improves by delta in a stretch that grows with the
        # run's age, ~10% of it at t^-0.1): a stall counts once it is PLATEAU_PACE x the longest stretch the run
        # took to improve before and PLATEAU_AGE of the run's age, so a loss that stops at once (stuck, dead)
        # early on is still seen after W log steps; and a loss noisier than delta (small batches) must stall as
        # long as its noise takes to average out to delta: before that a lucky batch sets the reference, and a
        # loss still falling slowly reads as stuck
        resolve = PLATEAU_NOISE * (self.noise_run / 1.128 / delta) ** 2 if delta else 0.0
        window = max(w, PLATEAU_PACE * self.gap, PLATEAU_AGE * self.n, resolve)
        if not w or self.rearm is not None or stalled < window:
            return None
        self.rearm = self.ref - 3 * delta * abs(self.ref)
        slowest = f"; it improved within {self.gap} log steps at its slowest before" if self.gap else ""
        return Fired("loss_plateau", stalled, window, f"no improvement of the loss by {delta:.1%} in {stalled} log "
                     f"steps (best running average {self.best:.4g}{slowest}): {self._plateau_cause()}")

    def _plateau_cause(self) -> str:
        """What a plateau says: a loss that never came down from the run's first one, the untrained model's (by
        PLATEAU_UNTRAINED) has not converged, nothing trained (an LR far too low, frozen weights); any other
        plateau is convergence or an LR that no longer fits. A first loss logged after step 1 (train.log_every > 1)
        may be a trained model's already: no verdict from it."""
        first = self.first
        if first is not None and first > 0 and self.first_at == 1 and self.lowest > (1 - PLATEAU_UNTRAINED) * first:
            return (f"the loss never came down from its first value {first:.4g}: a model trained from scratch is not "
                    "learning, the LR far too low (raise train.lr, check train.warmup_steps / train.schedule) or its "
                    "weights frozen (requires_grad off, a detached loss); a pretrained model may have started near "
                    "where it ends")
        return ("converged (stop, or save the compute), or the LR is too high or too low to go on; tune train.lr / "
                "train.schedule")


def _fit_ends(ys: list[float]) -> tuple[float, float]:
    """The least-squares line through (i, ys[i]): its values at the first and the last point."""
    n = len(ys)
    mx, my = (n - 1) / 2, sum(ys) / n
    slope = sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))
    return my - slope * mx, my + slope * mx


def _slope_t(ys: list[float]) -> float:
    """The t-statistic of the least-squares slope of ys against their order, on a linear or (positive losses) a
    log scale, whichever fits better: a rise that is a clean line on either (linear or exploding) is large."""
    scales = [ys] + ([[math.log(y) for y in ys]] if min(ys) > 0 else [])
    return max(_line_t(s) for s in scales)


def _line_t(ys: list[float]) -> float:
    n = len(ys)
    mx, my = (n - 1) / 2, sum(ys) / n
    sxx = sum((i - mx) ** 2 for i in range(n))
    slope = sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sxx
    scatter = sum((y - my - slope * (i - mx)) ** 2 for i, y in enumerate(ys)) / max(n - 2, 1)
    if scatter <= 1e-24 * max(my * my, 1e-300):  # on the line up to rounding
        return math.inf if slope > 0 else 0.0
    return slope / math.sqrt(scatter / sxx)


def _rank_corr(ys: list[float]) -> float:
    """Spearman's rank correlation of ys with their order: 1 when every value is above all before it. Equal
    values share their mean rank, so a flat stretch ranks in no order (0), not in step order."""
    n, order = len(ys), sorted(range(len(ys)), key=ys.__getitem__)
    rank = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and ys[order[j + 1]] == ys[order[i]]:
            j += 1
        for k in order[i:j + 1]:
            rank[k] = (i + j) / 2
        i = j + 1
    m = (n - 1) / 2
    cov = sum((r - m) * (k - m) for k, r in enumerate(rank))
    var = math.sqrt(sum((r - m) ** 2 for r in rank) * sum((k - m) ** 2 for k in range(n)))
    return cov / var if var else 0.0


class GradRules:
    """grad_exploding (gradient norms far above the recent ones) and grad_vanishing (the gradients all but
    gone while the loss has not come down: nothing trains), on the finite gradient norms of log steps."""

    def __init__(self):
        self.recent: deque[float] = deque(maxlen=20)
        self.first: list[tuple[float, float]] = []  # (grad norm, loss) of the first log steps: the baseline
        self.low = Streak(GRAD_VANISHING_STEPS)
        self.low_losses: deque[float] = deque(maxlen=GRAD_VANISHING_STEPS)  # the losses of the last log steps
        self.high_before = False  # the last log step's norm was above the factor (a second one fires)
        self.last = 0.0  # the last log step's norm

    def _base(self) -> float:
        return statistics.median(g for g, _ in self.first)

    def _factor(self) -> tuple[float, float] | None:
        """(factor, reference): GRAD_EXPLODING_FACTOR, or more where the recent norms scatter widely (small
        batches): GRAD_SIGMAS of their scatter in log space (1.4826 x the median absolute deviation); the
        reference is their median. Only the positive norms count: one exactly-zero norm (a batch whose loss
        ignores every weight) must not leave the rule blind for the next 20 log steps. None: fewer than 3."""
        positive = [g for g in self.recent if g > 0]
        if len(positive) < 3:
            return None
        logs = [math.log(g) for g in positive]
        mid = statistics.median(logs)
        sigma = 1.4826 * statistics.median(abs(x - mid) for x in logs)
        return max(GRAD_EXPLODING_FACTOR, math.exp(GRAD_SIGMAS * sigma)), statistics.median(positive)

    def check(self, norm: float, loss: float, loss_spiked: bool) -> list[Fired]:
        """`loss_spiked`: the loss rules called this log step's loss a spike, which explains its gradient."""
        out = []
        high = False
        if not loss_spiked and (got := self._factor()):
            factor, ref = got
            high = norm > factor * ref
            # a norm that grows a little every log step drags the median along and is never 10x it: against the
            # run's first readings it shows (GRAD_EXPLODING_RUN x them, 2 log steps in a row)
            grown = (len(self.first) == 5 and min(norm, self.last) > GRAD_EXPLODING_RUN * self._base()
                     and self._base() > 0)
            if (norm > max(GRAD_EXPLODING_ONCE, factor) * ref) or (high and self.high_before) or grown:
                against = (f"{norm / self._base():.0f}x its first readings ({self._base():.4g})" if grown else
                           f"{norm / ref:.0f}x the median {ref:.4g} of the last {len(self.recent)} log steps")
                out.append(Fired("grad_exploding", norm, factor * ref, f"gradient norm {norm:.4g} is {against}: the "
                                 "training is blowing up; keep train.grad_clip on, lower train.lr"))
        self.high_before, self.last = high, norm
        # an outlier enters at the threshold: one does not lift the median the next is judged by
        self.recent.append(min(norm, factor * ref) if high else norm)
        if len(self.first) < 5:
            self.first.append((norm, loss))
        base = self._base()
        base_loss = statistics.median(x for _, x in self.first)
        # a run that converges has small gradients at a small loss; one whose gradients die does not learn. A
        # norm at most GRAD_VANISHING_FLOOR is none, whatever the first ones were (dead from the start)
        low = max(GRAD_VANISHING_FLOOR, GRAD_VANISHING_RATIO * base if len(self.first) == 5 else 0.0)
        # the loss level is judged on the streak's median: one lucky batch of a noisy loss is no convergence. A
        # run that never had a gradient (its first norms none) never trained: its loss level says nothing
        self.low_losses.append(loss)
        stays = base <= GRAD_VANISHING_FLOOR or statistics.median(self.low_losses) > 0.8 * base_loss
        if self.low.update(norm <= low and stays and loss > 0):
            out.append(Fired("grad_vanishing", norm, low,
                             f"gradient norm {norm:.3g} is at most {low:.3g} (its first readings: {base:.3g}) for "
                             f"{GRAD_VANISHING_STEPS} log steps while the loss stays at {loss:.4g}: the model does "
                             "not learn (saturated or dead activations, a detached loss, an LR schedule at 0); check "
                             "the model's activations and loss wiring, raise train.lr"))
        return out


class Streak:
    """A condition that must hold for `n` log steps in a row; true while it goes on (the rate limit of
    alerts.py keeps that to one alert per monitor.alert_repeat_s)."""

    def __init__(self, n: int):
        self.n, self.count = n, 0

    def update(self, cond: bool) -> bool:
        self.count = self.count + 1 if cond else 0
        return self.count >= self.n


class Windows:
    """A reading of the last `n` log windows, judged together: their mean weighted by each window's share of
    the time is on the rule's side of its threshold, and stays there whichever one window is left out. A loader
    that stalls every other window waits most of the time yet never `n` windows in a row; one long window alone
    (an epoch boundary, a slow read, a checkpoint save) outweighs a few short ones and is no trend."""

    def __init__(self, n: int):
        self.items: deque[tuple[float, float]] = deque(maxlen=n)

    def update(self, value: float, weight: float, beyond: Callable[[float], bool]) -> float | None:
        """The weighted mean when the rule trips (true while it goes on, as a Streak), else None."""
        self.items.append((value, weight))
        if len(self.items) < (self.items.maxlen or 1):
            return None
        vw, w = sum(v * w for v, w in self.items), sum(w for _, w in self.items)
        without = [(vw - v * x) / (w - x) for v, x in self.items] if len(self.items) > 1 else []
        return vw / w if beyond(vw / w) and all(beyond(m) for m in without) else None


class RowRules:
    """throughput_drop, data_wait, GPU utilisation / temperature / memory and sync latency, on a metrics row."""

    def __init__(self, cfg: MonitorConfig):
        self.cfg, self.rates = cfg, []
        self.wait, self.util = Windows(cfg.data_wait_steps), Windows(cfg.gpu_util_low_steps)
        # a drop is more slow log windows in a row than the run's own dips that recovered: one slow window is a
        # one-off cost (the first step after an evaluation or a checkpoint save, a GC pause) that dominates a
        # window of a few short steps, and a dip that recurs (the eval or checkpoint cadence) is its rhythm
        self.slow_run, self.dip = 0, 1  # slow windows in a row now; the longest dip that recurred
        self.dips: set[int] = set()  # the lengths of the dips that recovered (<= THROUGHPUT_DIP_MAX)
        self.slow_steps, self.last_step = 0, None  # steps in the slow windows in a row; the last row's step
        self.slow_rates: list[float] = []  # the rates of the slow windows in a row not yet said (not in `rates`)
        self.peaks: deque[float] = deque(maxlen=MEM_GROWTH_WINDOW + 1)
        self.first_peak: float | None = None  # the baseline: the first peak of a window without warm-up

    def check(self, row: dict, warm: bool = True) -> list[Fired]:
        """`warm`: False for windows that hold warm-up (compile, worker start): their rates and waits are not
        judged, only remembered as part of the throughput history."""
        step, ms = row.get("step"), row.get("step_ms")
        span = step - self.last_step if None not in (step, self.last_step) else None
        self.last_step = step
        # a window's share of the time: its step time x its steps (1 each where the row does not say)
        weight = (ms if isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0 else 1.0) * max(span or 1, 1)
        wait = row.get("data_wait_pct")
        checks = (self._rate(row.get("samples_per_s"), warm, span, wait), self._wait(wait, warm, weight),
                  self._gpu(row, weight), self._sync(row.get("sync_ms")),
                  self._mem_growth(row.get("peak_mem_gib"), warm))
        return [f for group in checks for f in group]

    def _rate(self, rate: float | None, warm: bool, span: int | None, wait: float | None = None) -> list[Fired]:
        """`span`: the window's steps (None: not known, it does not hold the alert back); `wait`: its data wait %."""
        r = self.cfg.throughput_drop_ratio
        if rate is None:
            return []
        out, slow = [], False
        if r and warm and len(self.rates) >= 3:
            ref = statistics.median(self.rates)
            slow = rate < r * ref
            if not slow and 1 < self.slow_run <= THROUGHPUT_DIP_MAX:  # a dip ends: the 2nd of its length is rhythm
                self.dip = max(self.dip, self.slow_run) if self.slow_run in self.dips else self.dip
                self.dips.add(self.slow_run)
            self.slow_steps = self.slow_steps + (span or 0) if slow else 0
            self.slow_run = self.slow_run + 1 if slow else 0
            # windows of one or two short steps (train.log_every = 1) are slowed 2x by another process's burst on
            # the machine: a drop must also span THROUGHPUT_DROP_STEPS steps to be one
            if self.slow_run > self.dip and (span is None or self.slow_steps >= THROUGHPUT_DROP_STEPS):
                dips = f", longer than the run's recurring dips of {self.dip}" if self.dip > 1 else ""
                out.append(Fired("throughput_drop", rate, r * ref, f"throughput {rate:.4g} samples/s is "
                                 f"{rate / ref:.0%} of the median {ref:.4g} of the earlier log windows "
                                 f"({self.slow_run} log windows in a row{dips}): {_drop_cause(wait)}"))
        if warm:
            # the windows of a slow run are judged against the run before it, not against themselves: in the
            # median they would make a drop the norm before it spans THROUGHPUT_DROP_STEPS (a loader that slows
            # 10 log windows into a run was never said). They join once the run ends, or once it is said
            self.slow_rates.append(rate)
            if not slow or out:
                self.rates += self.slow_rates
                self.slow_rates.clear()
        return out

    def _wait(self, pct: float | None, warm: bool, weight: float) -> list[Fired]:
        x = self.cfg.data_wait_pct
        if pct is None or not warm or x >= 100 or not math.isfinite(pct):
            return []
        if (share := self.wait.update(pct, weight, lambda p: p > x)) is None:
            return []
        return [Fired("data_wait", share, x, f"{share:.0f}% of the step time of the last {self.cfg.data_wait_steps} "
                      f"log windows waits for data; raise data.num_workers / data.prefetch_factor")]

    def _gpu(self, row: dict, weight: float) -> list[Fired]:
        c, out = self.cfg, []
        util, temp, mem = row.get("gpu_util_pct"), row.get("gpu_temp_c"), row.get("gpu_mem_pct")
        low = c.gpu_util_low_pct
        if (util is not None and low and math.isfinite(util)
                and (mean := self.util.update(util, weight, lambda u: u < low)) is not None):
            out.append(Fired("gpu_util_low", mean, low, f"GPU utilisation {mean:.0f}% over the last "
                             f"{c.gpu_util_low_steps} log windows, below {low:.0f}%: the GPU is starved"))
        if temp is not None and c.gpu_temp_high_c and temp > c.gpu_temp_high_c:
            out.append(Fired("gpu_temp_high", temp, c.gpu_temp_high_c, f"GPU temperature {temp:.0f} °C above "
                             f"{c.gpu_temp_high_c:.0f} °C: check cooling, expect throttling"))
        if mem is not None and c.gpu_mem_high_pct and mem > c.gpu_mem_high_pct:
            out.append(Fired("gpu_mem_high", mem, c.gpu_mem_high_pct, f"device memory {mem:.1f}% in use, above "
                             f"{c.gpu_mem_high_pct:.0f}%: close to out of memory; lower data.batch_size (raise "
                             "train.grad_accum) or set memory.activation_checkpointing"))
        return out

    def _mem_growth(self, peak: float | None, warm: bool) -> list[Fired]:
        """A peak that keeps rising after warm-up: memory held on to every step (a list of losses kept as
        tensors, a cache without bound). One rise (the first evaluation, a checkpoint save) is not a trend."""
        x = self.cfg.mem_growth_pct
        if peak is None or not warm or not x or not math.isfinite(peak) or peak <= 0:
            return []
        self.first_peak = self.first_peak or peak
        self.peaks.append(peak)
        ys = list(self.peaks)
        rises = sum(b > a for a, b in zip(ys, ys[1:]))
        grown = 100 * (peak / self.first_peak - 1)
        if len(ys) <= MEM_GROWTH_WINDOW or rises < 0.7 * MEM_GROWTH_WINDOW or grown <= x:
            return []
        return [Fired("memory_growth", grown, x, f"peak memory rose at {rises} of the last {MEM_GROWTH_WINDOW} log "
                      f"steps, to {peak:.3g} GiB ({grown:.0f}% above {self.first_peak:.3g} GiB after warm-up): "
                      "something keeps tensors from every step (a loss kept without .item(), a growing cache); keep "
                      "floats (.item()) or .detach() and bound what you keep")]

    def _sync(self, ms: float | None) -> list[Fired]:
        x = self.cfg.sync_latency_ms
        if ms is not None and x and ms > x:
            return [Fired("sync_latency", ms, x, f"a small all-reduce took {ms:.1f} ms (> {x:.0f} ms): "
                          "the interconnect or a rank is slow; see rank_time_ratio / the straggler alert, "
                          "NCCL_DEBUG=INFO")]
        return []


def _drop_cause(wait: float | None) -> str:
    """What a throughput drop names as its cause: the loader when most of the slow window waited for data (a
    data source that slowed mid-run), else what slows the step itself."""
    if isinstance(wait, (int, float)) and math.isfinite(wait) and wait > 50:
        return (f"the data source slowed ({wait:.0f}% of the step time waits for data); check its storage or "
                "network, raise data.num_workers / data.prefetch_factor")
    return "another process on the machine, thermal throttling or a slower data source; see nvidia-smi / top"


def straggler(streak: dict[int, int], patience: int, ratio: float, rank_time_ratio: float,
              detail: str = "") -> tuple[int, Fired] | None:
    """(slow rank, alert) when StragglerWatch's streak of one slow rank just reached its patience (the
    verdict is StragglerWatch's: parallel.straggler_ratio over the others' median, for `patience` log steps)."""
    slow = next(iter(streak.items()), None)
    if slow is None or slow[1] != patience:
        return None
    detail = detail or f"{rank_time_ratio:.2f}x the fastest rank's own time per step (data wait + forward)"
    return slow[0], Fired("straggler", rank_time_ratio, ratio, f"straggler: rank {slow[0]} is persistently slower, "
                          f"{detail}: its host is loaded or its data is slower; check that node (top), raise "
                          "data.num_workers")
