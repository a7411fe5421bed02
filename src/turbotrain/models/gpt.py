"""A GPT decoder (GPT-2 shapes): pre-LN blocks, fused QKV, SDPA (flash) attention, tied head."""
from __future__ import annotations

import math

import torch
from torch import nn

from turbotrain.contract import bool_arg, float_arg, int_arg
from turbotrain.errors import UserError
from turbotrain.models import init
from turbotrain.models.gelu_epilogue import gelu_mlp
from turbotrain.models.packed_attention import qkv_attention


class Block(nn.Module):
    calls_qkv_attention = True  # kernels.packed_attention applies (models/packed_attention.py)
    calls_gelu_mlp = ("fc", "out")  # kernels.gelu_epilogue applies to these linears (models/gelu_epilogue.py)

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.ln1 = nn.LayerNorm(n_embd, bias=bias)
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.ln2 = nn.LayerNorm(n_embd, bias=bias)
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.out = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()  # p=0 still costs a kernel in training

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = qkv_attention(self.qkv(self.ln1(x)), self.n_head, self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(y))
        return x + self.drop(gelu_mlp(self.ln2(x), self.fc, self.out))


class GPT(nn.Module):
    """Maps token ids (B, T) to logits (B, T, vocab)."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, bias: bool = True, tie_weights: bool = True):
        super().__init__()
        if n_embd % n_head:
            raise UserError(f"model.args.n_embd = {n_embd}: must be divisible by model.args.n_head = {n_head}")
        self.vocab_size, self.block_size, self.n_layer, self.n_embd = vocab_size, block_size, n_layer, n_embd
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.lnf = nn.LayerNorm(n_embd, bias=bias)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.wte.weight
        self.init_weights(seed=0)  # the run's seed is applied again by prepare (distributed/meta_init.py)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """GPT-2's initialisation, each parameter from its own generator seeded by (seed, name)
        (models/init.py): N(0, 0.02) matrices and embeddings, residual projections scaled by depth, LayerNorm
        weights 1, biases 0. The same values on the meta path (sharded, after to_empty) as at full size."""
        for name, p in self.named_parameters():  # a tied head is wte.weight: named once
            if name.endswith("bias"):
                init.constant_(p, 0.0)
            elif ".ln" in name or name.startswith("ln"):
                init.constant_(p, 1.0)
            else:
                deep = name.endswith(("proj.weight", "out.weight"))
                init.normal_(p, seed, name, std=0.02 / math.sqrt(2 * self.n_layer) if deep else 0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(idx))

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The final-normed hidden states (B, T, D) that the head maps to logits (kernels.fused_loss uses them)."""
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lnf(x)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, the PaLM/nanoGPT formula: 6·N (N without position embeddings)
        for the matmuls forward+backward, plus 12·L·D·T for attention scores and values."""
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6 * n + 12 * self.n_layer * self.n_embd * seq_len


def estimate_params(vocab_size: int, block_size: int, n_layer: int, n_embd: int, tie_weights: bool, **_) -> int:
    """`build(...)`'s parameter count, biases and norms left out: checked against host memory before building."""
    return vocab_size * n_embd * (1 if tie_weights else 2) + block_size * n_embd + n_layer * 12 * n_embd ** 2


def build(vocab_size: int = 50304, block_size: int = 1024, n_layer: int = 12, n_head: int = 12,
          n_embd: int = 768, dropout: float = 0.0, bias: bool = True, tie_weights: bool = True) -> GPT:
    for key, value in (("vocab_size", vocab_size), ("block_size", block_size), ("n_layer", n_layer),
                       ("n_head", n_head), ("n_embd", n_embd)):
        int_arg(f"model.args.{key}", value, 1)
    float_arg("model.args.dropout", dropout, 0.0, 1.0, hi_open=True)
    bool_arg("model.args.bias", bias)
    bool_arg("model.args.tie_weights", tie_weights)
    return GPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout, bias, tie_weights)
