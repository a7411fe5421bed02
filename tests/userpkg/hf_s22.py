"""HF red-team fixtures (session 22): HF-convention rows padded to one length (labels -100 at the padding,
attention_mask 0), as a tokenizer with padding="max_length" and a causal-LM collator leave them."""
from __future__ import annotations

import torch
from userpkg.hf_models import Rows


def padded_rows(split: str, size: int = 16, seq_len: int = 12, vocab_size: int = 50) -> Rows:
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    rows = []
    for i in range(size):
        n = 4 + i % (seq_len - 4)
        ids = torch.randint(1, vocab_size, (n,), generator=g).tolist()
        pad = seq_len - n
        rows.append({"input_ids": ids + [0] * pad, "attention_mask": [1] * n + [0] * pad, "labels": ids + [-100] * pad})
    return Rows(rows, vocab_size)
