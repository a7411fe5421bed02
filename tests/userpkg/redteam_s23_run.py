"""User code for tests/faults/test_redteam_s23_run.py: callbacks that poison the weights, send the process a
signal at awkward moments, or stall a step (a hung data read stands for it)."""
from __future__ import annotations

import os
import signal
import time

import torch

from turbotrain.callbacks import Callback


class NanThenTerm(Callback):
    """At step 3 the weights turn NaN (a diverged step) and a SIGTERM arrives (the scheduler's pre-emption)."""

    def on_step_end(self, state):
        if state.step == 3:
            with torch.no_grad():
                for p in state.model.parameters():
                    p.fill_(float("nan"))
            os.kill(os.getpid(), signal.SIGTERM)


class CtrlCTwiceThenStall(Callback):
    """Step 2 stalls (a hung read, say): the user presses Ctrl-C, then again; the stall ends by itself after a
    while, so that without a second-signal exit the run still ends (saved, 130) instead of hanging the test."""

    def on_step_end(self, state):
        if state.step == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100):
                time.sleep(0.01)


class TermAtLastStep(Callback):
    """A SIGTERM (the scheduler's time limit) lands during the run's last step."""

    def on_step_end(self, state):
        if state.step == state.total_steps:
            os.kill(os.getpid(), signal.SIGTERM)


class MisspeltHook(Callback):
    """on_epoch_end is no hook of turbotrain's (another framework's name): it would never be called."""

    def __init__(self):
        self.logged = 0

    def on_log(self, state):
        self.logged += 1

    def on_epoch_end(self, state):
        raise AssertionError("never called")


class ReturnsFromEvalEnd(Callback):
    """Returns metrics from on_eval_end, as if it were on_log: they were dropped without a word."""

    def on_eval_end(self, state):
        return {"my_val": 1.0}
