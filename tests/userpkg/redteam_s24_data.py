"""Data factories for tests/faults/test_redteam_s24_data.py.

    data.name = "userpkg.redteam_s24_data:<factory>", with userpkg.models:linear (dim 8) and loss "mse"
"""
from __future__ import annotations

import torch
from torch.utils.data import IterableDataset


class SizedStream(IterableDataset):
    """A stream that states its length (as webdataset's with_length, or a progress bar's wish, makes one)."""

    def __len__(self):
        return 64

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(64):
            yield torch.randn(8, generator=g), torch.randn((), generator=g)


def sized_stream(split: str) -> SizedStream:
    return SizedStream()
