"""Hugging Face fixtures (need `transformers`): a factory returning an HF model, and dict-row datasets.

    tiny_gpt2(vocab_size=64, ...)    a user factory that returns a bare GPT2LMHeadModel (no turbotrain wrapper)
    dict_rows(split, ...)            HF-`datasets`-like rows of lists: {"input_ids", "labels", "attention_mask"},
                                     labels = input_ids (HF's causal-LM convention: the model shifts them)
    ambiguous_rows(split)            rows with both "input_ids" and "inputs": no single inputs key
"""
from __future__ import annotations

import torch
from torch.utils.data import Dataset


def tiny_gpt2(vocab_size: int = 64, n_layer: int = 2, n_embd: int = 32, n_head: int = 2, n_positions: int = 64):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=vocab_size, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=n_positions,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    return GPT2LMHeadModel(cfg)


class Rows(Dataset):
    def __init__(self, rows: list[dict], vocab_size: int):
        self.rows, self.vocab_size = rows, vocab_size

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


def dict_rows(split: str, size: int = 64, seq_len: int = 16, vocab_size: int = 64) -> Rows:
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    ids = torch.randint(0, vocab_size, (size, seq_len), generator=g)
    return Rows([{"input_ids": r.tolist(), "labels": r.tolist(), "attention_mask": [1] * seq_len} for r in ids],
                vocab_size)


def ambiguous_rows(split: str) -> Rows:
    return Rows([{"input_ids": [1, 2], "inputs": [1, 2], "labels": [2, 3]}] * 8, 8)
