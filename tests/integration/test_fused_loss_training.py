"""kernels.fused_loss through the trainer: the same loss curve and val loss as the unfused head + loss."""
import json

import pytest

from tests.helpers import losses, tiny_gpt
from turbotrain.trainer import train


def _val_losses(tmp_path, name):
    rows = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
    return [r["val_loss"] for r in rows if "val_loss" in r]


def test_fused_loss_trains_and_evaluates_like_the_unfused_loss(tmp_path):
    common = ("train.steps=5", "train.eval_every=5", "train.lr=0.01")
    train(tiny_gpt(tmp_path, "run.name=off", *common))
    train(tiny_gpt(tmp_path, "run.name=on", "kernels.fused_loss=true", *common))
    assert losses(tmp_path, "on") == pytest.approx(losses(tmp_path, "off"), rel=1e-5)
    assert _val_losses(tmp_path, "off") and _val_losses(tmp_path, "on") == pytest.approx(
        _val_losses(tmp_path, "off"), rel=1e-5)
