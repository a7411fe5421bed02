"""Alerts at log steps: the rules of rules.py turned into alert records, rate-limited per rule and sent to
the sinks (console, alerts.jsonl, webhook, Prometheus counters). A non-finite loss still stops the run.

An alert record (one alerts.jsonl line, the webhook's JSON body):
    {"time": unix seconds, "step", "rank", "rule", "value", "threshold", "message"}
"""
from __future__ import annotations

import math
import time
from typing import Callable

from turbotrain.errors import UserError
from turbotrain.monitor import sinks
from turbotrain.monitor.rules import Fired, GradRules, LossRules, MonitorConfig, RowRules

REPLAY_ROWS = 1000  # Alerts.resume: the first and the last rows of a run that the rules see again


class NonFiniteLoss(UserError):
    """The loss stayed NaN/inf for train.max_bad_steps steps in a row; `first`: the step it went non-finite at."""

    def __init__(self, msg: str, first: int | None = None):
        super().__init__(msg)
        self.first = first


def _finite_or_none(x) -> float | None:
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


class Alerts:
    """Usage: `Alerts(max_bad_steps, cfg, rank=r, jsonl=JsonlFile(...), webhook=..., prometheus=...)`; the
    monitor calls `check_loss` / `check_rate` / `check_row` at log steps and `emit` for its own rules.
    `is_main`: rules on values every rank shares (the loss, the straggler verdict) are sent by rank 0 only;
    a rank's own readings (GPU, data wait, sync latency, a hang) are sent by that rank."""

    SHARED = ("loss_nonfinite", "grad_nonfinite", "loss_spike", "loss_diverging", "loss_plateau", "throughput_drop",
              "straggler", "memory_growth",  # the peak memory of a row is averaged over ranks
              "grad_exploding", "grad_vanishing")  # the gradients are all-reduced: one norm on every rank

    def __init__(self, max_bad_steps: int, cfg: MonitorConfig | None = None, *, rank: int = 0,
                 jsonl: sinks.JsonlFile | None = None, webhook: sinks.Webhook | None = None,
                 prometheus: sinks.Prometheus | None = None, clock: Callable[[], float] = time.time):
        self.cfg = cfg or MonitorConfig()
        self.max_bad, self.rank, self.clock = max_bad_steps, rank, clock
        self.jsonl, self.webhook, self.prometheus = jsonl, webhook, prometheus
        self.loss_rules, self.row_rules, self.grad_rules = LossRules(self.cfg), RowRules(self.cfg), GradRules()
        self.loss_spiked = False  # the last finite loss was a loss_spike (its gradient is no news)
        # the log step the gradient norm went NaN/inf at while the loss was finite (None: finite since): the loss
        # goes NaN a step later, over NaN weights, and its stop must name that cause, not the LR
        self.grad_bad_at: int | None = None
        self.last_sent: dict[str, float] = {}
        self.held: dict[str, int] = {}  # repeats not sent since the last alert of the rule
        self.counts: dict[str, int] = {}  # every firing, sent or held

    def check_loss(self, loss: float, step: int, bad_streak: float, final: bool, nan_data: str | None = None,
                   nan_at: int | None = None) -> None:
        """Raise NonFiniteLoss when the loss stays non-finite; run the loss rules on a finite one.
        `bad_streak`: the non-finite steps in a row up to this one, counted on the device every step (the
        loss is only read at log steps), averaged over ranks so that every rank decides alike. `nan_data`: the
        part of the batch that holds NaN/inf ("inputs", "targets"), None when it is clean or not known; `nan_at`:
        the step that batch was read at (None: this one)."""
        if not math.isfinite(loss):
            streak = max(1, math.ceil(bad_streak))
            # the step it went non-finite at: what broke it (a batch, an LR step) was there, not at this log step
            since = f" (since step {step - streak + 1})" if streak > 1 else ""
            which = ("this step's batch" if nan_at in (None, step) else
                     f"the batch of step {nan_at} (where it went non-finite, carried on by NaN weights)")
            msg = f"loss is {loss} (NaN/inf) at step {step}, non-finite for {streak} step(s){since}; " + (
                f"{which} holds NaN/inf in its {nan_data}: the data gives non-finite values; clean the data "
                "(or drop such samples in the dataset)" if nan_data else
                "lower train.lr, keep train.grad_clip on, or use precision.dtype=bf16" if self.grad_bad_at is None else
                f"the gradient norm went NaN/inf first, at step {self.grad_bad_at}, while the loss was finite: an op "
                "with a NaN gradient (a sqrt/log/division at 0 in a branch torch.where leaves out) corrupted the "
                "weights; find it with torch.autograd.set_detect_anomaly(True)")
            if streak >= self.max_bad or final:
                # the stop is always sent, however recent the last non-finite alert
                self.emit(Fired("loss_nonfinite", streak, self.max_bad, msg), step, console=False, repeat=True)
                raise NonFiniteLoss(msg, step - streak + 1)
            # below the stop: still said (rate-limited), or a run with NaN steps in it would look clean
            self.emit(Fired("loss_nonfinite", streak, self.max_bad,
                            f"{msg} (the run stops at {self.max_bad} in a row: train.max_bad_steps)"), step)
            return
        fired = self.loss_rules.check(loss, step)
        self.loss_spiked = any(f.rule == "loss_spike" for f in fired)
        for f in fired:
            self.emit(f, step)

    def check_grad(self, grad_norm: float | None, step: int, loss: float | None = None) -> None:
        """grad_nonfinite: the gradients' norm is NaN/inf at a log step while the loss is finite (a NaN there
        reaches the weights, and a loss may stay finite over NaN weights). Not for fp16's loss scaling, whose
        overflowing steps are skipped by design: the caller passes None then. On a finite norm, with the log
        step's `loss`: grad_exploding and grad_vanishing (rules.GradRules)."""
        if grad_norm is not None and not math.isfinite(grad_norm):
            self.grad_bad_at = step if self.grad_bad_at is None else self.grad_bad_at
            self.emit(Fired("grad_nonfinite", grad_norm, math.inf,
                            f"gradient norm is {grad_norm} at step {step} while the loss is finite: NaN/inf "
                            "gradients corrupt the weights; keep train.grad_clip on, lower train.lr, or find the op "
                            "with a NaN gradient (torch.autograd.set_detect_anomaly)"), step)
        elif grad_norm is not None and loss is not None and math.isfinite(loss):
            self.grad_bad_at = None
            for f in self.grad_rules.check(grad_norm, loss, self.loss_spiked):
                self.emit(f, step)

    def check_rate(self, rate: float, step: int) -> None:
        """throughput_drop alone (the other row rules need the whole row: `check_row`)."""
        self.check_row({"samples_per_s": rate}, step)

    def check_row(self, row: dict, step: int, warm: bool = True) -> None:
        for f in self.row_rules.check(row, warm):
            self.emit(f, step)

    def resume(self, rows: list[dict], sent: list[dict], grads: bool = True) -> None:
        """A resumed run: the loss and gradient rules see the rows logged up to the checkpoint again, quietly, so
        their baselines, windows and streaks are the run's (a dead gradient's first readings, the first loss), not
        the restart's; a rule this rank sent (`sent`: alerts.jsonl's records, of any attempt) waits out
        monitor.alert_repeat_s from then, as it would have in one process. `grads`: False with fp16's loss
        scaling (its gradient norms are not judged). The row rules start afresh: throughput, memory and data
        wait are readings of the process, and it is a new one. Of a long run only the first rows (the baselines)
        and the last REPLAY_ROWS (every window the rules keep) are replayed: a resume must not take minutes."""
        head, tail = rows[:REPLAY_ROWS], rows[max(REPLAY_ROWS, len(rows) - REPLAY_ROWS):]
        self._replay(head, grads)
        self.loss_rules.skipped(len(rows) - len(head) - len(tail))  # the plateau rule's pace counts them
        self._replay(tail, grads)
        now = self.clock()
        for a in sent:
            t, rule = _finite_or_none(a.get("time")), a.get("rule")
            if a.get("rank") == self.rank and isinstance(rule, str) and t is not None and t <= now:
                self.last_sent[rule] = max(t, self.last_sent.get(rule, t))

    def _replay(self, rows: list[dict], grads: bool) -> None:
        for row in rows:
            loss, norm = _finite_or_none(row.get("loss")), _finite_or_none(row.get("grad_norm"))
            if loss is None:
                continue
            step = row.get("step")
            step = step if isinstance(step, int) and not isinstance(step, bool) else None
            spiked = any(f.rule == "loss_spike" for f in self.loss_rules.check(loss, step))
            if grads and norm is not None:
                self.grad_rules.check(norm, loss, spiked)

    def emit(self, fired: Fired, step: int, console: bool = True, repeat: bool = False,
             rank: int | None = None) -> dict | None:
        """Send one alert to the sinks, unless the rule already sent one within monitor.alert_repeat_s
        (`repeat=True` sends regardless). `rank`: the rank it is about, when not this one (a straggler).
        Returns the record sent, or None when held back or not this rank's to send."""
        if fired.rule in self.SHARED and self.rank != 0:
            return None
        self.counts[fired.rule] = self.counts.get(fired.rule, 0) + 1
        if self.prometheus is not None:
            self.prometheus.count(fired.rule)
        now, last = self.clock(), self.last_sent.get(fired.rule)
        if not repeat and last is not None and now - last < self.cfg.alert_repeat_s:
            self.held[fired.rule] = self.held.get(fired.rule, 0) + 1
            return None
        self.last_sent[fired.rule] = now
        held = self.held.pop(fired.rule, 0)
        message = fired.message + (f" ({held} more since the last {fired.rule} alert)" if held else "")
        record = {"time": now, "step": step, "rank": self.rank if rank is None else rank, "rule": fired.rule,
                  "value": _finite_or_none(fired.value), "threshold": _finite_or_none(fired.threshold),
                  "message": message}
        if console:
            sinks.console(record)
        if self.jsonl is not None:
            self.jsonl.write(record)
        if self.webhook is not None:
            self.webhook.send(record)
        return record

    def close(self, wait_s: float = 0.0) -> None:
        """Let the webhook drain (at most `wait_s`), then close the files."""
        if self.webhook is not None:
            self.webhook.close(wait_s)
        if self.jsonl is not None:
            self.jsonl.close()
