"""train.optimizer_impl = "triton" on a GPU: the Triton AdamW kernel and the squared-norm kernel give torch's foreach
AdamW's parameters and norm within fp32 rounding (sizes with tails, two groups, a folded clip, gradients at new
addresses every step), their state moves to torch's fused AdamW and back, and a GPU run takes the kernel by default
and trains the loss curve torch's fused kernel trains. tests/unit/test_triton_adamw.py covers the host side."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from turbotrain.accel import optim as topt
from turbotrain.accel import triton_adamw as ta

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or ta.triton_problem(
    torch.device("cuda")) is not None, reason="needs a GPU with triton")]

SHAPES = [(768, 2304), (2304,), (1023,), (1025,), (3, 70), (1,), (50304, 8), (4096,)]


def _pair(fused=False):
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in SHAPES]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]

    def groups(xs):
        return [{"params": [x for x in xs if x.dim() >= 2], "weight_decay": 0.1},
                {"params": [x for x in xs if x.dim() < 2], "weight_decay": 0.0}]
    kind = {"fused": True} if fused else {"foreach": True}
    return ps, qs, ta.TritonAdamW(groups(ps), lr=1e-3, betas=(0.9, 0.95)), \
        torch.optim.AdamW(groups(qs), lr=1e-3, betas=(0.9, 0.95), **kind)


def _step(opt, params, step, clip):
    g = torch.Generator(device="cuda").manual_seed(100 + step)
    for p in params:  # new gradient tensors each step: the pointer table is rebuilt
        p.grad = torch.randn(p.shape, device="cuda", generator=g) * 0.1
    norm = topt.clip_grad_norm(params, clip, opt=opt)
    opt.step()
    opt.__dict__.pop("grad_scale", None)
    return norm


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("clip", [1.0, math.inf])
def test_kernels_match_torch_foreach_adamw(clip):
    ps, qs, a, b = _pair()
    for step in range(5):
        na, nb = _step(a, ps, step, clip), _step(b, qs, step, clip)
        assert abs(na.item() - nb.item()) <= 1e-5 * nb.item()
    assert max(_rel(p, q) for p, q in zip(ps, qs)) < 1e-6
    assert all(c.addrs for c in a._tables.values())  # the kernel ran (no step fell back)


def test_state_moves_to_torchs_fused_adamw_and_back():
    ps, qs, a, b = _pair(fused=True)
    for step in range(2):
        _step(a, ps, step, 1.0)
        _step(b, qs, step, 1.0)
    # a copy, as a resume reads it from a file: torch's load keeps a tensor that needs no cast as the one it is given,
    # so b would share (and update again) a's moments
    topt.load_optimizer_state(b, copy.deepcopy(a.state_dict()))  # b stays fused, its steps go to the GPU
    assert b.param_groups[0]["fused"] and all(st["step"].is_cuda for st in b.state.values())
    with torch.no_grad():
        for p, q in zip(ps, qs):
            q.copy_(p)
    for step in range(2, 4):
        _step(a, ps, step, 1.0)
        _step(b, qs, step, 1.0)
    assert max(_rel(p, q) for p, q in zip(ps, qs)) < 1e-6
    a.load_state_dict(copy.deepcopy(b.state_dict()))  # back: steps return to the host, the fallback stays foreach
    assert a.param_groups[0]["foreach"] and not a.param_groups[0]["fused"]
    assert all(st["step"].device.type == "cpu" and float(st["step"]) == 4.0 for st in a.state.values())
    _step(a, ps, 4, 1.0)
    assert all(c.addrs for c in a._tables.values())


def test_a_gpu_run_takes_it_and_trains_the_fused_kernels_curve(tmp_path):
    import tomllib

    from tests.helpers import losses, tiny_gpt
    from turbotrain.trainer import train

    for name, impl in (("auto", "auto"), ("fused", "fused")):
        train(tiny_gpt(tmp_path, "run.device=cuda", "train.steps=8", f"run.name={name!r}",
                       f"train.optimizer_impl={impl!r}"))
    cfg = tomllib.loads((tmp_path / "auto" / "config.toml").read_text())
    assert cfg["train"]["optimizer_impl"] == "triton"
    got, ref = losses(tmp_path, "auto"), losses(tmp_path, "fused")
    assert len(got) == len(ref) == 8 and all(abs(x - y) <= 2e-3 * abs(y) for x, y in zip(got, ref)), (got, ref)


def test_weight_copies_kernel_reads_bf16_gradients_and_writes_the_copies():
    """precision.weight_copies: a weight's gradient is its bf16 copy's, the kernel writes the copy; the result is the
    kernel's over the same gradients in float32, and each copy is torch's round-to-nearest cast of its weight."""
    ps, qs, a, _ = _pair()
    copies = [(p, p.detach().to(torch.bfloat16).requires_grad_()) for p in ps if p.dim() == 2]
    def groups(xs):
        return [{"params": [x for x in xs if x.dim() >= 2], "weight_decay": 0.1},
                {"params": [x for x in xs if x.dim() < 2], "weight_decay": 0.0}]
    a = ta.TritonAdamW(groups(ps), lr=1e-3, betas=(0.9, 0.95), copies=copies)
    b = ta.TritonAdamW(groups(qs), lr=1e-3, betas=(0.9, 0.95))
    held = dict((id(p), c) for p, c in copies)
    for step in range(4):
        g = torch.Generator(device="cuda").manual_seed(100 + step)
        for p, q in zip(ps, qs):
            grad = (torch.randn(p.shape, device="cuda", generator=g) * 0.1).to(torch.bfloat16)
            if id(p) in held:
                held[id(p)].grad = grad
            else:
                p.grad = grad.float()
            q.grad = grad.float()
        na, nb = (topt.clip_grad_norm(xs, 1.0, opt=o) for xs, o in ((ps, a), (qs, b)))
        assert na.item() == nb.item()  # the blocks' partial sums in the same order
        for o in (a, b):
            o.step()
            o.__dict__.pop("grad_scale", None)
            o.zero_grad()
    assert max(_rel(p, q) for p, q in zip(ps, qs)) < 1e-6
    assert all(torch.equal(c, p.detach().to(torch.bfloat16)) for p, c in copies)
    assert a._tables[0].mixed and all(c.addrs for c in a._tables.values())  # one launch a group wrote the copies


def test_a_gpu_run_takes_weight_copies_and_trains_the_same_curve(tmp_path):
    import tomllib

    from tests.helpers import losses, tiny_gpt
    from turbotrain.trainer import train

    for name, on in (("copies", "auto"), ("plain", "false")):
        train(tiny_gpt(tmp_path, "run.device=cuda", "train.steps=12", f"run.name={name!r}", "precision.dtype=bf16",
                       f"precision.weight_copies={on}"))
    cfg = tomllib.loads((tmp_path / "copies" / "config.toml").read_text())
    assert cfg["precision"]["weight_copies"] is True and cfg["train"]["optimizer_impl"] == "triton"
    got, ref = losses(tmp_path, "copies"), losses(tmp_path, "plain")
    assert len(got) == len(ref) == 12 and all(abs(x - y) <= 2e-3 * abs(y) for x, y in zip(got, ref)), (got, ref)
