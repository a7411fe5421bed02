"""kernels.fused_loss through the trainer: the same loss curve and val loss as the unfused head + loss."""
import json
import re

import pytest
import torch

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


def _seeded(kind: str) -> "_Lm":
    torch.manual_seed(0)
    return _Lm(kind)


class _Lm(torch.nn.Module):
    """A user's LM whose names look like the fused-loss protocol; `kind` says how it breaks it."""

    def __init__(self, kind: str, vocab: int = 64, width: int = 16):
        super().__init__()
        self.kind, self.emb = kind, torch.nn.Embedding(vocab, width)
        self.narrow = torch.nn.Linear(width, 8)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def hidden(self, idx):
        if self.kind == "narrow":  # not the head's input width
            return self.narrow(self.emb(idx))
        if self.kind == "needs_mask":  # another signature
            raise TypeError("hidden() missing 1 required positional argument: 'mask'")
        return self.emb(idx)

    def forward(self, idx):
        h = self.emb(idx)
        return self.head(torch.relu(h) if self.kind == "relu" else h)  # "relu": forward is not head(hidden)


@pytest.mark.parametrize("kind, said", [("narrow", "needs `hidden(inputs)` to give the head's input"),
                                        ("needs_mask", "which failed on the first item (TypeError"),
                                        ("relu", "which differ for the model passed to train() on the first item")])
def test_names_that_do_not_hold_up_leave_auto_off_and_refuse_true(tmp_path, kind, said):
    """hidden + a bias-free head by name is not the protocol: the first item shows whether head(hidden(x)) is the
    model's forward. "auto" trains the user's model as written (the same curve as off); true is one error line."""
    from turbotrain.errors import UserError

    common = ("train.steps=3", "train.lr=0.01", "train.eval_every=0")
    train(tiny_gpt(tmp_path, "run.name=off", "kernels.fused_loss=false", *common), model=_seeded(kind))
    summary = train(tiny_gpt(tmp_path, "run.name=auto", *common), model=_seeded(kind))
    assert losses(tmp_path, "auto") == losses(tmp_path, "off")
    assert "fused_loss = false" in (tmp_path / "auto" / "config.toml").read_text(), summary
    with pytest.raises(UserError, match=rf"^kernels.fused_loss = true .*{re.escape(said)}.*kernels.fused_loss=false"):
        train(tiny_gpt(tmp_path, "run.name=on", "kernels.fused_loss=true", *common), model=_Lm(kind))


def test_a_model_that_keeps_the_protocol_gets_the_fused_loss_from_auto(tmp_path):
    train(tiny_gpt(tmp_path, "run.name=auto", "train.steps=2"), model=_Lm("good"))
    assert "fused_loss = true" in (tmp_path / "auto" / "config.toml").read_text()
