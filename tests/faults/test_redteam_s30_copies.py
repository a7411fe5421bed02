"""Red team, session 30: precision.weight_copies at the component level on a CPU (the Triton kernels emulated as in
tests/unit/test_triton_adamw.py). Each case states what correct behaviour is; each failed before its fix."""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.unit.test_triton_adamw import _step, emulated  # noqa: F401  (the fixture)
from turbotrain.accel import optim as topt
from turbotrain.accel import triton_adamw as ta
from turbotrain.accel import weight_copies as wc
from turbotrain.errors import UserError

BF = torch.bfloat16


class Twice(nn.Module):
    """fc (bias-free) called twice a forward; out once; an optional `skip_out` leaves out unused."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(40, 16)
        self.fc = nn.Linear(16, 16, bias=False)
        self.out = nn.Linear(16, 40)
        self.skip_out = False

    def forward(self, idx):
        x = self.emb(idx)
        h = self.fc(F.gelu(self.fc(x)))
        if self.skip_out:
            return h @ self.emb.weight.t()
        return self.out(h)


def _pair(cls=Twice):
    torch.manual_seed(0)
    a = cls()
    return a, copy.deepcopy(a)


def _opt(model, copies=()):
    return ta.TritonAdamW(topt._param_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95), copies=copies)


def _batch(s, vocab=40):
    return torch.randint(0, vocab, (4, 12), generator=torch.Generator().manual_seed(s))


def _train(model, opt, register, steps, clip=1.0, start=0, set_to_none=True, before=None):
    losses = []
    for s in range(start, start + steps):
        if before:
            before(model, s)
        idx = _batch(s)
        opt.sync_copies()
        with torch.autocast("cpu", dtype=BF):
            loss = F.cross_entropy(model(idx).float().flatten(0, 1), idx.roll(1, 1).flatten())
        loss.backward()
        register(opt)
        _step(opt, list(model.parameters()), clip, register)
        opt.zero_grad(set_to_none=set_to_none)
        losses.append(loss.item())
    return losses


def _assert_same(a, b):
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n


def _copies_current(model):
    return all(torch.equal(c, p.detach().to(BF)) for p, c in wc.copies_of(model))


# 1. a bias-free layer used twice a forward: its weight's two bf16 gradients sum as autocast's one cast sums them
def test_layer_used_twice_a_forward_trains_bit_for_bit(emulated):  # noqa: F811
    a, b = _pair()
    assert wc.apply_weight_copies(b, True) == 2 and b.fc.bias_copy is None
    la = _train(a, _opt(a), emulated, 5)
    ob = _opt(b, wc.copies_of(b))
    lb = _train(b, ob, emulated, 5)
    assert la == lb
    _assert_same(a, b)
    assert _copies_current(b)


# 2. zero_grad(set_to_none=False): the copies' zeroed gradients are neither lost nor counted twice
def test_zero_grad_keeping_tensors_trains_bit_for_bit(emulated):  # noqa: F811
    a, b = _pair()
    wc.apply_weight_copies(b, True)
    la = _train(a, _opt(a), emulated, 4, set_to_none=False)
    lb = _train(b, _opt(b, wc.copies_of(b)), emulated, 4, set_to_none=False)
    assert la == lb
    _assert_same(a, b)


# 3. a copied layer unused on some steps: no gradient, no step; its step count and bias correction stay its own
def test_a_layer_unused_some_steps_keeps_its_own_step_count(emulated):  # noqa: F811
    def toggle(model, s):
        model.skip_out = s in (1, 2)

    a, b = _pair()
    wc.apply_weight_copies(b, True)
    oa, ob = _opt(a), _opt(b, wc.copies_of(b))
    la = _train(a, oa, emulated, 5, before=toggle)
    lb = _train(b, ob, emulated, 5, before=toggle)
    assert la == lb
    _assert_same(a, b)
    assert float(ob.state[b.out.weight]["step"]) == 3 and float(ob.state[b.fc.weight]["step"]) == 5
    assert _copies_current(b)


# 4. a bias frozen after the copies were made: it stays put, its copy stays its bf16, the weight still trains
def test_a_bias_frozen_after_apply(emulated):  # noqa: F811
    a, b = _pair()
    wc.apply_weight_copies(b, True)
    oa, ob = _opt(a), _opt(b, wc.copies_of(b))
    _train(a, oa, emulated, 2)
    _train(b, ob, emulated, 2)
    for m in (a, b):
        m.out.bias.requires_grad_(False)
    frozen = b.out.bias.detach().clone()
    la = _train(a, oa, emulated, 2, start=2)
    lb = _train(b, ob, emulated, 2, start=2)
    assert la == lb
    _assert_same(a, b)
    assert torch.equal(b.out.bias, frozen) and torch.equal(b.out.bias_copy, frozen.to(BF))


# 5. NaN in a copy's gradient: the norm is NaN on the kernel's path and on torch's, not hidden by the bf16 rows
@pytest.mark.parametrize("broken", [False, True])
def test_a_nan_in_a_copys_gradient_makes_the_norm_nan(emulated, broken):  # noqa: F811
    _, b = _pair()
    wc.apply_weight_copies(b, True)
    ob = _opt(b, wc.copies_of(b))
    with torch.autocast("cpu", dtype=BF):
        b(_batch(0)).float().square().mean().backward()
    b.fc.weight_copy.grad[0, 0] = float("nan")
    emulated(ob)
    if broken:
        ob._broken = "no compiler"
    norm = topt.clip_grad_norm(list(b.parameters()), 1.0, opt=ob)
    assert torch.isnan(norm)


# 6. checkpoints move between runs with and without copies: the same continuation, bit for bit, either way
@pytest.mark.parametrize("saved_with_copies", [False, True])
def test_a_checkpoint_moves_between_runs_with_and_without_copies(emulated, saved_with_copies):  # noqa: F811
    ref, src = _pair()
    if saved_with_copies:
        wc.apply_weight_copies(src, True)
    osrc = _opt(src, wc.copies_of(src))
    oref = _opt(ref)
    _train(src, osrc, emulated, 3)
    _train(ref, oref, emulated, 3)
    buf = io.BytesIO()
    torch.save({"model": src.state_dict(), "opt": osrc.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert not any("copy" in k for k in state["model"])
    torch.manual_seed(1)
    dst = Twice()  # other weights: the load must reach the copies
    if not saved_with_copies:
        wc.apply_weight_copies(dst, True)
    odst = _opt(dst, wc.copies_of(dst))
    dst.load_state_dict(state["model"])
    odst.load_state_dict(state["opt"])
    lr_ = _train(ref, oref, emulated, 3, start=3)
    ld = _train(dst, odst, emulated, 3, start=3)
    assert lr_ == ld
    _assert_same(ref, dst)


# 7. a weight set through `.data` outside a callback hook, in place, is not seen (the documented limitation);
# a new tensor set as `.data` (another address) is
def test_data_edits_outside_hooks(emulated):  # noqa: F811
    _, b = _pair()
    wc.apply_weight_copies(b, True)
    ob = _opt(b, wc.copies_of(b))
    _train(b, ob, emulated, 1)
    ob.sync_copies()  # the emulated kernel writes through the parameter (moves its version): recorded here
    b.out.weight.data.mul_(0.5)
    ob.sync_copies()
    assert not torch.equal(b.out.weight_copy, b.out.weight.detach().to(BF))  # stale: only forget() would see it
    wc.forget(b)
    ob.sync_copies()
    assert _copies_current(b)
    b.out.weight.data = b.out.weight.data * 0.25
    ob.sync_copies()
    assert _copies_current(b)


# 8. a weight replaced by a new Parameter after the optimizer was built (or load_state_dict(assign=True)): the
# forward must not silently keep reading the old weight's copy
@pytest.mark.parametrize("how", ["setattr", "assign"])
def test_a_replaced_weight_is_not_shadowed_by_a_stale_copy(emulated, how):  # noqa: F811
    a, b = _pair()
    wc.apply_weight_copies(b, True)
    ob = _opt(b, wc.copies_of(b))
    _train(b, ob, emulated, 1)
    new = torch.full_like(b.out.weight, 0.01)
    if how == "setattr":
        b.out.weight = nn.Parameter(new.clone())
    else:
        sd = {k: v.clone() for k, v in b.state_dict().items()}
        sd["out.weight"] = new.clone()
        b.load_state_dict(sd, assign=True)
    wc.drop_replaced(b)  # what the train step runs before each forward (step._copies_current)
    ob.sync_copies()
    assert type(b.out) is nn.Linear
    with torch.autocast("cpu", dtype=BF):
        got = b.out(torch.ones(2, 16))
        want = F.linear(torch.ones(2, 16), new, b.out.bias)
    assert torch.equal(got, want)


# 9. a deepcopy (an EMA or eval twin) of a model with copies: its forward under autocast reads its own weights
def test_a_deepcopied_twin_reads_its_own_weights(emulated):  # noqa: F811
    _, b = _pair()
    wc.apply_weight_copies(b, True)
    ob = _opt(b, wc.copies_of(b))
    _train(b, ob, emulated, 1)
    ema = copy.deepcopy(b)
    _train(b, ob, emulated, 2, start=1)
    with torch.no_grad():  # the usual EMA update, in place (moves the version counters)
        for e, p in zip(ema.parameters(), b.parameters()):
            e.lerp_(p, 0.5)
    x = torch.randn(3, 16)
    with torch.autocast("cpu", dtype=BF):
        got = ema.out(x)
        want = F.linear(x, ema.out.weight, ema.out.bias)
    assert torch.equal(got, want)


# 10. torch.save(model) / pickle round trip: the loaded model computes what the saved one did; its state dict
# holds no copies; given back it is torch's own Linear
def test_a_pickled_model_with_copies_round_trips():
    _, b = _pair()
    wc.apply_weight_copies(b, True)
    buf = io.BytesIO()
    torch.save(b, buf)
    buf.seek(0)
    c = torch.load(buf, weights_only=False)
    d = pickle.loads(pickle.dumps(b))
    x = _batch(0)
    with torch.autocast("cpu", dtype=BF):
        want = b(x)
        assert torch.equal(c(x), want) and torch.equal(d(x), want)
    assert set(c.state_dict()) == set(b.state_dict()) and not any("copy" in k for k in c.state_dict())
    wc.remove_weight_copies(c)
    assert type(c.fc) is nn.Linear and not hasattr(c.fc, "weight_copy")


# 11. apply twice adds nothing (and changes no copy); remove twice is a no-op; give_back leaves torch's Linear
def test_apply_and_remove_are_idempotent_and_give_back_restores():
    from turbotrain.pipeline import give_back

    _, b = _pair()
    keys = set(b.state_dict())
    assert wc.apply_weight_copies(b, True) == 2
    first = b.fc.weight_copy
    assert wc.apply_weight_copies(b, True) == 0 and b.fc.weight_copy is first
    assert len(wc.copies_of(b)) == 3  # fc.weight, out.weight, out.bias
    give_back(b, torch.device("cpu"), False)
    wc.remove_weight_copies(b)
    assert all(type(m) is nn.Linear for m in (b.fc, b.out))
    assert not any(hasattr(m, n) for m in (b.fc, b.out) for n in ("weight_copy", "bias_copy"))
    assert set(b.state_dict()) == keys and dict(b.named_buffers()) == {}


# 12. weights shared between two linears (tied) or between a linear and another module get no copies; the same
# Linear module registered twice (one owner) does, and trains bit for bit
def test_shared_weights_get_no_copies_and_a_module_registered_twice_does(emulated):  # noqa: F811
    tied = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    tied[1].weight = tied[0].weight
    assert wc.candidates(tied) == []
    extra = nn.Module()
    extra.lin, extra.p = nn.Linear(8, 8), None
    extra.other = nn.Module()
    extra.other.w = extra.lin.bias
    assert wc.candidates(extra) == []

    class Again(Twice):
        def __init__(self):
            super().__init__()
            self.again = self.fc  # the same module under two names

    a, b = _pair(Again)
    assert wc.apply_weight_copies(b, True) == 2
    la = _train(a, _opt(a), emulated, 3)
    lb = _train(b, _opt(b, wc.copies_of(b)), emulated, 3)
    assert la == lb
    _assert_same(a, b)


# 13. the resolver's refusals of an explicit true: a UserError of one line naming the key, the cause and the fix,
# through resolve() itself
@pytest.mark.parametrize("setup", [
    dict(dtype="fp32"), dict(impl="foreach"), dict(accum=4), dict(world=2), dict(linears=0), dict(fp8="tensorwise"),
])
def test_resolver_refusals_are_one_line_user_errors(setup):
    from turbotrain.config import Config
    from turbotrain.resolve import Facts, _Changes, _resolve_weight_copies

    cfg = Config()
    cfg.precision.dtype, cfg.precision.fp8 = setup.get("dtype", "bf16"), setup.get("fp8", "off")
    cfg.precision.weight_copies = True
    cfg.train.optimizer_impl, cfg.train.grad_accum = setup.get("impl", "triton"), setup.get("accum", 1)
    facts = Facts(device=torch.device("cuda"), world_size=setup.get("world", 1),
                  copy_linears=setup.get("linears", 3))
    with pytest.raises(UserError) as e:
        _resolve_weight_copies(_Changes(cfg), facts)
    msg = str(e.value)
    assert "\n" not in msg and "precision.weight_copies = true" in msg
    assert msg.endswith("set precision.weight_copies=false")


def test_resolve_on_a_cpu_refuses_an_explicit_true_in_one_line():
    from turbotrain.config import Config
    from turbotrain.resolve import Facts, resolve

    cfg = Config()
    cfg.precision.weight_copies = True
    cfg.precision.dtype = "bf16"
    with pytest.raises(UserError) as e:
        resolve(cfg, Facts(device=torch.device("cpu"), copy_linears=3))
    msg = str(e.value)
    assert "\n" not in msg and "weight_copies" in msg


# 14. a callback hook (any, not only on_step_end) that writes through .data: the copies follow before the next
# forward; hooks that no callback has do not forget (the next sync copies nothing)
def test_every_hook_with_a_callback_forgets_the_copies(emulated, tmp_path):  # noqa: F811
    from turbotrain.callbacks import Hooks

    class Zero:  # not a Callback subclass: its inherited no-op hooks would make every hook forget
        def on_log(self, state):
            for p in state.model.parameters():
                p.data.zero_()

    _, b = _pair()
    wc.apply_weight_copies(b, True)
    ob = _opt(b, wc.copies_of(b))
    _train(b, ob, emulated, 1)
    hooks = Hooks([Zero()], 3, b, tmp_path)
    ob.sync_copies()  # the emulated kernel moved the versions: recorded here
    hooks.call("on_step_end", 1)  # no callback has it: nothing forgotten
    assert not any(wc.stale(p, c) for p, c in wc.copies_of(b))
    hooks.call("on_log", 1)
    ob.sync_copies()
    assert _copies_current(b) and not b.fc.weight_copy.any()


# 15. (cost, not correctness) a Callback subclass's inherited no-op hooks are no hooks: an on_step_end it does not
# define writes no weight, so the copies are not written again at every step
def test_a_callback_subclass_with_only_on_log_keeps_the_copies_at_step_end(emulated, tmp_path):  # noqa: F811
    from turbotrain.callbacks import Callback, Hooks

    class LogOnly(Callback):
        def on_log(self, state):
            return None

    _, b = _pair()
    wc.apply_weight_copies(b, True)
    ob = _opt(b, wc.copies_of(b))
    ob.sync_copies()
    Hooks([LogOnly()], 3, b, tmp_path).call("on_step_end", 1)
    assert not any(wc.stale(p, c) for p, c in wc.copies_of(b))  # Callback's own no-op hooks write nothing
