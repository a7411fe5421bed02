"""Red team of FusedSequential (accel/convnet/bn_relu_pool.py), activation checkpointing's wrappers
(accel/activation_ckpt.py) and giving the user's model back after a run (pipeline.give_back, prepare.py).

On a CPU a FusedSequential must be nn.Sequential: every FusedSequential test compares against the same torch
model. The `emulated_gpu` fixture stands in CPU versions of the Triton launchers and of `fast_path` (everything
else, the decision `_fusible`/`_fused`, the custom op, its autograd and the running-stat update, is the real
code), so the fused path's decisions can be checked without a GPU. Trainer tests make the convnet rewrite act as
on a GPU (see tests/faults/test_fused_stem_redteam.py).
"""
import functools
import inspect
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import turbotrain.prepare as prepare_mod
import turbotrain.trainer as trainer_mod
from tests.faults.fused_common import fused_cfg as _cfg
from tests.faults.fused_common import module_types as _types
from tests.faults.fused_common import small_net as _net
from tests.faults.fused_common import train as _train
from turbotrain.accel.activation_ckpt import (
    _checkpointed,
    apply_activation_checkpointing,
    remove_activation_checkpointing,
)
from turbotrain.accel.convnet import bn_relu_pool, max_pool
from turbotrain.accel.convnet.bn_relu_pool import FusedSequential, set_fused

# ------------------------------------------------------------------ CPU stand-ins of the Triton launchers

def _batch_stats(x):
    var, mean = torch.var_mean(x.float(), dim=(0, 2, 3), correction=0)
    return mean, var


def _fwd(x, mean, var, weight, bias, eps, out, offsets, xmax, kernel, stride, padding):
    sh = (1, -1, 1, 1)
    y = (x.float() - mean.view(sh)) * torch.rsqrt(var + eps).view(sh) * weight.float().view(sh) + bias.float().view(sh)
    out.copy_(F.max_pool2d(y.to(x.dtype).relu(), kernel, stride, padding))
    offsets.zero_()
    xmax.zero_()


def _bwd(grad, offsets, x, xmax, mean, var, weight, bias, eps, batch_stats, dx, kernel, stride, padding):
    sh, dims = (1, -1, 1, 1), (0, 2, 3)
    rstd = torch.rsqrt(var + eps).view(sh)
    yh = (x.float() - mean.view(sh)) * rstd
    z = yh * weight.float().view(sh) + bias.float().view(sh)
    r = z.to(x.dtype).relu()
    _, idx = torch.ops.aten.max_pool2d_with_indices(r, kernel, stride, padding)
    dr = torch.ops.aten.max_pool2d_with_indices_backward(grad.to(r.dtype), r, kernel, stride, padding, [1, 1],
                                                         False, idx)
    dz = dr.float() * (z > 0)
    dw, db, dyh = (dz * yh).sum(dims), dz.sum(dims), dz * weight.float().view(sh)
    if batch_stats:
        n = x.numel() // x.shape[1]
        dx.copy_(rstd / n * (n * dyh - dyh.sum(dims, keepdim=True) - yh * (dyh * yh).sum(dims, keepdim=True)))
    else:
        dx.copy_(dyh * rstd)
    return dw, db


def _fast_path_on_cpu(x, kernel, stride, padding, dilation, ceil_mode):
    return (x.dim() == 4 and x.numel() > 0 and x.dtype == torch.float32 and not ceil_mode
            and x.is_contiguous(memory_format=torch.channels_last)
            and all(0 <= p <= k // 2 for p, k in zip(padding, kernel)) and min(stride) > 0)


@pytest.fixture
def emulated_gpu(monkeypatch, kernels):
    """The list of fused forwards launched (one entry per launch)."""
    launches = []

    def forward(*a):
        launches.append(a[0].shape)
        _fwd(*a)

    launchers = types.SimpleNamespace(batch_stats=_batch_stats, bn_relu_pool_forward=forward,
                                      bn_relu_pool_backward=_bwd)
    monkeypatch.setattr(max_pool, "kernels", lambda: launchers)
    monkeypatch.setattr(max_pool, "fast_path", _fast_path_on_cpu)
    return launches


# ------------------------------------------------------------------ helpers

def _stem(relu_inplace=False):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=relu_inplace),
                         nn.MaxPool2d(3, 2, 1))


def _pair(**kw):
    ref, model = _stem(**kw), _stem(**kw)
    assert set_fused(model, True) == 1
    return ref, model


def _x(*shape, cl=False):
    x = torch.randn(*(shape or (2, 3, 9, 10)), generator=torch.Generator().manual_seed(3))
    return x.contiguous(memory_format=torch.channels_last) if cl else x


def _same_state(a, b, exact=True):
    for (name, u), v in zip(a.state_dict().items(), b.state_dict().values()):
        ok = torch.equal(u, v) if exact else torch.allclose(u.float(), v.float(), rtol=1e-4, atol=1e-5)
        assert ok, name


class _SharedBlocks(nn.Module):
    """Weights shared across depth (ALBERT-style `ModuleList([block] * n)`)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 8, 3, 2, 1)
        block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.Tanh())
        self.blocks = nn.ModuleList([block] * 3)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean((2, 3)))






def _wrap_depth(m):
    d, f = 0, vars(m).get("forward")
    while isinstance(f, functools.partial) and f.func is _checkpointed:
        d, f = d + 1, f.args[1]
    return d


def _snapshot(model):
    return [(name, type(m), sorted(vars(m)), list(m._forward_hooks.values()), list(m._forward_pre_hooks.values()),
             vars(m).get("forward")) for name, m in model.named_modules()]


# ====================================================== bugs (each fails today)

def test_fused_sequential_takes_its_input_by_torchs_keyword(kernels):
    # nn.Sequential.forward(self, input): `seq(input=x)` (or a with_kwargs pre-hook handing it on by name) works
    ref, model = _pair()
    x = _x()
    names = [[*inspect.signature(f).parameters] for f in (type(model).forward, nn.Sequential.forward)]
    assert names[0] == names[1]
    assert torch.equal(model(input=x), ref(input=x))


def test_fused_path_honours_a_forward_a_child_has_of_its_own(emulated_gpu):
    # a library's hook (accelerate-style `module.forward = ...`) on the batch norm: torch's Sequential calls it;
    # the fused path computes pool(relu(bn(x))) with BatchNorm2d's own math and never calls it
    x = _x(cl=True)
    ref, model = _pair()
    for m in (ref, model):
        m.eval()
        bn = m[1]
        bn.forward = lambda t, bn=bn: nn.BatchNorm2d.forward(bn, t) + 1.0
    assert torch.allclose(model(x), ref(x), atol=1e-5)


def test_checkpointing_a_block_that_starts_with_an_inplace_relu(tmp_path):
    # a pre-activation block (ReLU(inplace=True) first, then conv) writes its input in place; the skip rule only
    # looks at the block's own `inplace`, so it is wrapped and backward fails where torch's model trains
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.Sequential(nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3)),
                             nn.Sequential(nn.ReLU(inplace=True), nn.Conv2d(8, 4, 3)), nn.Flatten())

    ref, model = build(), build()
    apply_activation_checkpointing(model, "full")
    x = _x(2, 3, 10, 10)
    ref(x).square().sum().backward()
    model(x).square().sum().backward()
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad)


def test_a_block_with_an_inplace_flag_that_does_not_write_its_input_is_still_checkpointed():
    # `inplace` as a block's own setting for its inner activations (they write the conv's output, not the block's
    # input): skipped, so activation checkpointing silently saves nothing for such a model
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.inplace, self.conv, self.act = True, nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.conv(x))

    model = nn.Sequential(Block(), Block(), Block())
    assert apply_activation_checkpointing(model, "full") == 3


def test_shared_blocks_are_wrapped_once_and_come_off():
    # ModuleList([block] * n): the same module n times in the blocks; wrapped n deep (n nested checkpoints,
    # recompute grows with n), and remove takes one level off
    model = _SharedBlocks()
    apply_activation_checkpointing(model, "full")
    assert _wrap_depth(model.blocks[0]) == 1
    remove_activation_checkpointing(model)
    assert _wrap_depth(model.blocks[0]) == 0


def test_train_gives_back_shared_blocks_without_checkpoint_wrappers(tmp_path):
    model = _SharedBlocks()
    _train(_cfg(tmp_path, 'memory.activation_checkpointing="full"', "kernels.convnet=false", "train.steps=1"),
           model=model)
    assert not any("forward" in vars(m) for m in model.modules())


def test_summary_counts_the_blocks_actually_checkpointed(tmp_path):
    # the summary counts the wrappers put on (all 7 layers of _net, its ReLU(inplace=True) on copies of its input)
    s = _train(_cfg(tmp_path, 'memory.activation_checkpointing="full"', "kernels.convnet=false", "train.steps=1"),
               model=_net())
    assert s["checkpointed_blocks"] == 7


def test_train_leaves_batchnorm_statistics_of_the_steps_only(tmp_path):
    # prepare's FLOP count (_step_cost → flops_per_sample) runs a training forward on the user's model and does
    # not restore its buffers (the contract's check does): after 2 steps num_batches_tracked is 3
    model = _net()
    _train(_cfg(tmp_path, "kernels.convnet=false"), model=model)
    assert model[1].num_batches_tracked.item() == 2


def test_a_prepare_interrupted_after_the_lock_releases_the_run_dir(tmp_path, monkeypatch, gpu_rewrites):
    # Ctrl-C (or an error) between RunDir.open() and `with _undone_on_failure` (check_shared_run_dir,
    # Checkpointer, open_compile_cache): Run is never built, the lock stays held for the rest of the process
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_mod, "open_compile_cache", interrupted)
    model = _net()
    with pytest.raises(KeyboardInterrupt):
        _train(_cfg(tmp_path, "train.steps=1"), model=model)
    monkeypatch.undo()
    monkeypatch.setattr(bn_relu_pool, "available", lambda: True)
    _train(_cfg(tmp_path, "train.steps=1"), model=model)  # same process, same run.name: must not be "in use"


def test_train_with_block_compile_gives_back_uncompiled_blocks(tmp_path):
    # compile.scope="blocks" calls block.compile() on the user's blocks (_compiled_call_impl); give_back leaves it,
    # so the user's model keeps running through torch.compile after train()
    model = _net()
    _train(_cfg(tmp_path, "compile.enabled=true", 'compile.scope="blocks"', 'compile.backend="eager"',
                "kernels.convnet=false", "train.steps=1"), model=model)
    assert [m for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None] == []


def test_train_with_channels_last_gives_back_contiguous_parameters(tmp_path):
    # memory.channels_last (auto: on for any conv model on a GPU) converts the user's parameters in place and
    # give_back leaves them NHWC: e.g. safetensors refuses the state_dict afterwards
    model = _net()
    _train(_cfg(tmp_path, "memory.channels_last=true", "kernels.convnet=false", "train.steps=1"), model=model)
    assert all(p.is_contiguous() for p in model.parameters())


# ====================================================== guards (pass today)

def test_fused_matches_sequential_with_global_and_container_hooks(kernels):
    ref, model = _pair()
    seen = {"ref": [], "model": []}
    for name, m in (("ref", ref), ("model", model)):
        m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
        m.register_forward_hook(lambda mod, args, out: out - 1)
        h1 = nn.modules.module.register_module_forward_hook(
            lambda mod, args, out, name=name: seen[name].append((type(mod).__name__.replace("Fused", ""),
                                                                 tuple(out.shape))))
        h2 = nn.modules.module.register_module_forward_pre_hook(lambda mod, args: None)
        try:
            y = m(_x())
        finally:
            h1.remove(), h2.remove()
        seen[name].append(y)
    assert seen["model"][:-1] == seen["ref"][:-1] and len(seen["ref"]) == 6
    assert torch.equal(seen["model"][-1], seen["ref"][-1])
    _same_state(ref, model)


@pytest.mark.parametrize("edit", [
    lambda s: s.append(nn.Flatten()), lambda s: s.insert(2, nn.Identity()), lambda s: s.extend([nn.Tanh()]),
    lambda s: s.pop(2), lambda s: s.__delitem__(1), lambda s: s.__setitem__(2, nn.GELU()),
    lambda s: s.__iadd__(nn.Sequential(nn.Tanh())),
])
def test_sequential_edits_compute_as_torch(edit, kernels):
    ref, model = _pair()
    edit(ref), edit(model)
    assert len(ref) == len(model) and [type(m) for m in ref] == [type(m) for m in model]
    assert torch.equal(model(_x()), ref(_x()))
    _same_state(ref, model)


@pytest.mark.parametrize("make,shape", [(lambda s: s[1:], (2, 8, 9, 10)), (lambda s: s[:3], (2, 3, 9, 10)),
                                        (lambda s: s + nn.Sequential(nn.Tanh()), (2, 3, 9, 10)),
                                        (lambda s: s[1:] * 2, (2, 8, 20, 20))])
def test_derived_sequentials_compute_as_torch(make, shape, kernels):
    ref, model = _pair()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    assert torch.equal(make(model)(x), make(ref)(x))
    _same_state(ref, model)


def test_iteration_names_and_state_dict_are_torchs(kernels):
    ref, model = _pair()
    assert [type(m) for m in model] == [type(m) for m in ref] and len(model) == len(ref) == 4
    assert [n for n, _ in model.named_modules()] == [n for n, _ in ref.named_modules()]
    assert [type(m) for m in reversed(model)] == [type(m) for m in reversed(ref)]
    assert model.state_dict().keys() == ref.state_dict().keys()
    assert repr(model).replace("FusedSequential(", "Sequential(", 1) == repr(ref)


def test_half_and_eval_match_torch(kernels):
    ref, model = _pair()
    ref, model = ref.half().eval(), model.half().eval()
    assert type(model) is FusedSequential
    assert torch.equal(model(_x().half()), ref(_x().half()))


def test_functional_call_matches_torch(kernels):
    ref, model = _pair()
    params = {k: v * 1.5 for k, v in ref.state_dict().items() if v.is_floating_point()}
    assert torch.equal(torch.func.functional_call(model, params, (_x(),)),
                       torch.func.functional_call(ref, params, (_x(),)))


def test_torch_compile_fullgraph_of_a_fused_model_on_cpu(kernels):
    ref, model = _pair()
    cm = torch.compile(model, backend="aot_eager", fullgraph=True)
    for training in (True, False):
        ref.train(training), model.train(training)
        a, b = _x().requires_grad_(), _x().requires_grad_()
        ya, yb = ref(a), cm(b)
        torch.testing.assert_close(yb, ya)
        ya.square().sum().backward()
        yb.square().sum().backward()
        torch.testing.assert_close(b.grad, a.grad)
    _same_state(ref, model, exact=False)


def test_emulated_fused_path_matches_torch_eager_and_compiled(emulated_gpu):
    # the stand-in validates itself (it must fuse and match torch's layers), and the real _fused around it:
    # batch/running statistics, momentum rule, num_batches_tracked, grads, under torch.compile too
    def run(m, compiled):
        m = m.to(memory_format=torch.channels_last)
        f = torch.compile(m, backend="aot_eager", fullgraph=True) if compiled else m
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        outs = []
        for training in (True, True, False):
            m.train(training)
            a = _x(cl=True).requires_grad_()
            y = f(a)
            y.square().sum().backward()
            outs += [y.detach(), a.grad]
            opt.step(), opt.zero_grad()
        return outs, m

    want, ref = run(_stem(), False)
    for compiled in (False, True):
        model = _stem()
        set_fused(model, True)
        emulated_gpu.clear()
        got, model = run(model, compiled)
        assert len(emulated_gpu) == 3  # the fused op served every call
        for a, b in zip(want, got):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        _same_state(ref, model, exact=False)


def test_emulated_fused_path_steps_aside_for_child_hooks(emulated_gpu):
    ref, model = _pair()
    for m in (ref, model):
        m[2].register_forward_hook(lambda mod, i, o: o * 0.5)
    x = _x(cl=True)
    emulated_gpu.clear()
    torch.testing.assert_close(model(x), ref(x))
    assert emulated_gpu == []


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_ac_over_a_fused_stem_matches_torch(mode, kernels):
    ref, model = _pair()
    apply_activation_checkpointing(model, mode)
    x = _x().requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    ref.eval(), model.eval()  # eval: BatchNorm's recompute moves no statistics
    ref(x).square().sum().backward()
    model(x2).square().sum().backward()
    torch.testing.assert_close(x2.grad, x.grad)
    remove_activation_checkpointing(model)
    set_fused(model, False)
    assert not any("forward" in vars(m) for m in model.modules()) and _types(model) == _types(ref)


def test_blocks_own_forward_and_inplace_false_flag():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=False), nn.Linear(4, 4))
    own = model[2].forward = functools.partial(nn.Linear.forward, model[2])
    assert apply_activation_checkpointing(model, "selective") == 3
    assert apply_activation_checkpointing(model, "full") == 3
    assert _wrap_depth(model[2]) == 1 and _wrap_depth(model[1]) == 1
    remove_activation_checkpointing(model)
    assert vars(model[2])["forward"] is own and "forward" not in vars(model[1])


def test_train_twice_gives_back_the_model_as_built(tmp_path, gpu_rewrites):
    # fusion + AC on, twice on the same model: classes, instance attributes, hooks and a block's own forward kept
    model = _net()
    hook = model[1].register_forward_hook(lambda m, i, o: None)
    own = model[6].forward = functools.partial(nn.Linear.forward, model[6])
    before = _snapshot(model)
    for run in ("a", "b"):
        _train(_cfg(tmp_path / run, 'memory.activation_checkpointing="full"', "train.steps=1"), model=model)
        assert _snapshot(model) == before
    assert vars(model[6])["forward"] is own
    hook.remove()


def test_interrupt_in_the_first_step_gives_back_and_a_rerun_works(tmp_path, monkeypatch, gpu_rewrites):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    real = trainer_mod.first_train_step
    monkeypatch.setattr(trainer_mod, "first_train_step", interrupted)
    model, ref = _net(), _net()
    with pytest.raises(KeyboardInterrupt):
        _train(_cfg(tmp_path, 'memory.activation_checkpointing="full"', "train.steps=1"), model=model)
    assert _types(model) == _types(ref) and not any("forward" in vars(m) for m in model.modules())
    monkeypatch.setattr(trainer_mod, "first_train_step", real)
    _train(_cfg(tmp_path, 'memory.activation_checkpointing="full"', "train.steps=1"), model=model)
    assert _types(model) == _types(ref)


def test_a_prepare_failing_after_the_techniques_gives_back_and_unlocks(tmp_path, monkeypatch, gpu_rewrites):
    def failing(*a, **k):
        raise RuntimeError("late failure for the test")

    monkeypatch.setattr(prepare_mod, "_measured_attention", failing)
    model, ref = _net(), _net()
    with pytest.raises(RuntimeError, match="late failure"):
        _train(_cfg(tmp_path, 'memory.activation_checkpointing="selective"', "train.steps=1"), model=model)
    assert _types(model) == _types(ref) and not any("forward" in vars(m) for m in model.modules())
    monkeypatch.setattr(prepare_mod, "_measured_attention", lambda cfg, tr, sample: cfg)
    _train(_cfg(tmp_path, "train.steps=1"), model=model)  # same run dir: the lock was released
