"""Activation checkpointing changes backward FLOPs (recompute), not results."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from turbotrain.accel.activation_ckpt import apply_activation_checkpointing
from turbotrain.errors import UserError
from turbotrain.losses import cross_entropy
from turbotrain.models.gpt import build as build_gpt


def _run(mode):
    torch.manual_seed(0)
    model = build_gpt(vocab_size=64, block_size=16, n_layer=3, n_head=2, n_embd=32)
    assert apply_activation_checkpointing(model, mode) == (0 if mode == "none" else 3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)
    with FlopCounterMode(display=False) as counter:
        loss = cross_entropy(model(x), y)
        loss.backward()
    return loss.item(), [p.grad for p in model.parameters()], counter.get_total_flops(), model


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_same_loss_and_grads_more_flops(mode):
    loss0, grads0, flops0, _ = _run("none")
    loss1, grads1, flops1, model = _run(mode)
    assert loss1 == loss0
    for a, b in zip(grads0, grads1):
        torch.testing.assert_close(a, b)
    if mode == "full":
        assert flops1 > flops0  # matmuls recomputed in backward
    else:
        assert flops1 == flops0  # selective saves matmul outputs; only cheap pointwise ops are redone
    assert all(k.startswith(("wte", "wpe", "blocks", "lnf", "head")) for k in model.state_dict())


def test_selective_recomputes_less_than_full():
    assert _run("selective")[2] < _run("full")[2]


def test_model_without_blocks_is_refused():
    with pytest.raises(UserError, match="activation_checkpointing"):
        apply_activation_checkpointing(torch.nn.Linear(2, 2), "full")
