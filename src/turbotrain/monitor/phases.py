"""Named phases of a step (data, forward, backward, optimizer) as profiler ranges. Off unless
`turbotrain profile` turns them on, so the train step pays nothing for them otherwise."""
from __future__ import annotations

import contextlib

from torch.profiler import record_function

PREFIX = "turbotrain/"
_enabled = False


def enable(on: bool = True) -> None:
    global _enabled
    _enabled = on


def phase(name: str) -> contextlib.AbstractContextManager:
    return record_function(PREFIX + name) if _enabled else contextlib.nullcontext()
