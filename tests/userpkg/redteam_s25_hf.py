"""HF red-team fixtures (session 25): user factories returning tiny HF models built from configs (no
download) and HF-style dict rows, as a user switching from HF Trainer writes them."""
from __future__ import annotations

import torch
from userpkg.hf_models import Rows

TINY_BERT = dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def bert_classifier(num_labels: int = 3, frozen: str = "", half: bool = False, layers: int = 1):
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(**{**TINY_BERT, "num_hidden_layers": layers}, num_labels=num_labels)
    model = BertForSequenceClassification(cfg)
    for name, p in model.named_parameters():
        if frozen and name.startswith(frozen):
            p.requires_grad_(False)
    return model.half() if half else model


def gpt2_lm(checkpointing: bool = False):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_layer=1, n_embd=16, n_head=2, n_positions=32,
                                       bos_token_id=None, eos_token_id=None))
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model


def labelled_rows(split: str, size: int = 8, seq_len: int = 10, pad: int = 0, side: str = "right",
                  extra: bool = True) -> Rows:
    """Sentence classification rows as a tokenizer with padding="max_length" leaves them."""
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    rows = []
    for i in range(size):
        n = 3 + i % (seq_len - 3)
        ids = torch.randint(1, 50, (n,), generator=g).tolist()
        fill = [pad] * (seq_len - n)
        row = {"input_ids": ids + fill if side == "right" else fill + ids, "label": i % 3}
        if extra:
            row["attention_mask"] = [1] * n + [0] * len(fill) if side == "right" else [0] * len(fill) + [1] * n
            row["token_type_ids"] = [0] * seq_len
        rows.append(row)
    return Rows(rows, 50)


def pt_rows(split: str) -> Rows:
    """Rows tokenized one by one with return_tensors="pt": input_ids of shape (1, T)."""
    return Rows([{"input_ids": torch.randint(1, 50, (1, 8)), "label": i % 3} for i in range(8)], 50)


def gpt2_cls(vocab_size: int = 50):
    """A decoder classifier as a user builds one from GPT2Config's defaults (bos/eos 50256, no pad id)."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    cfg = GPT2Config(vocab_size=vocab_size, n_layer=1, n_embd=16, n_head=2, n_positions=32, num_labels=3)
    return GPT2ForSequenceClassification(cfg)
