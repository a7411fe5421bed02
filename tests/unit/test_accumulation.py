"""Gradient accumulation: micro-batches with the loss divided by grad_accum equal one big batch."""
import torch

from turbotrain.losses import cross_entropy
from turbotrain.models.gpt import build as build_gpt


def test_accumulated_gradients_equal_big_batch():
    torch.manual_seed(0)
    model = build_gpt(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    x, y = torch.randint(0, 64, (8, 16)), torch.randint(0, 64, (8, 16))
    cross_entropy(model(x), y).backward()
    big = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for xs, ys in zip(x.split(2), y.split(2)):
        (cross_entropy(model(xs), ys) / 4).backward()
    for g_big, p in zip(big, model.parameters()):
        torch.testing.assert_close(p.grad, g_big, rtol=1e-5, atol=1e-6)
