"""Planted workloads for `profile`'s fourth pass (tests/faults/test_planted_s27_profile.py): a loader whose cost is
collating large items (each read is a view, each batch a copy of them all)."""
import torch
from torch import nn
from torch.utils.data import Dataset


class Rows(Dataset):
    """`n` items of shape `shape`, each a view into one tensor made up front: a read costs an index, nothing more;
    4 classes."""

    def __init__(self, n: int, shape: tuple[int, ...]):
        self.n, self.x = n, torch.randn(16, *shape, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.x[i % 16], i % 4


def big_items(split, n: int = 256, side: int = 256):
    """3 x side x side float images (768 KiB at 256): collating 64 of them copies 48 MiB a batch."""
    return Rows(n, (3, side, side))


class Corner(nn.Module):
    """Reads one pixel per channel of an image: forward costs next to nothing whatever the image's size."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        return self.fc(x[:, :, 0, 0])


def corner():
    return Corner()
