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


# a range inside the forward phase, not a phase (not under PREFIX): forward's ops outside it are the loss's
MODEL = "turbotrain.model"


@contextlib.contextmanager
def model_range(module):
    """While open, each call of `module` is a profiler range named MODEL (hooks, removed after); None: nothing."""
    if module is None:
        yield
        return
    stack = []

    def enter(m, args):
        stack.append(record_function(MODEL))
        stack[-1].__enter__()

    def leave(m, args, out):
        if stack:
            stack.pop().__exit__(None, None, None)

    handles = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
