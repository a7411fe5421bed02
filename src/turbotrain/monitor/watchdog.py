"""The hung-step watchdog: a thread that fails the run when no step completes for `timeout_s`.

The loop only stores a host clock reading per step (`beat`, no device work). When the beats stop, the
watchdog hands every thread's stack to `on_hang` — which raises the `hung_step` alert and ends the process:
a rank stuck in a blocking read or a collective cannot be unwound from another thread, and torchrun only
tears a job down once one of its ranks exits.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Callable

FIRST_STEP_FACTOR = 5  # the first step compiles and starts the data workers: it gets 5x the timeout
HUNG_EXIT_CODE = 1  # "anything else" (DESIGN: 0 done, 2 user error, 1 anything else)


def thread_stacks() -> str:
    """Every thread's Python stack, the main thread first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sorted(sys._current_frames().items(), key=lambda kv: kv[0] != threading.main_thread().ident)
    parts = []
    for ident, frame in frames:
        if ident == threading.get_ident():
            continue  # the watchdog itself
        parts.append(f"Thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame)).rstrip())
    return "\n\n".join(parts)


# where a stuck main thread waits, by the frames of its stack: torch's DataLoader (a worker's queue too) or
# turbotrain's read of the dataset means the next batch never came; anything else (the model, the loss, backward,
# an optimizer, a collective, and the loader's copy of a batch to the device, which blocks when the GPU's queue
# is full behind a hung step) is the step itself
_DATA_FILES = ("/torch/utils/data/",)
_DATA_READS = (("/turbotrain/data/loader.py", "_read"),)


def stuck_in() -> str:
    """What the main thread is stuck in, from its stack: "data" (waiting for a batch: the dataset's read, a
    loader worker) or "step" (the forward, backward or optimizer step, a collective); "" when it is gone."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return ""
    where = [(f.f_code.co_filename.replace("\\", "/"), f.f_code.co_name) for f, _ in traceback.walk_stack(frame)]
    reading = any(d in name for name, _ in where for d in _DATA_FILES) or \
        any(name.endswith(file) and fn == read for name, fn in where for file, read in _DATA_READS)
    return "data" if reading else "step"


def hang_cause(where: str) -> str:
    """The cause and fix a hung_step alert names for `where` (stuck_in)."""
    if where == "data":
        return ("stuck waiting for the next batch: a read of the dataset never returned (a stuck network "
                "filesystem, a dead data server, a loader worker deadlocked); check the storage the data reads "
                "from (the stack below shows the read; with data.num_workers > 0 it is in a worker: set 0 to see it)")
    return ("stuck in the training step (the model's forward or backward, the optimizer, or a collective waiting "
            "for a rank that is gone); the stack below shows where; if a step really takes this long, raise "
            "monitor.hang_timeout_s")


def end_children() -> None:
    """Kill this process's own child processes (DataLoader workers) before a hung run ends: a worker stuck in a
    read of the user's dataset never gets back to its check that the parent is alive, and would be left running
    (holding its memory and files) long after the run is gone."""
    import multiprocessing

    for child in multiprocessing.active_children():
        with contextlib.suppress(Exception):  # one that just ended, or is not ours to signal: the rest still go
            child.kill()


class Watchdog:
    """Usage: `w = Watchdog(30, on_hang); ...; w.beat(step)` after each step; `w.stop()` at the end.
    `on_hang(seconds_since_last_step, last_step, stacks)` runs once, on the watchdog's thread."""

    def __init__(self, timeout_s: float, on_hang: Callable[[float, int, str], None], start_step: int = 0,
                 clock: Callable[[], float] = time.monotonic):
        self.timeout_s, self.on_hang, self.clock = timeout_s, on_hang, clock
        self.last_t, self.last_step, self.first = clock(), start_step, True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="turbotrain-watchdog", daemon=True)
        self._thread.start()

    def beat(self, step: int) -> None:
        """A step completed (or a long non-step phase — eval, a save — ended): host values only."""
        self.last_t, self.last_step, self.first = self.clock(), step, False

    def overdue(self) -> float | None:
        """Seconds since the last beat when past the deadline, else None."""
        since = self.clock() - self.last_t
        limit = self.timeout_s * (FIRST_STEP_FACTOR if self.first else 1)
        return since if since > limit else None

    def _watch(self) -> None:
        tick = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(tick):
            since = self.overdue()
            if since is not None:
                try:
                    self.on_hang(since, self.last_step, thread_stacks())
                except BaseException:  # the handler failed: the run is still stuck, and must still end
                    print(f"{traceback.format_exc()}[turbotrain] hung after step {self.last_step} (nothing "
                          f"completed for {since:.1f} s); ending the run", file=sys.stderr, flush=True)
                    end_children()
                    os._exit(HUNG_EXIT_CODE)
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)


@contextlib.contextmanager
def watching(timeout_s: float, what: str) -> Iterator[None]:
    """The watchdog over a phase before the loop's (the first reads of the user's data, before any step): past
    FIRST_STEP_FACTOR x `timeout_s` (0: off), every thread's stack and one closing line naming `what` hung, then
    the process ends — a read blocked in the user's code cannot be unwound from here."""
    if not timeout_s:
        yield
        return

    def hung(since: float, _step: int, stacks: str) -> None:
        print(f"{stacks}\n[turbotrain] hung: {what} took over {since:.1f} s (monitor.hang_timeout_s = {timeout_s:g}, "
              f"x{FIRST_STEP_FACTOR} before the first step); every thread's stack is above", file=sys.stderr,
              flush=True)
        end_children()
        os._exit(HUNG_EXIT_CODE)

    dog = Watchdog(timeout_s, hung)
    try:
        yield
    finally:
        dog.stop()
