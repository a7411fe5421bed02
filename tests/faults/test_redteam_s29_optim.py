"""Red team, session 29: TritonAdamW's host path and resuming under another train.optimizer_impl. On a CPU the
kernels run emulated in torch (tests/unit/test_triton_adamw.py's fixture), so the host's tables, caches and
fallbacks are checked against torch's foreach AdamW."""
from __future__ import annotations

import copy
import math
import pathlib

import pytest
import torch
from torch import nn

from tests.unit.test_triton_adamw import _grads, _pair, _step, emulated  # noqa: F401  (the fixture)
from turbotrain.accel import optim as topt
from turbotrain.accel import triton_adamw as ta


def _close(ps, qs):
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- a grad_scale of one element, not 0-d


@pytest.mark.parametrize("shape", [(1,), (1, 1)])
def test_one_element_grad_scale_is_applied_on_the_fallback_path(shape):
    """On a CPU every step is torch's foreach AdamW; a one-element scale that is not 0-d (the kernel takes it)
    stopped the fallback's division with a RuntimeError."""
    ps, qs, a, b = _pair()
    for p, q in zip(ps, qs):
        p.grad = torch.full_like(p, 10.0)
        q.grad = torch.full_like(q, 2.5)
    a.grad_scale = torch.full(shape, 4.0)
    a.step()
    b.step()
    _close(ps, qs)
    assert a.grad_scale.shape == shape  # the caller's attribute is left as it set it


# ---------------------------------------------------------------- tables cached on addresses only


def test_a_gradient_at_the_same_address_in_another_layout_is_not_read_as_the_old_one(emulated):  # noqa: F811
    """The tables are cached by the tensors' addresses and sizes; a gradient replaced by the user with a view in
    another layout at the same address (a transpose of the same storage) was read as if contiguous."""
    ps, qs, a, b = _pair()
    bufs = [torch.randn(p.shape) for p in ps]
    for step in range(3):
        for p, q, buf in zip(ps, qs, bufs):
            buf.copy_(torch.randn(p.shape))
            g = buf.t() if step == 2 and buf.dim() == 2 and buf.shape[0] == buf.shape[1] else buf
            p.grad, q.grad = g, g.clone()
        _step(a, ps, 0.5, emulated)
        _step(b, qs, 0.5)
        _close(ps, qs)


# ---------------------------------------------------------------- resuming FSDP2 under another kernel



def _sharded(**kernel):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **kernel)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, opt, sched, torch.amp.GradScaler("cpu", enabled=False)


@pytest.mark.parametrize("saved, resumed", [({"foreach": False}, {"fused": True}),
                                            ({"fused": True}, {"foreach": True})])
def test_sharded_resume_keeps_the_kernel_this_run_built(tmp_path: pathlib.Path, gloo1, saved, resumed):
    """FSDP2's checkpoints load through DCP's set_state_dict, not load_optimizer_state: the saved groups' kernel
    flags replaced this run's (a fused run resumed as a for-loop one), the state's values must be the saved ones."""
    from turbotrain.checkpoint import Checkpointer, param_shapes
    from turbotrain.config import CheckpointConfig

    model, opt, sched, scaler = _sharded(**saved)
    ck = Checkpointer(CheckpointConfig(every=1, keep=5, resume="auto"), tmp_path, 0, 1, True)
    meta = {"global_batch": 8, "param_shapes": param_shapes(model), "optimizer": "adamw", "dtype": "fp32"}
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    ck.save(2, model, opt, sched, scaler, meta)
    want = [{k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone().float().cpu()
             for k, v in st.items()} for st in opt.state.values()]
    model2, opt2, sched2, scaler2 = _sharded(**resumed)
    flags = [{k: g[k] for k in ("foreach", "fused", "capturable")} for g in opt2.param_groups]
    assert ck.load(ck.find_resume(), model2, opt2, sched2, scaler2, meta) == 2
    assert [{k: g[k] for k in ("foreach", "fused", "capturable")} for g in opt2.param_groups] == flags
    got = [{k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().float().cpu() for k, v in st.items()}
           for st in opt2.state.values()]
    assert len(got) == len(want) and all(g.keys() == w.keys() and all(torch.equal(g[k], w[k]) for k in g)
                                         for g, w in zip(got, want))
    model2(torch.randn(3, 4)).sum().backward()
    opt2.step()  # continues without a traceback
    assert all(float(st["step"]) == 3.0 for st in opt2.state.values())


# ---------------------------------------------------------------- impls of adam/sgd/adamw move between each other


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
@pytest.mark.parametrize("saved, resumed", [("foreach", "fused"), ("fused", "for"), ("for", "foreach")])
def test_state_moves_between_impls_and_the_next_step_is_the_same(name, saved, resumed):
    torch.manual_seed(0)
    m1, m2 = nn.Linear(4, 4), nn.Linear(4, 4)
    o1 = topt.build_optimizer(m1, name, 1e-2, 0.1, torch.device("cpu"), saved)
    o2 = topt.build_optimizer(m2, name, 1e-2, 0.1, torch.device("cpu"), resumed)
    for _ in range(2):
        m1(torch.ones(2, 4)).sum().backward()
        o1.step()
        o1.zero_grad()
    m2.load_state_dict(m1.state_dict())
    topt.load_optimizer_state(o2, copy.deepcopy(o1.state_dict()))
    for m, o in ((m1, o1), (m2, o2)):
        m(torch.ones(2, 4)).sum().backward()
        o.step()
    _close(list(m1.parameters()), list(m2.parameters()))
    assert all(bool(g["fused"]) == (resumed == "fused") for g in o2.param_groups)


def test_zero_size_parameters_and_a_group_added_later(emulated):  # noqa: F811
    """A zero-size parameter (no blocks) and a group added after steps: the same updates as torch's."""
    ps, qs, a, b = _pair()
    for step in range(4):
        if step == 2:
            torch.manual_seed(7)
            extra = [nn.Parameter(torch.randn(3, 5)), nn.Parameter(torch.empty(0))]
            extra_q = [nn.Parameter(x.detach().clone()) for x in extra]
            ps, qs = ps + extra, qs + extra_q
            a.add_param_group({"params": extra, "weight_decay": 0.0})
            b.add_param_group({"params": extra_q, "weight_decay": 0.0})
        gen = torch.Generator().manual_seed(step)
        for p, q in zip(ps, qs):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        _step(a, ps, 0.5, emulated)
        _step(b, qs, 0.5)
        _close(ps, qs)
    assert a._tables[2].addrs  # the kernel took the added group


# ---------------------------------------------------------------- triton chosen where every step would fall back


def test_channels_last_conv_weights_build_torchs_adamw_and_say_so(monkeypatch, capsys):
    """memory.channels_last lays conv weights out NHWC before the optimizer is built; the kernel takes only
    contiguous tensors, so TritonAdamW ran every step as torch's foreach AdamW (slower than the fused one "auto"
    picked before), silently."""
    monkeypatch.setattr(ta, "triton_problem", lambda device: None)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8, 2)).to(memory_format=torch.channels_last)
    for impl in ("triton", "auto"):
        opt = topt.build_optimizer(model, "adamw", 1e-3, 0.1, torch.device("cpu"), impl)
        assert type(opt) is torch.optim.AdamW and not opt.defaults["fused"], impl  # a CPU: "auto" is foreach there
        assert "0.weight is not contiguous" in capsys.readouterr().out
    plain = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8, 2))
    assert type(topt.build_optimizer(plain, "adamw", 1e-3, 0.1, torch.device("cpu"), "triton")) is ta.TritonAdamW


# ---------------------------------------------------------------- a parameter that missed steps


def test_a_parameter_that_missed_steps_keeps_the_kernel_with_its_own_bias_correction(emulated,  # noqa: F811
                                                                                      monkeypatch):
    """A parameter frozen a while (no gradient) counts fewer steps than its group: one launch with one bias
    correction would be wrong for it, and handing every later step of the run to torch's foreach AdamW made the
    rest of the run silently slower. One launch per step count: torch's values, the kernel kept."""
    ps, qs, a, b = _pair()
    launches = []
    adamw, sq_sum = ta._kernels()
    counted = type(adamw)(lambda by_addr, grid, *args, **meta: launches.append(grid) or adamw.fn(
        by_addr, grid, *args, **meta), adamw.by_addr)
    monkeypatch.setattr(ta, "_kernels", lambda: (counted, sq_sum))
    for step in range(6):
        gen = torch.Generator().manual_seed(step)
        for i, (p, q) in enumerate(zip(ps, qs)):
            frozen = i == 3 and step in (1, 2)  # a parameter of the second group (1-D ones)
            p.grad = None if frozen else torch.randn(p.shape, generator=gen)
            q.grad = None if frozen else p.grad.clone()
        _step(a, ps, math.inf, emulated)
        _step(b, qs, math.inf)
        _close(ps, qs)
    assert [float(a.state[p]["step"]) for p in ps] == [6.0, 6.0, 6.0, 4.0, 6.0]
    # group 0: a launch a step; group 1: one while its step counts agree, two (6 and 4) for the last three steps
    assert len(launches) == 6 + 3 + 2 * 3


def _grads_in_place(ps, qs, step):
    """Gradients written into the same tensors each step (zero_grad(set_to_none=False), DDP's bucket views): the
    tables' addresses stay the same."""
    g = torch.Generator().manual_seed(100 + step)
    for p, q in zip(ps, qs):
        grad = torch.randn(p.shape, generator=g)
        for x in (p, q):
            if x.grad is None:
                x.grad = grad.clone()
            else:
                x.grad.copy_(grad)


def test_a_loaded_state_with_other_step_counts_is_checked_again(emulated):  # noqa: F811
    """torch's load keeps a state tensor that needs no cast as the very tensor it is given, so a state loaded from
    this optimizer's own state_dict (step counts edited, a rewind) left every table address as it was: the cached
    plan launched with the old step counts' bias correction."""
    ps, qs, a, b = _pair()
    for step in range(2):
        _grads_in_place(ps, qs, step)
        _step(a, ps, math.inf, emulated)
        _step(b, qs, math.inf)
    sd = a.state_dict()
    sd["state"] = {k: {**st, "step": torch.tensor(7.0 if k == 0 else 40.0)} for k, st in sd["state"].items()}
    a.load_state_dict(sd)
    b.load_state_dict(copy.deepcopy(sd))
    for step in range(2, 4):
        _grads_in_place(ps, qs, step)
        _step(a, ps, math.inf, emulated)
        _step(b, qs, math.inf)
        _close(ps, qs)


# ---------------------------------------------------------------- an Adam state the step cannot read


def _no_exp_avg_sq(st):
    del st["exp_avg_sq"]


def _exp_avg_none(st):
    st["exp_avg"] = None


def _exp_avg_scalar(st):
    st["exp_avg"] = torch.tensor(0.5)


def _step_negative(st):
    st["step"] = torch.tensor(-1.0)


def _step_nan(st):
    st["step"] = torch.tensor(float("nan"))


def _exp_avg_sq_negative(st):
    st["exp_avg_sq"] = -st["exp_avg_sq"] - 1.0


@pytest.mark.parametrize("change", [_no_exp_avg_sq, _exp_avg_none, _exp_avg_scalar, _step_negative, _step_nan,
                                    _exp_avg_sq_negative])
def test_an_adam_state_the_step_cannot_read_is_corruption_not_a_traceback(tmp_path, change):
    """A resealed state.pt whose AdamW state lacks an entry, holds None or a 0-d tensor for a moment passed the
    check (only tensors with dimensions were compared to the parameter) and the resumed run stopped at its first
    step with a KeyError / AttributeError / RuntimeError; a step count below 0 (a zero bias correction), NaN, or a
    negative second moment (its square root) made every resumed weight NaN. It is corruption: the previous
    checkpoint loads, and the run continues with finite weights."""
    from tests.faults.test_checkpoint_trust import Run, edit_state, same, weights

    run = Run(tmp_path).train_and_save()
    edit_state(run.ckpt(2), lambda s: change(s["optim"]["state"][1]))
    step, model, opt = run.resume()
    assert step == 1 and run.ck.loaded == run.ckpt(1) and same(weights(model), run.weights[1])
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # the resumed run continues
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_a_saved_group_asking_for_amsgrad_needs_its_state(tmp_path):
    """torch's load takes the saved groups' hyperparameters: a group saying amsgrad without max_exp_avg_sq in the
    state stopped the resumed run's first step with a KeyError."""
    from tests.faults.test_checkpoint_trust import Run, edit_state, same, weights

    run = Run(tmp_path).train_and_save()
    edit_state(run.ckpt(2), lambda s: s["optim"]["param_groups"][0].update(amsgrad=True))
    step, model, opt = run.resume()
    assert step == 1 and same(weights(model), run.weights[1])
    model(torch.randn(3, 4)).sum().backward()
    opt.step()


def test_a_complex_parameters_adam_state_is_a_valid_checkpoint():
    """torch's Adam keeps complex moments for a complex parameter: its second moment's real view holds the squares."""
    from turbotrain.checkpoint import _check_optim

    p = nn.Parameter(torch.randn(3, dtype=torch.complex64))
    opt = torch.optim.Adam([p])
    p.grad = torch.randn_like(p)
    opt.step()
    _check_optim(opt, opt.state_dict())
