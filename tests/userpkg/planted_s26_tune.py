"""Planted workloads for `turbotrain tune`, wave 9 (tests/faults/test_planted_s26_tune.py, and by hand).

    noted(dim=8, note="", table=None)   userpkg.models:linear that also takes a free-text `note` and a nested
                                        `table` of settings (it checks nothing about them): a config's odd
                                        model.args values must reach tuned.toml and read back the same
"""
from __future__ import annotations

from torch import nn
from userpkg.models import Linear


def noted(dim: int = 8, note: str = "", table: dict | None = None) -> nn.Module:
    model = Linear(dim)
    model.note, model.table = note, table  # kept so a test can see what the config gave
    return model

