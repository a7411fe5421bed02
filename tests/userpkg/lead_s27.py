"""User code for tests/faults/test_lead_s27.py: tracker factories that get their contract wrong."""
from __future__ import annotations


class NoArgs:
    """A tracker class whose __init__ takes none of (run_dir, start_step)."""

    def __init__(self):
        self.rows = []

    def log(self, row):
        self.rows.append(row)

    def close(self):
        pass


def raising(run_dir, start_step):
    raise RuntimeError("tracker service unreachable")


from userpkg.data import regression  # noqa: E402
from userpkg.regression import Regression  # noqa: E402


class Corrupt(Regression):
    """Reads fine but for its last record, which raises as a corrupt shard would."""

    def __getitem__(self, i: int):
        if self.broken and i == len(self) - 1:
            raise ValueError("record 4 is corrupt")
        return super().__getitem__(i)


class Ragged(Regression):
    """The last item's inputs one wider than the rest: collating them fails, not reading them."""

    def __getitem__(self, i: int):
        x, y = super().__getitem__(i)
        return (x.repeat(2)[: len(x) + 1], y) if self.broken and i == len(self) - 1 else (x, y)


def corrupt(split: str, n: int = 64, dim: int = 8):
    return _broken(Corrupt, split, n, dim)


def ragged(split: str, n: int = 64, dim: int = 8):
    return _broken(Ragged, split, n, dim)


def _broken(cls, split, n, dim):
    ds = regression(split, n, dim)
    out = cls(ds.x, ds.y)
    out.broken = split == "train"
    return out
