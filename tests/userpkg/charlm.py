"""A tiny character-level language model on an inline, deterministically generated text.

    data.name  = "userpkg.charlm:dataset"   dataset(split, block_size=32) -> Dataset of (x, y) LongTensor
                                            windows, y = x shifted by one character
    model.name = "userpkg.charlm:build"     build(vocab_size=VOCAB_SIZE, n_embd=32) -> nn.Module whose
                                            forward(x (B, T)) returns logits (B, T, vocab_size)
"""
from __future__ import annotations

import random

import torch
from torch import nn
from torch.utils.data import Dataset

PANGRAMS = (
    "the quick brown fox jumps over the lazy dog.",
    "pack my box with five dozen liquor jugs.",
    "how vexingly quick daft zebras jump!",
    "sphinx of black quartz, judge my vow.",
    "the five boxing wizards jump quickly.",
)


def make_text(n_chars: int = 6000, seed: int = 1234) -> str:
    """Pangrams in a seeded pseudo-random order, one per line, until n_chars: same text every time."""
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    while total < n_chars:
        line = rng.choice(PANGRAMS) + "\n"
        parts.append(line)
        total += len(line)
    return "".join(parts)[:n_chars]


TEXT = make_text()
CHARS = sorted(set("".join(PANGRAMS) + "\n"))
STOI = {c: i for i, c in enumerate(CHARS)}
VOCAB_SIZE = len(CHARS)


def encode(s: str) -> torch.Tensor:
    return torch.tensor([STOI[c] for c in s], dtype=torch.long)


class CharWindows(Dataset):
    """Every window of block_size + 1 characters of this split, as (x, y) with y = x shifted by one."""

    def __init__(self, tokens: torch.Tensor, block_size: int):
        if len(tokens) <= block_size:
            raise ValueError(f"text of {len(tokens)} chars is too short for block_size {block_size}")
        self.tokens, self.block_size = tokens, block_size
        self.vocab_size = VOCAB_SIZE  # turbotrain may read this; the config also states it

    def __len__(self) -> int:
        return len(self.tokens) - self.block_size

    def __getitem__(self, i: int):
        chunk = self.tokens[i:i + self.block_size + 1]
        return chunk[:-1].clone(), chunk[1:].clone()


def dataset(split: str, block_size: int = 32) -> CharWindows:
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    tokens = encode(TEXT)
    cut = int(len(tokens) * 0.9)
    return CharWindows(tokens[:cut] if split == "train" else tokens[cut:], block_size)


class CharGRU(nn.Module):
    def __init__(self, vocab_size: int, n_embd: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, n_embd)
        self.rnn = nn.GRU(n_embd, n_embd, batch_first=True)
        self.head = nn.Linear(n_embd, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        h, _ = self.rnn(self.embed(x))
        return self.head(h)


def build(vocab_size: int = VOCAB_SIZE, n_embd: int = 32) -> CharGRU:
    return CharGRU(vocab_size, n_embd)
