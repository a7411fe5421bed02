"""User code for tests/faults/test_redteam_s27_faults.py: models whose eval-mode forward runs out of host memory for
real (an allocation no machine can give), as a model whose evaluation holds more than its training steps does."""
from __future__ import annotations

import numpy as np
import torch
from userpkg.models import Linear


class EvalOutOfMemory(Linear):
    """Trains as userpkg.models:linear; in eval mode it asks for an impossible buffer: through numpy (a
    MemoryError) or torch's host allocator (a RuntimeError saying "can't allocate memory")."""

    def __init__(self, dim: int = 8, via: str = "numpy"):
        super().__init__(dim)
        self.via = via

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            if self.via == "numpy":
                np.empty(2**62, dtype=np.uint8)
            else:
                torch.empty(2**60, dtype=torch.uint8)
        return super().forward(x)


class BadSampleAt:
    """userpkg.data:regression whose item `bad` cannot be read (a corrupt record), the rest as usual."""

    def __init__(self, bad: int, n: int = 64, dim: int = 8):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = self.x @ torch.randn(dim, generator=torch.Generator().manual_seed(7))
        self.bad = bad

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"record {i} is corrupt")
        return self.x[i], self.y[i]
