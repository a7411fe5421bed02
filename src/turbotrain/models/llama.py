"""A Llama-3-style decoder: RMSNorm, rotary position embeddings, SwiGLU MLP, grouped-query attention through
SDPA (flash on GPUs), no biases, optionally tied embeddings. Llama-3.2-1B shapes are the `llama-1b` preset."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from turbotrain.contract import bool_arg, float_arg, int_arg
from turbotrain.errors import UserError
from turbotrain.models import init


def llama3_ffn_hidden(n_embd: int, multiple_of: int, ffn_dim_multiplier: float) -> int:
    """Llama-3's MLP width: 2/3 of 4·D (SwiGLU has three matrices where GELU has two, so the same parameter
    count), scaled by ffn_dim_multiplier, rounded up to a multiple of `multiple_of` (tensor-core friendly)."""
    hidden = int(ffn_dim_multiplier * int(2 * 4 * n_embd / 3))
    return multiple_of * math.ceil(hidden / multiple_of)


def rope_tables(head_dim: int, block_size: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position·frequency, shape (block_size, head_dim/2), in fp32 (angles up to block_size
    radians lose their fraction in bf16)."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float64), freqs)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (x[i], x[i + d/2]) pair of x (B, H, T, d) by its position's angles; the product of a
    rotated query and key then depends on their positions only through the difference. Computed in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, n_kv_head: int):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, n_embd // n_head
        self.wq = nn.Linear(n_embd, n_head * self.head_dim, bias=False)
        self.wk = nn.Linear(n_embd, n_kv_head * self.head_dim, bias=False)
        self.wv = nn.Linear(n_embd, n_kv_head * self.head_dim, bias=False)
        self.wo = nn.Linear(n_head * self.head_dim, n_embd, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # enable_gqa (torch >= 2.5): the kernel reads each k/v head for its group of query heads, so the
        # n_head/n_kv_head-times larger repeated k/v never exists in memory.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_head != self.n_head)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, n_embd: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(n_embd, hidden, bias=False)  # gate
        self.w3 = nn.Linear(n_embd, hidden, bias=False)  # up
        self.w2 = nn.Linear(hidden, n_embd, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, n_kv_head: int, ffn_hidden: int, norm_eps: float):
        super().__init__()
        self.attn_norm = nn.RMSNorm(n_embd, eps=norm_eps)
        self.attn = Attention(n_embd, n_head, n_kv_head)
        self.mlp_norm = nn.RMSNorm(n_embd, eps=norm_eps)
        self.mlp = SwiGLU(n_embd, ffn_hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Maps token ids (B, T) to logits (B, T, vocab). `hidden(idx)` gives the final-normed states that
    `head` maps to logits, for losses that fuse the head with the cross-entropy."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_kv_head: int, n_embd: int,
                 ffn_hidden: int, rope_theta: float = 500000.0, norm_eps: float = 1e-5, tie_weights: bool = True):
        super().__init__()
        self.vocab_size, self.block_size, self.n_layer, self.n_embd = vocab_size, block_size, n_layer, n_embd
        self.tie_weights = tie_weights
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, n_kv_head, ffn_hidden, norm_eps) for _ in range(n_layer))
        self.norm = nn.RMSNorm(n_embd, eps=norm_eps)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok_emb.weight
        # Derived from the config, not learned: non-persistent, so checkpoints hold only parameters and one
        # copy serves every block (passed in, not registered per block).
        cos, sin = rope_tables(n_embd // n_head, block_size, rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights(seed=0)  # the run's seed is applied again by prepare (distributed/meta_init.py)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """N(0, 0.02) matrices and embedding, RMSNorm weights 1, each parameter drawn from (seed, its name)
        (models/init.py: a meta build, materialised and sharded, starts from the full-size build's weights)."""
        for name, p in self.named_parameters():  # a tied head is tok_emb.weight: named once
            if "norm" in name:
                init.constant_(p, 1.0)
                continue
            # Each block adds two outputs (attention, MLP) to the residual stream, so at init its variance grows
            # with 2·n_layer terms; scaling the projections that write into it by 1/sqrt(2·n_layer) keeps the
            # stream's scale independent of depth (GPT-2's rule).
            deep = name.endswith(("attn.wo.weight", "mlp.w2.weight"))
            init.normal_(p, seed, name, std=0.02 / math.sqrt(2 * self.n_layer) if deep else 0.02)

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states (B, T, n_embd): `forward(idx) == head(hidden(idx))`."""
        t = idx.shape[1]
        if t > self.block_size:
            raise UserError(f"model.args.block_size = {self.block_size}: the input has {t} tokens a row; "
                            f"raise block_size to at least {t}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.tok_emb(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(idx))

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, the PaLM/nanoGPT formula: 6·N for the matmuls forward+backward, plus
        12·L·D·T for attention scores and values (query heads count: GQA shares k/v, not the products).
        N leaves out an untied embedding table (a lookup, not a matmul); a tied one counts once, as the head."""
        n = sum(p.numel() for p in self.parameters())
        if not self.tie_weights:
            n -= self.tok_emb.weight.numel()
        return 6 * n + 12 * self.n_layer * self.n_embd * seq_len


def estimate_params(vocab_size: int, block_size: int, n_layer: int, n_head: int, n_kv_head: int, n_embd: int,
                    ffn_hidden: int, multiple_of: int, ffn_dim_multiplier: float, tie_weights: bool, **_) -> int:
    """`build(...)`'s parameter count (norms left out) plus its RoPE tables, in fp32 numbers: checked against
    host memory before building."""
    head, ffn = n_embd // n_head, ffn_hidden or llama3_ffn_hidden(n_embd, multiple_of, ffn_dim_multiplier)
    layer = n_embd * (2 * n_embd + 2 * n_kv_head * head) + 3 * n_embd * ffn
    return vocab_size * n_embd * (1 if tie_weights else 2) + n_layer * layer + block_size * head


def build(vocab_size: int = 128256, block_size: int = 2048, n_layer: int = 16, n_head: int = 32, n_kv_head: int = 8,
          n_embd: int = 2048, ffn_hidden: int = 0, multiple_of: int = 256, ffn_dim_multiplier: float = 1.5,
          rope_theta: float = 500000.0, norm_eps: float = 1e-5, tie_weights: bool = True) -> Llama:
    """Defaults: Llama-3.2-1B. ffn_hidden = 0 derives the MLP width by Llama-3's rule from n_embd, multiple_of
    and ffn_dim_multiplier (8192 for the defaults); a positive value is used as it is."""
    for key, value in (("vocab_size", vocab_size), ("block_size", block_size), ("n_layer", n_layer),
                       ("n_head", n_head), ("n_kv_head", n_kv_head), ("n_embd", n_embd), ("multiple_of", multiple_of)):
        int_arg(f"model.args.{key}", value, 1)
    int_arg("model.args.ffn_hidden", ffn_hidden, 0)
    float_arg("model.args.ffn_dim_multiplier", ffn_dim_multiplier, 0.0, lo_open=True)
    float_arg("model.args.rope_theta", rope_theta, 1.0, lo_open=True)
    float_arg("model.args.norm_eps", norm_eps, 0.0, 1.0, lo_open=True)
    bool_arg("model.args.tie_weights", tie_weights)
    if n_embd % n_head:
        raise UserError(f"model.args.n_embd = {n_embd}: must be divisible by model.args.n_head = {n_head}")
    if (n_embd // n_head) % 2:
        raise UserError(f"model.args.n_embd = {n_embd}: the head size n_embd / n_head = {n_embd // n_head} must "
                        f"be even (rotary embeddings rotate pairs)")
    if n_head % n_kv_head:
        raise UserError(f"model.args.n_kv_head = {n_kv_head}: must divide model.args.n_head = {n_head} "
                        f"(each key/value head serves a group of query heads)")
    hidden = ffn_hidden or llama3_ffn_hidden(n_embd, multiple_of, ffn_dim_multiplier)
    return Llama(vocab_size, block_size, n_layer, n_head, n_kv_head, n_embd, hidden, rope_theta, norm_eps,
                 tie_weights)
