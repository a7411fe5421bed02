"""Per-rank own time (data wait + forward, which hold no collective) and the straggler verdict.

Collectives make every rank's wall time per step the same, so the slow rank hides in the others'
waiting. What a rank spends on its own — waiting for its data and running its forward — does not.
"""
from __future__ import annotations

import statistics
import time

import torch

from turbotrain.distributed.env import all_gather_floats


class ForwardTimer:
    """Times forwards: CUDA events on a GPU (read at log steps, no sync per step), a host clock on CPU."""

    def __init__(self, device: torch.device, enabled: bool):
        self.cuda, self.enabled = device.type == "cuda", enabled
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.host_s = 0.0

    def start(self) -> None:
        if not self.enabled:
            return
        if self.cuda:
            self._ev = torch.cuda.Event(enable_timing=True)
            self._ev.record()
        else:
            self._t = time.perf_counter()

    def stop(self) -> None:
        if not self.enabled:
            return
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self._ev, end))
        else:
            self.host_s += time.perf_counter() - self._t

    def take(self) -> float:
        """Seconds timed since the last call (call after a device sync)."""
        total = self.host_s + sum(a.elapsed_time(b) for a, b in self.events) / 1e3
        self.events, self.host_s = [], 0.0
        return total


class StragglerWatch:
    def __init__(self, ratio: float, device: torch.device, rank: int, patience: int = 2, floor_s: float = 2e-3):
        self.ratio, self.device, self.rank, self.patience, self.floor_s = ratio, device, rank, patience, floor_s
        self.streak: dict[int, int] = {}
        self.detail = ""  # the slow rank's own time against the others', for the straggler alert's message

    def update(self, own_s_per_step: float, step: int) -> dict:
        """Gather every rank's own time per step; return row fields (the verdict: `streak`, `detail`)."""
        times = all_gather_floats(own_s_per_step, self.device)
        if len(times) < 2:
            return {}
        slowest = max(range(len(times)), key=times.__getitem__)
        others = statistics.median(t for i, t in enumerate(times) if i != slowest)
        slow = times[slowest] > self.ratio * others and times[slowest] - others > self.floor_s
        self.streak = {slowest: self.streak.get(slowest, 0) + 1} if slow else {}
        if slow:
            self.detail = (f"{times[slowest] * 1e3:.1f} ms/step of its own work (data wait + forward) vs "
                           f"{others * 1e3:.1f} ms on the other ranks")
        fastest = max(min(times), 1e-9)
        return {"rank_time_ratio": times[slowest] / fastest, "slowest_rank": slowest}
