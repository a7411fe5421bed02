"""Planted faults for the sixth distributed red-team wave: user code that fails on one rank only.

    RaisesOnRank1    a callback whose on_step_end raises on rank 1 at step 2
"""
from __future__ import annotations

import os


class RaisesOnRank1:
    def on_step_end(self, state):
        if os.environ.get("RANK") == "1" and state.step == 2:
            raise ValueError("planted callback fault on rank 1")


class TermRank1AtStep3:
    """Sends SIGTERM to rank 1's own process at step 3 (a signal that reaches one rank: a node's scheduler, a
    user's kill): every rank must stop, at one step."""

    def on_step_end(self, state):
        import os
        import signal

        if state.step == 3 and os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGTERM)
