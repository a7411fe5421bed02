"""precision.weight_copies on a CPU: bf16 copies of the linears' weights, written by TritonAdamW (its kernels
emulated in torch, tests/unit/test_triton_adamw.py), against autocast's casts of the float32 weights. The facts that
must hold: the same forward and gradients (bit for bit under eager autocast, and under compile), the same weights
after steps with a clip, copies that follow any change of their weights (a load, an in-place edit), no gradient lost
when a weight is also read directly, and the model handed back as it was."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.unit.test_triton_adamw import _step, emulated  # noqa: F401  (the fixture)
from turbotrain.accel import optim as topt
from turbotrain.accel import triton_adamw as ta
from turbotrain.accel import weight_copies as wc
from turbotrain.errors import UserError


class Net(nn.Module):
    """Two GELU MLP layers and a tied head, as a GPT's linears meet the copies: the tied one stays float32."""

    def __init__(self, direct: bool = False):
        super().__init__()
        self.emb = nn.Embedding(50, 24)
        self.fc = nn.Linear(24, 96)
        self.out = nn.Linear(96, 24)
        self.head = nn.Linear(24, 50, bias=False)
        self.head.weight = self.emb.weight
        self.direct = direct  # also reads fc's weight outside its layer

    def forward(self, idx):
        x = self.emb(idx)
        h = self.out(F.gelu(self.fc(x), approximate="tanh"))
        if self.direct:
            h = h + F.linear(x, self.fc.weight)[..., :24]
        return self.head(x + h)


def _nets(direct=False):
    torch.manual_seed(0)
    a = Net(direct)
    b = copy.deepcopy(a)
    return a, b


def _opt(model, copies=()):
    return ta.TritonAdamW(topt._param_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95), copies=copies)


def _train(model, opt, register, steps, clip=1.0):
    losses = []
    for s in range(steps):
        idx = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(s))
        opt.sync_copies()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(idx).float().flatten(0, 1), idx.roll(1, 1).flatten())
        loss.backward()
        register(opt)
        _step(opt, list(model.parameters()), clip, register)
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("direct", [False, True])
def test_copies_train_autocasts_weights_bit_for_bit(emulated, direct):  # noqa: F811
    a, b = _nets(direct)
    assert wc.apply_weight_copies(b, True) == 2  # fc and out; the tied head reads the embedding's float32 weight
    assert type(b.head) is nn.Linear and not hasattr(b.head, "weight_copy")
    oa, ob = _opt(a), _opt(b, wc.copies_of(b))
    la, lb = _train(a, oa, emulated, 6), _train(b, ob, emulated, 6)
    if direct:  # autocast sums the two bf16 gradients of its one cast of fc.weight in bf16; the fold sums in float32
        torch.testing.assert_close(la, lb, rtol=1e-3, atol=0)  # 2e-4 here; a lost gradient: 4e-2
        for p, q in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=2e-4)  # 4e-5 here; a lost gradient: 2e-3 to 4e-2
    else:
        assert la == lb
        for p, q in zip(a.parameters(), b.parameters()):
            assert torch.equal(p, q)
    for p, c in wc.copies_of(b):
        assert torch.equal(c, p.detach().to(torch.bfloat16))  # the kernel wrote them
    assert all(t.mixed for t in ob._tables.values())  # one launch a group, writing the copies


def test_a_weight_gradient_reaches_the_step_as_the_copys_bf16_and_biases_as_float32():
    a, b = _nets()
    wc.apply_weight_copies(b, True)
    idx = torch.randint(0, 50, (2, 8))
    for m in (a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            m(idx).float().square().mean().backward()
    assert b.fc.weight.grad is None and b.fc.weight_copy.grad.dtype == torch.bfloat16
    assert torch.equal(b.fc.weight_copy.grad.float(), a.fc.weight.grad)
    assert b.fc.bias.grad.dtype == torch.float32 and torch.equal(b.fc.bias.grad, a.fc.bias.grad)
    assert b.fc.bias_copy.grad is None


def test_under_compile_the_gradients_are_autocasts(emulated):  # noqa: F811
    a, b = _nets()
    wc.apply_weight_copies(b, True)
    idx = torch.randint(0, 50, (2, 8))
    for m in (a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.compile(m)(idx).float().square().mean().backward()
    assert torch.equal(b.fc.weight_copy.grad.float(), a.fc.weight.grad)
    assert torch.equal(b.out.bias.grad, a.out.bias.grad)  # the compiler keeps the bias's sum in float32: so do we


def test_outside_bf16_autocast_a_layer_reads_its_float32_weights():
    a, b = _nets()
    wc.apply_weight_copies(b, True)
    idx = torch.randint(0, 50, (2, 8))
    assert torch.equal(a(idx), b(idx))  # no autocast: float32
    with torch.autocast("cpu", dtype=torch.float16):
        assert torch.equal(a(idx), b(idx))


def test_copies_follow_a_load_and_an_in_place_edit_and_stale_gradients_go(emulated):  # noqa: F811
    _, b = _nets()
    wc.apply_weight_copies(b, True)
    opt = _opt(b, wc.copies_of(b))
    _train(b, opt, emulated, 2)
    saved = copy.deepcopy(b.state_dict())
    assert not any("copy" in k for k in saved)  # non-persistent: checkpoints hold the float32 weights only
    with torch.no_grad():
        b.fc.weight.mul_(0.5)
    opt.sync_copies()
    assert torch.equal(b.fc.weight_copy, b.fc.weight.detach().to(torch.bfloat16))
    b.load_state_dict(saved)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a backward outside the step (a FLOP count, a probe)
        b(torch.randint(0, 50, (2, 8))).float().sum().backward()
    opt.sync_copies()
    assert torch.equal(b.fc.weight_copy, saved["fc.weight"].to(torch.bfloat16))
    assert b.fc.weight_copy.grad is None and b.out.weight_copy.grad is None


def test_a_fallback_step_writes_the_copies_too(emulated):  # noqa: F811
    a, b = _nets()
    wc.apply_weight_copies(b, True)
    oa, ob = _opt(a), _opt(b, wc.copies_of(b))
    ob._broken = oa._broken = "no compiler"  # both on torch's foreach AdamW
    la, lb = _train(a, oa, emulated, 3), _train(b, ob, emulated, 3)
    assert la == lb
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    for p, c in wc.copies_of(b):
        assert torch.equal(c, p.detach().to(torch.bfloat16))


def test_the_norm_counts_the_copies_gradients(emulated):  # noqa: F811
    a, b = _nets()
    wc.apply_weight_copies(b, True)
    oa, ob = _opt(a), _opt(b, wc.copies_of(b))
    idx = torch.randint(0, 50, (2, 8))
    for m in (a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            m(idx).float().square().mean().backward()
    emulated(oa)
    emulated(ob)
    na = topt.clip_grad_norm(list(a.parameters()), float("inf"), opt=oa)
    nb = topt.clip_grad_norm(list(b.parameters()), float("inf"), opt=ob)
    torch.testing.assert_close(na, nb, rtol=1e-6, atol=0)
    ob._broken = "x"  # torch's foreach norm: the bf16 gradients normed in float32 as autocast's float32 ones
    torch.testing.assert_close(topt.clip_grad_norm(list(b.parameters()), float("inf"), opt=ob), na, rtol=1e-6,
                               atol=0)


def test_other_optimizers_drop_the_copies_and_say_so(capsys):
    _, b = _nets()
    wc.apply_weight_copies(b, True)
    topt.build_optimizer(b, "adamw", 1e-3, 0.1, torch.device("cpu"), "foreach")
    assert type(b.fc) is nn.Linear and not hasattr(b.fc, "weight_copy")
    assert "does not write the linears' bf16 weight copies" in capsys.readouterr().out


def test_give_back_and_what_is_not_copied():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, bias=False), nn.Linear(4, 4), nn.Linear(4, 4))
    model[2].weight.requires_grad_(False)  # frozen: the optimizer writes no copy of it
    model[3].double()
    assert wc.apply_weight_copies(model, True) == 2
    assert model[1].bias_copy is None
    keys = set(model.state_dict())
    wc.remove_weight_copies(model)
    assert all(type(m) is nn.Linear for m in model) and set(model.state_dict()) == keys
    assert not any(hasattr(m, "weight_copy") for m in model)
    with pytest.raises(ValueError, match="bf16 twin"):
        ta.TritonAdamW(nn.Linear(2, 2).parameters(), copies=[(model[0].weight, model[0].weight.detach().half())])


@pytest.mark.parametrize("change, message", [
    ({"grad_accum": 2}, "grad_accum = 2"),
    ({"dtype": "fp32"}, 'precision.dtype = "fp32"'),
    ({"impl": "fused"}, 'optimizer_impl = "fused"'),
    ({"world": 2}, "2 processes"),
    ({"fp8": "rowwise"}, "precision.fp8"),
    ({"linears": 0}, "has none"),
])
def test_the_resolver_turns_it_on_only_where_exact(change, message):
    from turbotrain.config import Config
    from turbotrain.resolve import Facts, _Changes, _resolve_weight_copies

    def resolved(setting):
        cfg = Config()
        cfg.precision.dtype, cfg.precision.fp8 = change.get("dtype", "bf16"), change.get("fp8", "off")
        cfg.precision.weight_copies = setting
        cfg.train.optimizer_impl, cfg.train.grad_accum = change.get("impl", "triton"), change.get("grad_accum", 1)
        c = _Changes(cfg)
        _resolve_weight_copies(c, Facts(device=torch.device("cuda"), world_size=change.get("world", 1),
                                        copy_linears=change.get("linears", 4)))
        return c.cfg.precision.weight_copies

    assert resolved("auto") is False
    with pytest.raises(UserError, match=message):
        resolved(True)
    change.clear()
    assert resolved("auto") is True and resolved(True) is True


def test_a_callbacks_hook_may_write_weights_through_data_and_the_copies_follow(emulated, tmp_path):  # noqa: F811
    from turbotrain.callbacks import Callback, Hooks

    class Halve(Callback):
        def on_step_end(self, state):
            for p in state.model.parameters():
                p.data.mul_(0.5)  # moves no version counter

    _, b = _nets()
    wc.apply_weight_copies(b, True)
    opt = _opt(b, wc.copies_of(b))
    _train(b, opt, emulated, 1)
    Hooks([Halve()], 3, b, tmp_path).call("on_step_end", 1)
    opt.sync_copies()
    assert all(torch.equal(c, p.detach().to(torch.bfloat16)) for p, c in wc.copies_of(b))


def test_a_layer_frozen_mid_run_stops_training(emulated):  # noqa: F811
    _, b = _nets()
    wc.apply_weight_copies(b, True)
    opt = _opt(b, wc.copies_of(b))
    _train(b, opt, emulated, 2)
    b.fc.weight.requires_grad_(False)
    before = b.fc.weight.detach().clone()
    _train(b, opt, emulated, 2)
    assert torch.equal(b.fc.weight, before) and not b.fc.weight_copy.requires_grad
    b.fc.weight.requires_grad_(True)
    _train(b, opt, emulated, 1)
    assert not torch.equal(b.fc.weight, before)


def test_a_model_built_on_the_meta_device_counts_its_linears():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    assert len(wc.candidates(model)) == 2  # the resolver's facts come before the model is materialised


def test_bench_keeps_the_copies_off_in_its_baseline_and_refuses_them_without_the_kernel():
    from turbotrain import bench
    from turbotrain.config import Config

    assert 'precision.weight_copies="auto"' in bench.BASELINE  # off with its float32 and foreach; an explicit true
    # in the user's config would make every such row an error
    assert 'precision.weight_copies="auto"' in bench.variant_overrides("all", Config())
    cfg = Config()
    cfg.run.device = "cpu"
    with pytest.raises(UserError, match="weight_copies .*GPU"):
        bench._check_optimizer_variant("weight_copies", cfg)
