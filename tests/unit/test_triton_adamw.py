"""TritonAdamW on a CPU: the kernels are replaced by the same block walk written in torch (reading the tables the
host builds, resolving their pointers to the tensors), so the host path — tables, caching, the scalars handed to the
kernel, the folded clip, the fallbacks — is checked against torch's foreach AdamW. The kernels themselves run in
tests/integration/test_triton_adamw_gpu.py."""
import math

import pytest
import torch

from turbotrain.accel import optim as topt
from turbotrain.accel import triton_adamw as ta
from turbotrain.errors import UserError


class _Launcher:
    """Stands in for a Triton kernel: `kernel[grid](*args, **meta)` walks the blocks in torch."""

    def __init__(self, fn, tensors):
        self.fn, self.by_addr = fn, tensors

    def __getitem__(self, grid):
        return lambda *args, **meta: self.fn(self.by_addr, grid, *args, **meta)


def _blocks(by_addr, grid, ptrs, numels, blk_tensor, first_blk, n_tensors, block):
    """(program, tensor index, element slice, row -> tensor) of each program, as the kernels' `_block` finds them."""
    assert grid == (len(blk_tensor),)
    for b in range(grid[0]):
        t = int(blk_tensor[b])
        start = (b - int(first_blk[t])) * block
        stop = min(start + block, int(numels[t]))
        assert 0 <= start < max(stop, 1)
        yield b, t, slice(start, stop), lambda row, t=t: by_addr[int(ptrs[row * n_tensors + t])]


def _adamw(by_addr, grid, ptrs, numels, blk_tensor, first_blk, n_tensors, flags, scale_ptr, decay, one_minus_b1,
           beta2, one_minus_b2, step_size, bc2_sqrt, eps, HAS_SCALE, MIXED, BLOCK, num_warps):
    for _, t, sl, at in _blocks(by_addr, grid, ptrs, numels, blk_tensor, first_blk, n_tensors, BLOCK):
        f = int(flags[t]) if MIXED else 0
        p, g, m, v = (at(r).data.view(-1) for r in range(4))  # through .data: raw writes, as the kernel's
        assert (g.dtype == torch.bfloat16) == bool(f & 2) and p.dtype == m.dtype == v.dtype == torch.float32
        g = g[sl].float()
        gs = g / scale_ptr if HAS_SCALE else g
        p[sl] *= decay
        m[sl] += one_minus_b1 * (gs - m[sl])
        v[sl] = v[sl] * beta2 + one_minus_b2 * gs * gs
        p[sl] -= step_size * (m[sl] / (v[sl].sqrt() / bc2_sqrt + eps))
        if f & 16:  # the layer's bf16 weight copy
            at(4).data.view(-1)[sl] = p[sl].to(torch.bfloat16)


def _sq_sum(by_addr, grid, ptrs, numels, blk_tensor, first_blk, n_tensors, flags, out, MIXED, BLOCK, num_warps):
    for b, t, sl, at in _blocks(by_addr, grid, ptrs, numels, blk_tensor, first_blk, n_tensors, BLOCK):
        x = at(0).view(-1)[sl]
        assert (x.dtype == torch.bfloat16) == (MIXED and bool(int(flags[t]) & 1))
        out[b] = x.float().square().sum()


@pytest.fixture
def emulated(monkeypatch):
    """The kernels emulated; every tensor the test registers can be found by its address."""
    tensors: dict[int, torch.Tensor] = {}
    monkeypatch.setattr(ta, "triton_problem", lambda device: None)
    monkeypatch.setattr(ta, "_kernels", lambda: (_Launcher(_adamw, tensors), _Launcher(_sq_sum, tensors)))
    monkeypatch.setattr(ta, "BLOCK", 64)  # several blocks and a tail in small tensors

    def register(opt):
        for group in opt.param_groups:
            for p in group["params"]:
                for t in (p, p.grad, *opt.state[p].values()):
                    if isinstance(t, torch.Tensor) and t.dim() and t.numel():
                        tensors[t.data_ptr()] = t
        for _, c in getattr(opt, "_pairs", ()):  # the layers' bf16 weight copies and their gradients
            for t in (c, c.grad):
                if isinstance(t, torch.Tensor) and t.dim() and t.numel():
                    tensors[t.data_ptr()] = t
    return register


SHAPES = [(3, 70), (130,), (64,), (1,), (5, 5)]  # tails, exact blocks, a single element


def _pair(seed=0, **kw):
    torch.manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]

    def groups(xs):
        return [{"params": [x for x in xs if x.dim() >= 2], "weight_decay": 0.1},
                {"params": [x for x in xs if x.dim() < 2], "weight_decay": 0.0}]
    a = ta.TritonAdamW(groups(ps), lr=1e-2, betas=(0.9, 0.95), **kw)
    b = torch.optim.AdamW(groups(qs), lr=1e-2, betas=(0.9, 0.95), foreach=True, **kw)
    return ps, qs, a, b


def _grads(ps, qs, step, only=None):
    g = torch.Generator().manual_seed(100 + step)
    for i, (p, q) in enumerate(zip(ps, qs)):
        grad = torch.randn(p.shape, generator=g)
        if only is None or i in only:
            p.grad, q.grad = grad.clone(), grad.clone()


def _step(opt, params, clip, register=None):
    """The trainer's order: the clip (folded into the kernel where the optimizer takes it), then the step."""
    if register:
        for group in opt.param_groups:  # a first step creates the state: register it before the kernel reads it
            for p in group["params"]:
                if getattr(opt, "grad_of", lambda p: p.grad)(p) is not None and not opt.state[p]:
                    opt.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),
                                        exp_avg_sq=torch.zeros_like(p))
        register(opt)
    norm = topt.clip_grad_norm(params, clip, opt=opt)
    opt.step()
    opt.__dict__.pop("grad_scale", None)
    return norm


def _both(a, ps, b, qs, steps, register):
    """The same steps through TritonAdamW `a` and torch's `b`: the parameters stay equal to fp32 rounding."""
    for step in steps:
        _grads(ps, qs, step)
        _step(a, ps, 0.5, register)
        _step(b, qs, 0.5)
        for p, q in zip(ps, qs):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("clip", [0.5, math.inf])
def test_kernel_path_matches_torch_foreach_adamw(emulated, clip):
    ps, qs, a, b = _pair()
    for step in range(5):
        _grads(ps, qs, step)
        na = _step(a, ps, clip, emulated)
        nb = _step(b, qs, clip)
        torch.testing.assert_close(na, nb, rtol=1e-6, atol=0)
        for p, q in zip(ps, qs):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert a.state_dict()["state"][0]["step"] == b.state_dict()["state"][0]["step"] == 5.0
    assert a._tables[0].addrs and a._tables[1].addrs  # the kernel took both groups


def test_tables_cover_every_element_once_and_are_rebuilt_only_on_change(emulated, monkeypatch):
    rows = [[torch.randn(s) for s in SHAPES]]
    cache = ta._TableCache()
    table = cache.get(rows)
    seen = [torch.zeros(t.numel(), dtype=torch.int64) for t in rows[0]]
    for _, t, sl, _ in _blocks({}, (table.n_blocks,), table.ptrs, table.numels, table.blk_tensor, table.first_blk,
                               table.n_tensors, ta.BLOCK):
        seen[t][sl] += 1
    assert all(bool((s == 1).all()) for s in seen)
    built = []
    monkeypatch.setattr(ta, "_to_device", lambda values, dtype, device: built.append(len(values)) or
                        torch.tensor(values, dtype=dtype))
    assert cache.get(rows) is cache and built == []  # same tensors: nothing rebuilt
    rows[0][1] = torch.randn(130)  # another tensor of the same size: the pointers only
    cache.get(rows)
    assert built == [len(SHAPES)]


def test_tensors_the_kernel_does_not_take_fall_back_to_torch(emulated):
    """A non-contiguous gradient: the step runs torch's foreach AdamW, the folded clip applied first."""
    ps, qs, a, b = _pair()
    for step in range(3):
        _grads(ps, qs, step)
        ps[0].grad = ps[0].grad.t().contiguous().t()  # same values, transposed layout
        _step(a, ps, 0.5, emulated)
        _step(b, qs, 0.5)
        for p, q in zip(ps, qs):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert not a._tables[0].addrs  # the kernel never took these tensors


def test_differing_step_counts_fall_back_to_torch(emulated):
    """A parameter that got no gradient for a step has a lower step count: one launch with one bias correction
    would be wrong for it, so those steps run torch's foreach AdamW (and stay equal to it)."""
    ps, qs, a, b = _pair()
    _grads(ps, qs, 0, only={0, 1, 2, 3})  # the last parameter has no gradient at step 1
    _step(a, ps, 0.5, emulated)
    _step(b, qs, 0.5)
    _both(a, ps, b, qs, range(1, 4), emulated)
    steps = [float(a.state[p]["step"]) for p in ps]
    assert steps == [4.0, 4.0, 4.0, 4.0, 3.0]


def test_state_dict_moves_between_triton_and_torch(emulated):
    ps, qs, a, b = _pair()
    for step in range(2):
        _grads(ps, qs, step)
        _step(a, ps, 0.5, emulated)
        _step(b, qs, 0.5)
    c = torch.optim.AdamW(b.param_groups, foreach=True)  # torch's, from TritonAdamW's checkpoint
    c.load_state_dict(a.state_dict())
    d = ta.TritonAdamW(a.param_groups)
    d.load_state_dict(b.state_dict())
    for (x, y) in ((a.state_dict(), c.state_dict()), (b.state_dict(), d.state_dict())):
        assert x["param_groups"] == y["param_groups"]
        for k in x["state"]:
            for name in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(x["state"][k][name], y["state"][k][name])


def test_the_trainers_load_keeps_the_kernel_it_built(emulated):
    """torch's load_state_dict takes the saved groups' foreach/fused flags: a checkpoint of another kernel would
    switch it. load_optimizer_state keeps this run's flags and puts the step counts where its kernel keeps them."""
    ps, qs, a, b = _pair()
    _grads(ps, qs, 0)
    _step(a, ps, 0.5, emulated)
    fused = torch.optim.AdamW([{"params": g["params"], "weight_decay": g["weight_decay"]} for g in b.param_groups],
                              lr=1e-2, betas=(0.9, 0.95), fused=True)  # fused on a CPU: torch has the kernel there
    topt.load_optimizer_state(fused, a.state_dict())
    assert all(g["fused"] and not g["foreach"] for g in fused.param_groups)
    a2 = ta.TritonAdamW([{"params": g["params"], "weight_decay": g["weight_decay"]} for g in a.param_groups])
    topt.load_optimizer_state(a2, fused.state_dict())
    assert all(g["foreach"] and not g["fused"] for g in a2.param_groups)
    assert all(st["step"].device.type == "cpu" and float(st["step"]) == 1.0 for st in a2.state.values())


def test_resuming_under_another_optimizer_impl(tmp_path):
    """A checkpoint written under one train.optimizer_impl resumes under another (a run's GPU default changed
    from fused to triton): before, torch's load switched the kernel to the saved one and a fused resume of a
    foreach checkpoint stopped with a traceback."""
    import subprocess
    import sys

    args = [sys.executable, "-m", "turbotrain", "train", "gpt-shakespeare", "checkpoint.every=2",
            f"run.out_dir={str(tmp_path)!r}", "run.name='x'", "model.args.n_layer=1", "model.args.n_embd=32",
            "model.args.n_head=2", "data.batch_size=2", "data.eval_batches=1"]
    first = subprocess.run([*args, "train.steps=2", 'train.optimizer_impl="foreach"'], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([*args, "train.steps=4", 'train.optimizer_impl="fused"'], capture_output=True, text=True)
    assert again.returncode == 0 and "resumed from step 2" in again.stdout, again.stderr[-2000:]
    assert "Traceback" not in again.stderr


def test_explicit_triton_where_it_cannot_run_is_one_error(tmp_path):
    from turbotrain.config import load_config
    from turbotrain.resolve import Facts, resolve

    cpu = Facts(device=torch.device("cpu"))
    for overrides, words in ((['train.optimizer_impl="triton"'], "run on a GPU"),
                             (['train.optimizer_impl="triton"', 'train.optimizer="sgd"'], "AdamW's kernel")):
        with pytest.raises(UserError, match=words):
            resolve(load_config("gpt-shakespeare", overrides), cpu)
    assert resolve(load_config("gpt-shakespeare", []), cpu).train.optimizer_impl == "foreach"


def test_auto_takes_triton_for_adamw_on_a_gpu_except_sharded(monkeypatch):
    monkeypatch.setattr(ta, "triton_problem", lambda device: None if device.type == "cuda" else "no GPU")
    gpu = torch.device("cuda")
    assert topt.auto_impl("adamw", gpu) == "triton"
    assert topt.auto_impl("adamw", gpu, sharded=True) == "fused"
    assert topt.auto_impl("sgd", gpu) == "fused"
    assert topt.auto_impl("adamw", torch.device("cpu")) == "foreach"


def test_triton_where_its_kernel_would_not_run_builds_torchs_and_says_so(monkeypatch, capsys):
    """Half-precision parameters, or an optimizer other than AdamW given to build_optimizer directly: the kernel
    "auto" takes without triton (foreach on this CPU), said."""
    monkeypatch.setattr(ta, "triton_problem", lambda device: None)
    opt = topt.build_optimizer(torch.nn.Linear(4, 4).to(torch.bfloat16), "adamw", 1e-3, 0.1, torch.device("cpu"),
                               "triton")
    assert type(opt) is torch.optim.AdamW and opt.defaults["foreach"]
    assert "weight is bfloat16" in capsys.readouterr().out
    for name, cls in (("adam", torch.optim.Adam), ("sgd", torch.optim.SGD)):
        opt = topt.build_optimizer(torch.nn.Linear(4, 4), name, 1e-3, 0.1, torch.device("cpu"), "triton")
        assert type(opt) is cls and "the kernel is AdamW's" in capsys.readouterr().out


def test_triton_takes_parameters_on_the_device_index_the_run_names(monkeypatch):
    """The trainer names "cuda" where the parameters are on "cuda:0": the same device (torch.device compares
    them unequal)."""
    monkeypatch.setattr(ta, "triton_problem", lambda device: None)
    opt = topt.build_optimizer(torch.nn.Linear(4, 4), "adamw", 1e-3, 0.1, torch.device("cpu", 0), "triton")
    assert type(opt) is ta.TritonAdamW


def test_a_kernel_that_fails_to_build_leaves_the_run_on_torchs_adamw(emulated, monkeypatch, capsys):
    """Triton compiles at the first launch, on the user's machine: where that fails (no C compiler for its launcher),
    the run goes on with torch's foreach AdamW and norm, said once. A failure after a kernel ran is the run's."""
    def broken(*args, **kwargs):
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.\nmore")
    monkeypatch.setattr(ta, "_kernels", lambda: (_Launcher(broken, {}), _Launcher(broken, {})))
    ps, qs, a, b = _pair()
    _both(a, ps, b, qs, range(3), emulated)
    out = capsys.readouterr().out
    assert out.count("failed to build here (RuntimeError: Failed to find C compiler") == 1
    a._built, a._broken = {"sq_sum", "adamw"}, ""  # the kernels ran before: a later failure is not hidden
    _grads(ps, qs, 3)
    with pytest.raises(RuntimeError, match="C compiler"):
        _step(a, ps, 0.5, emulated)


def test_a_resumed_fused_adamw_continues_the_kernels_steps(emulated):
    """The state TritonAdamW saved, loaded into torch's fused AdamW (on a CPU here) through the trainer's load:
    the next steps are the ones TritonAdamW takes itself."""
    import copy

    ps, qs, a, b = _pair()
    fused = torch.optim.AdamW([{"params": g["params"], "weight_decay": g["weight_decay"]} for g in b.param_groups],
                              lr=1e-2, betas=(0.9, 0.95), fused=True)
    for step in range(2):
        _grads(ps, qs, step)
        _step(a, ps, 0.5, emulated)
    topt.load_optimizer_state(fused, copy.deepcopy(a.state_dict()))  # as a resume reads it: a copy
    with torch.no_grad():
        for p, q in zip(ps, qs):
            q.copy_(p)
    _both(a, ps, fused, qs, range(2, 4), emulated)


def test_a_build_failing_after_one_group_stepped_is_the_runs_error(emulated, monkeypatch):
    """The second group's launch fails after the first group's ran (each group compiles a variant of its own): a
    fallback would step the first group twice, so the error is raised."""
    calls = []

    def second_fails(by_addr, grid, *args, **meta):
        calls.append(grid)
        if len(calls) == 2:
            raise RuntimeError("out of space in the triton cache")
        _adamw(by_addr, grid, *args, **meta)
    sq = ta._kernels()[1]
    monkeypatch.setattr(ta, "_kernels", lambda: (_Launcher(second_fails, sq.by_addr), sq))
    ps, qs, a, b = _pair()
    _grads(ps, qs, 0)
    for group in a.param_groups:  # the state, registered for the emulated kernel; no clip: adamw launches first
        for p in group["params"]:
            a.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    emulated(a)
    with pytest.raises(RuntimeError, match="triton cache"):
        a.step()
    assert len(calls) == 2 and all(float(a.state[p]["step"]) == 1.0 for p in a.param_groups[0]["params"])


def test_a_fallback_step_makes_the_next_kernel_step_check_step_counts_again(emulated):
    """One step where a parameter had no gradient and another's gradient did not fit the kernel (foreach for all):
    when the original tensors come back, their step counts differ, and one bias correction would be wrong."""
    ps, qs, a, b = _pair()
    _both(a, ps, b, qs, range(2), emulated)
    kept = [p.grad for p in ps]
    _grads(ps, qs, 2)
    ps[4].grad = qs[4].grad = None  # no gradient this step
    ps[0].grad = ps[0].grad.t().contiguous().t()  # a layout the kernel does not take
    _step(a, ps, 0.5, emulated)
    _step(b, qs, 0.5)
    g = torch.Generator().manual_seed(7)
    for p, q, k in zip(ps, qs, kept):  # the old gradient tensors again, new values
        k.copy_(torch.randn(k.shape, generator=g))
        p.grad, q.grad = k, k.clone()
    _step(a, ps, 0.5, emulated)
    _step(b, qs, 0.5)
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_auto_records_the_kernel_that_runs(monkeypatch):
    """"auto" on a GPU: triton for adamw, but fused where the build would fall back to it (channels_last conv
    weights, half-precision parameters), so config.toml names the kernel that runs."""
    from turbotrain.config import load_config
    from turbotrain.resolve import Facts, resolve

    monkeypatch.setattr(ta, "triton_problem", lambda device: None if device.type == "cuda" else "no GPU")
    gpu = torch.device("cuda")
    cfg = load_config("gpt-shakespeare", ['compile.enabled=false', 'data.pin_memory=false'])
    assert resolve(cfg, Facts(device=gpu)).train.optimizer_impl == "triton"
    assert resolve(cfg, Facts(device=gpu, fp32_params=False)).train.optimizer_impl == "fused"
    assert resolve(cfg, Facts(device=gpu, has_conv=True)).train.optimizer_impl == "fused"  # channels_last: auto on
