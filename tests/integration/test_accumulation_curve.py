"""Gradient accumulation over whole runs: micro-batches x grad_accum train the same curve as one big batch
(the single-step gradient equality is tests/unit/test_accumulation.py)."""
import pytest

from tests.helpers import losses, tiny_gpt
from turbotrain.trainer import train


def test_training_curve_equal_for_same_global_batch(tmp_path):
    lr = ["train.lr=1e-2", "train.warmup_steps=0", "data.args.size=16"]  # one batch seen 6 times: it must learn it
    train(tiny_gpt(tmp_path, "run.name=big", "data.batch_size=16", "train.grad_accum=1", "train.steps=6", *lr))
    train(tiny_gpt(tmp_path, "run.name=accum", "data.batch_size=4", "train.grad_accum=4", "train.steps=6", *lr))
    big, acc = losses(tmp_path, "big"), losses(tmp_path, "accum")
    assert len(big) == len(acc) == 6
    assert big == pytest.approx(acc, rel=1e-4)
    assert big[-1] < big[0]  # and it trains


def test_different_global_batch_differs(tmp_path):
    """Guard against a test that cannot fail: another global batch gives another curve."""
    train(tiny_gpt(tmp_path, "run.name=a", "data.batch_size=16", "train.steps=3"))
    train(tiny_gpt(tmp_path, "run.name=b", "data.batch_size=8", "train.steps=3"))
    assert losses(tmp_path, "a")[1:] != pytest.approx(losses(tmp_path, "b")[1:], rel=1e-4)
