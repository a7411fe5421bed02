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
    train(tiny_gpt(tmp_path, "run.name=off", "kernels.fused_loss=false", *common))  # the preset's "auto" is on
    train(tiny_gpt(tmp_path, "run.name=on", "kernels.fused_loss=true", *common))
    assert losses(tmp_path, "on") == pytest.approx(losses(tmp_path, "off"), rel=1e-5)
    assert _val_losses(tmp_path, "off") and _val_losses(tmp_path, "on") == pytest.approx(
        _val_losses(tmp_path, "off"), rel=1e-5)


def test_auto_leaves_a_loss_passed_in_code_alone_and_true_refuses_it(tmp_path):
    """The preset's "auto" turns the fused loss off for a loss function passed in code (which the fused op would
    silently replace): the run trains on that loss. An explicit true is refused with one error line."""
    from turbotrain.errors import UserError
    from turbotrain.losses import cross_entropy

    common = ("train.steps=3", "train.lr=0.01")
    train(tiny_gpt(tmp_path, "run.name=plain", "kernels.fused_loss=false", *common))
    train(tiny_gpt(tmp_path, "run.name=code", *common), loss_fn=lambda out, y: 2.0 * cross_entropy(out, y))
    assert losses(tmp_path, "code")[0] == pytest.approx(2.0 * losses(tmp_path, "plain")[0], rel=1e-5)
    with pytest.raises(UserError, match=r"^kernels.fused_loss = true replaces the loss .*kernels.fused_loss=false"):
        train(tiny_gpt(tmp_path, "run.name=explicit", "kernels.fused_loss=true", *common),
              loss_fn=lambda o, y: 0 * o.sum())
