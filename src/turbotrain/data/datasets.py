"""Built-in datasets. Each is a data factory `build(split, **args) -> Dataset` of `(inputs, targets)`,
the same contract as a user's `pkg.module:factory`.

The built-ins are in-memory `TensorDataset`s that gather a whole batch from an index tensor in one op
(`gather`). That lets the loader skip per-item Python and, on a GPU, keep the whole dataset in device
memory (`data.device_resident`), so feeding a step costs one index op and no host→device copy.
"""
from __future__ import annotations

import json

import numpy as np
import torch
from torch.utils.data import Dataset

from turbotrain.data.fetch import fetch, read_idx
from turbotrain.errors import UserError


class TensorDataset(Dataset):
    """Samples stored as tensors; `gather(idx)` returns a batch, `to(device)` moves the storage."""

    def __len__(self) -> int:
        raise NotImplementedError

    def gather(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def to(self, device: torch.device) -> "TensorDataset":
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        raise NotImplementedError

    def __getitem__(self, i: int):
        x, y = self.gather(torch.tensor([i]))
        return x[0], y[0]

    def __getitems__(self, indices: list[int]):  # the DataLoader's batched fetch: one gather per batch
        return self.gather(torch.as_tensor(indices))


class Pairs(TensorDataset):
    """Inputs and targets indexed together (images/vectors with labels or regression targets)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, **meta):
        self.inputs, self.targets, self.meta = inputs, targets, meta
        for k, v in meta.items():
            setattr(self, k, v)

    def __len__(self) -> int:
        return len(self.inputs)

    def gather(self, idx):
        idx = idx.to(self.inputs.device)
        return self.inputs[idx], self.targets[idx]

    def to(self, device):
        return Pairs(self.inputs.to(device), self.targets.to(device), **self.meta)

    @property
    def nbytes(self):
        return self.inputs.nbytes + self.targets.nbytes


class TokenWindows(TensorDataset):
    """Next-token prediction over a token stream: sample i is the window starting at i·stride,
    inputs tokens[s : s+T], targets tokens[s+1 : s+T+1]."""

    def __init__(self, tokens: torch.Tensor, block_size: int, stride: int | None = None, vocab_size: int = 256):
        if len(tokens) <= block_size + 1:
            raise UserError(f"data: {len(tokens)} tokens are too few for block_size {block_size}")
        self.tokens, self.block_size, self.vocab_size = tokens, block_size, vocab_size
        self.stride = stride or block_size
        self._offsets = torch.arange(block_size + 1, device=tokens.device)

    def __len__(self) -> int:
        return (len(self.tokens) - self.block_size - 1) // self.stride + 1

    def gather(self, idx):
        idx = idx.to(self.tokens.device)
        win = self.tokens[(idx * self.stride)[:, None] + self._offsets].long()
        return win[:, :-1], win[:, 1:]

    def to(self, device):
        return TokenWindows(self.tokens.to(device), self.block_size, self.stride, self.vocab_size)

    @property
    def nbytes(self):
        return self.tokens.nbytes


def shakespeare(split: str, block_size: int = 256, tokens: str = "char", val_fraction: float = 0.1,
                stride: int | None = None) -> TokenWindows:
    """Shakespeare's works as char- (vocab of the characters present) or byte-level (vocab 256) tokens,
    memory-mapped uint8; the last `val_fraction` of the text is the validation split."""
    if tokens not in ("char", "byte"):
        raise UserError(f"data.args.tokens = {tokens!r}: expected 'char' or 'byte'")
    root = fetch("shakespeare")
    bin_path = root / f"{tokens}.bin"
    meta_path = root / f"{tokens}.json"
    if not bin_path.exists():  # tokenize once; later runs memory-map the file
        text = (root / "shakespeare.txt").read_bytes()
        if tokens == "char":
            vocab = sorted(set(text))
            table = np.zeros(256, dtype=np.uint8)
            table[vocab] = np.arange(len(vocab), dtype=np.uint8)
            ids = table[np.frombuffer(text, dtype=np.uint8)]
        else:
            vocab, ids = list(range(256)), np.frombuffer(text, dtype=np.uint8)
        tmp = bin_path.with_suffix(".tmp")
        ids.tofile(tmp)
        tmp.replace(bin_path)
        meta_path.write_text(json.dumps({"vocab": [chr(c) for c in vocab], "tokens": int(len(ids))}))
    vocab_size = len(json.loads(meta_path.read_text())["vocab"])
    data = np.memmap(bin_path, dtype=np.uint8, mode="r")
    cut = int(len(data) * (1 - val_fraction))
    part = data[:cut] if split == "train" else data[cut:]
    return TokenWindows(torch.from_numpy(np.array(part)), block_size, stride, vocab_size)


FASHION_MEAN, FASHION_STD = 0.2860, 0.3530


def fashion_mnist(split: str) -> Pairs:
    """Fashion-MNIST, normalized float images (N, 1, 28, 28) and int64 labels; split "val" is the test set."""
    root = fetch("fashion_mnist")
    prefix = "train" if split == "train" else "t10k"
    images = torch.from_numpy(read_idx(root / f"{prefix}-images-idx3-ubyte.gz").copy())
    labels = torch.from_numpy(read_idx(root / f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64))
    x = (images.float().div_(255).sub_(FASHION_MEAN).div_(FASHION_STD)).unsqueeze(1)
    return Pairs(x, labels, num_classes=10, in_channels=1)


def synthetic(split: str, kind: str = "tokens", size: int = 1024, seq_len: int = 1024, vocab_size: int = 50304,
              shape: tuple | list = (3, 224, 224), num_classes: int = 1000, in_features: int = 1024,
              seed: int = 1234) -> TensorDataset:
    """Random data for throughput work (reports mark it synthetic): `size` distinct samples of
    tokens (LM windows), images (C, H, W) with labels, or vectors with labels."""
    g = torch.Generator().manual_seed(seed + (0 if split == "train" else 1))
    if kind == "tokens":
        toks = torch.randint(0, vocab_size, (size * seq_len + 1,), generator=g, dtype=torch.int32)
        return TokenWindows(toks, seq_len, seq_len, vocab_size)
    if kind == "images":
        x = torch.randn((size, *shape), generator=g)
        return Pairs(x, torch.randint(0, num_classes, (size,), generator=g), num_classes=num_classes,
                     in_channels=shape[0])
    if kind == "vectors":
        x = torch.randn((size, in_features), generator=g)
        return Pairs(x, torch.randint(0, num_classes, (size,), generator=g), num_classes=num_classes,
                     in_features=in_features)
    raise UserError(f"data.args.kind = {kind!r}: expected 'tokens', 'images' or 'vectors'")


BUILTIN = {"shakespeare": shakespeare, "fashion_mnist": fashion_mnist, "synthetic": synthetic}
