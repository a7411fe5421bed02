"""Gradient accumulation: micro-batches with the loss divided by grad_accum equal one big batch."""
import pytest
import torch

from tests.helpers import losses, tiny_gpt
from turbotrain.models.gpt import build as build_gpt
from turbotrain.trainer import cross_entropy, train


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


def test_training_curve_equal_for_same_global_batch(tmp_path):
    train(tiny_gpt(tmp_path, "run.name=big", "data.batch_size=16", "train.grad_accum=1", "train.steps=6"))
    train(tiny_gpt(tmp_path, "run.name=accum", "data.batch_size=4", "train.grad_accum=4", "train.steps=6"))
    big, acc = losses(tmp_path, "big"), losses(tmp_path, "accum")
    assert len(big) == len(acc) == 6
    assert big == pytest.approx(acc, rel=1e-4)
    assert big[-1] < big[0]  # and it trains


def test_different_global_batch_differs(tmp_path):
    """Guard against a test that cannot fail: another global batch gives another curve."""
    train(tiny_gpt(tmp_path, "run.name=a", "data.batch_size=16", "train.steps=3"))
    train(tiny_gpt(tmp_path, "run.name=b", "data.batch_size=8", "train.steps=3"))
    assert losses(tmp_path, "a")[1:] != pytest.approx(losses(tmp_path, "b")[1:], rel=1e-4)
