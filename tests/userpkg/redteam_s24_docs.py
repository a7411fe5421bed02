"""User code of tests/faults/test_redteam_s24_docs.py (red team, session 24: the first hour, switching from
HF Accelerate / Lightning Fabric / the HF Trainer)."""
from __future__ import annotations

import logging

import torch
from torch import nn


def noisy_factory():
    """What importing transformers' model classes does inside a factory on a machine where torchao's native
    kernels cannot load: warnings on the torchao and torch pytree loggers (stderr, around the error line)."""
    logging.getLogger("torchao").warning("Failed to load torchao/_C_mxfp8.so: Could not load this library")
    logging.getLogger("torch.utils._pytree").warning("<enum 'KernelPreference'> is an Enum subclass ...")
    return nn.Linear(4, 2)


def same_tokens(split: str, n: int = 16, seq_len: int = 12, vocab_size: int = 64):
    """(ids, ids): HF's causal-LM labels = input_ids, as (inputs, targets) pairs."""
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    ids = torch.randint(0, vocab_size, (n, seq_len), generator=g)
    return torch.utils.data.TensorDataset(ids, ids.clone())


class HFStyleForward(nn.Module):
    """A hand-written model in HF's style: forward(input_ids, attention_mask=None, labels=None)."""

    def __init__(self, vocab_size: int = 64):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab_size, 16), nn.Linear(16, vocab_size)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.emb(input_ids))
        if attention_mask is not None:
            logits = logits * attention_mask.clamp(max=1).unsqueeze(-1).float()
        if labels is None:
            return logits
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def shifted_tokens(split: str, n: int = 16, seq_len: int = 12, vocab_size: int = 64):
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    ids = torch.randint(1, vocab_size, (n, seq_len + 1), generator=g)
    return torch.utils.data.TensorDataset(ids[:, :-1].contiguous(), ids[:, 1:].contiguous())
