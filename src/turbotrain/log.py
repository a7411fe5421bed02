"""Console messages from rank 0 only; `say_once` for warnings that must appear exactly once."""
from __future__ import annotations

import os
import sys

_said: set[str] = set()


def is_rank0() -> bool:
    """RANK as torchrun sets it; one that is not an integer is refused where the run starts (distributed.env)
    with one error line, so a message said before that (a data fetch, `turbotrain config`) must not fail on it."""
    try:
        return int(os.environ.get("RANK", "0")) == 0
    except ValueError:
        return True


def say(msg: str) -> None:
    if is_rank0():
        console(f"[turbotrain] {msg}")


def console(line: str) -> None:
    """One line to stdout. A reader that went away (`turbotrain train ... | head`) ends the output, not the run:
    its checkpoints and final model are still written, and the rest of the output goes to os.devnull."""
    try:
        print(line, file=sys.stdout, flush=True)
    except BrokenPipeError:
        stdout_to_devnull()
    except UnicodeEncodeError:  # a stdout that cannot spell `→` or a name's "é" (PYTHONIOENCODING=ascii)
        enc = sys.stdout.encoding
        console(line.encode(enc, "backslashreplace").decode(enc))


def stdout_to_devnull() -> None:
    """Send the rest of stdout to os.devnull (its reader gone, its disk full): the interpreter's last flush must
    not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # a stream without a descriptor (in-process capture), or none
        sys.stdout = open(os.devnull, "w")


def new_run() -> None:
    """Once is once per run: a second `train()` in one process (a notebook's) meets the same problem anew."""
    _said.clear()


def say_once(msg: str) -> None:
    if msg not in _said:
        _said.add(msg)
        say(msg)


class Heartbeat:
    """Says what a long phase is doing every `every` seconds until it ends, so no phase is silent.
    `status` (optional) adds a live detail, e.g. a child run's step and ETA.
    Usage: `with Heartbeat("compile: compiling the model in the first step"): step()`."""

    def __init__(self, what: str, every: float = 10.0, status=None):
        import threading

        self.what, self.every, self.status = what, every, status
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        import time

        t0 = time.perf_counter()
        while not self._done.wait(self.every):
            detail = self.status() if self.status else ""
            say(f"{self.what} … {time.perf_counter() - t0:.0f} s" + (f" ({detail})" if detail else ""))

    def __enter__(self) -> "Heartbeat":
        if is_rank0():
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


def run_progress(run_dir, total_steps: int):
    """A `status` for Heartbeat: the child run's last logged step and ETA, read from its metrics.jsonl."""
    import json
    import time
    from pathlib import Path

    path, t0 = Path(run_dir) / "metrics.jsonl", time.perf_counter()

    def status() -> str:
        try:
            lines = path.read_text().splitlines()
            step = json.loads(lines[-1])["step"] if lines else 0
        except (OSError, ValueError, KeyError, IndexError):
            return "starting"
        if step < 2:
            return f"step {step}/{total_steps}"
        left = (time.perf_counter() - t0) / step * (total_steps - step)
        return f"step {step}/{total_steps}, ETA {left:.0f} s"
    return status
