"""User code of tests/faults/test_redteam_s23_cache.py: a model module that changes the working directory as it is
imported (to $RT_S23_CHDIR), as some scripts do at their top."""
import os

from torch import nn

os.chdir(os.environ["RT_S23_CHDIR"])


def linear(dim: int = 8) -> nn.Module:
    return nn.Linear(dim, 1)
