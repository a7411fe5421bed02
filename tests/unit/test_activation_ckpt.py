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


def _layers():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(inplace=True), torch.nn.Conv2d(8, 4, 3),
                               torch.nn.ReLU(), torch.nn.Flatten())


def test_a_block_that_writes_its_input_in_place_runs_on_a_copy():
    # ReLU(inplace=True) as a block of its own would overwrite the input its recompute reads
    ref, model = _layers(), _layers()
    assert apply_activation_checkpointing(model, "full") == 5
    x = torch.randn(2, 3, 8, 8)
    ref(x).square().sum().backward()
    model(x).square().sum().backward()
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad)


def test_the_wrappers_follow_the_blocks_class_and_come_off():
    from turbotrain.accel.activation_ckpt import remove_activation_checkpointing

    class Doubled(torch.nn.Conv2d):
        def forward(self, x):
            return 2 * super().forward(x)

    model = _layers()
    apply_activation_checkpointing(model, "full")
    x = torch.randn(2, 3, 8, 8)
    plain = model(x)
    model[0].__class__ = Doubled  # a rewrite after the wrapping (kernels.convnet swaps classes): it runs
    assert not torch.equal(model(x), plain)
    model[0].__class__ = torch.nn.Conv2d
    remove_activation_checkpointing(model)
    assert not any("forward" in vars(m) for m in model.modules())
    assert torch.equal(model(x), plain)


def test_a_forward_of_the_blocks_own_is_kept_inside_the_wrapper_and_given_back():
    from turbotrain.accel.activation_ckpt import remove_activation_checkpointing

    model = _layers()
    x = torch.randn(2, 3, 8, 8)
    plain = model(x)
    own = model[2].forward = lambda t: 3 * torch.nn.Conv2d.forward(model[2], t)  # as a library's hook sets it
    hooked = model(x)
    assert not torch.equal(hooked, plain)
    apply_activation_checkpointing(model, "full")
    apply_activation_checkpointing(model, "full")  # a second run's wrapping: still one checkpoint, same forward
    assert torch.equal(model(x), hooked)
    remove_activation_checkpointing(model)
    assert vars(model[2])["forward"] is own and "forward" not in vars(model[0])
