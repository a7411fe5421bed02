"""Alerts at log steps: non-finite loss (stops the run), loss spikes and throughput drops (warnings)."""
from __future__ import annotations

import math
import statistics

from turbotrain.errors import UserError
from turbotrain.log import say


class NonFiniteLoss(UserError):
    """The loss stayed NaN/inf for train.max_bad_steps steps in a row."""


class Alerts:
    def __init__(self, max_bad_steps: int, spike_factor: float = 2.0, drop_factor: float = 0.7):
        self.max_bad, self.spike, self.drop = max_bad_steps, spike_factor, drop_factor
        self.ema, self.rates = None, []

    def check_loss(self, loss: float, step: int, bad_streak: float, final: bool) -> None:
        """Raise NonFiniteLoss when the loss stays non-finite; warn on a spike over its running average.
        `bad_streak`: the non-finite steps in a row up to this one, counted on the device every step (the
        loss is only read at log steps), averaged over ranks so that every rank decides alike."""
        if not math.isfinite(loss):
            streak = max(1, math.ceil(bad_streak))
            if streak >= self.max_bad or final:
                raise NonFiniteLoss(f"loss is {loss} (NaN/inf) at step {step}, non-finite for {streak} "
                                    f"step(s); lower train.lr, keep train.grad_clip on, or use precision.dtype=bf16")
            return
        if self.ema is not None and loss > self.spike * self.ema:
            say(f"warning: loss spike at step {step}: {loss:.4f} vs running average {self.ema:.4f}")
        self.ema = loss if self.ema is None else 0.9 * self.ema + 0.1 * loss

    def check_rate(self, rate: float, step: int) -> None:
        if len(self.rates) >= 3:
            ref = statistics.median(self.rates)
            if rate < self.drop * ref:
                say(f"warning: throughput drop at step {step}: {rate:.1f} samples/s vs median {ref:.1f}")
        self.rates.append(rate)
