"""Console messages from rank 0 only; `say_once` for warnings that must appear exactly once."""
from __future__ import annotations

import os
import sys

_said: set[str] = set()


def is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def say(msg: str) -> None:
    if is_rank0():
        print(f"[turbotrain] {msg}", file=sys.stdout, flush=True)


def say_once(msg: str) -> None:
    if msg not in _said:
        _said.add(msg)
        say(msg)
