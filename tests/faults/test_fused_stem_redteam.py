"""Red team of kernels.convnet's fused BatchNorm2d → ReLU → MaxPool2d (accel/convnet/bn_relu_pool.py).

On a CPU the fused layer runs torch's own three layers, so a fused model must behave exactly as the model the user
built: every test compares against that plain torch model (or checks the user's model after a run). Fusing needs
triton; these tests stand it in (`available` → True). Trainer tests also pretend the device is a GPU for the
convnet rewrite only (set_convnet_kernels only reads device.type), so a CPU run goes through FusedSequential.
"""
import copy
import io
import pickle

import pytest
import torch
from torch import nn

from tests.faults.fused_common import fused_cfg as _cfg
from tests.faults.fused_common import module_types as _types
from tests.faults.fused_common import small_net as _net
from tests.faults.fused_common import train as _train
from turbotrain.accel.activation_ckpt import apply_activation_checkpointing
from turbotrain.accel.convnet import bn_relu_pool, set_convnet_kernels
from turbotrain.accel.convnet.bn_relu_pool import FusedSequential, set_fused
from turbotrain.callbacks import Callback
from turbotrain.models.resnet import build as build_resnet


def _stem(relu_inplace=True, **pool):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=relu_inplace),
                         nn.MaxPool2d(**{"kernel_size": 3, "stride": 2, "padding": 1, **pool}))


def _pair(**pool):
    """(torch's model, the same model fused), equal weights."""
    ref, model = _stem(**pool), _stem(**pool)
    assert set_fused(model, True) == 1
    return ref, model


def _x(*shape):
    return torch.randn(*(shape or (2, 3, 9, 10)), generator=torch.Generator().manual_seed(3))






# ====================================================== found by the red team (each failed before its fix)

def test_sync_batchnorm_conversion_after_fusion_keeps_the_relu_and_the_pool(kernels):
    # apply_ddp (parallel.sync_batchnorm) runs convert_sync_batchnorm after the rewrite (pipeline step 8 after 5):
    # the fused BN becomes a plain SyncBatchNorm while the ReLU and the pool still pass their input through
    ref, model = _pair()
    ref = nn.SyncBatchNorm.convert_sync_batchnorm(ref).eval()
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).eval()
    x = _x()
    assert model(x).shape == ref(x).shape == (2, 8, 5, 5)
    assert torch.equal(model(x), ref(x))


def test_activation_checkpointing_after_fusion_leaves_a_working_model_once_unfused(kernels):
    # apply_activation_checkpointing wraps each block's *bound* forward (an instance attribute): applied after the
    # fusion it keeps the fused forward after set_fused(model, False)
    ref, model = _pair()
    apply_activation_checkpointing(model, "full")  # the longest Sequential: the stem's own layers are the blocks
    set_fused(model, False)
    x = _x()
    assert torch.equal(model(x), ref(x))


def test_train_with_activation_checkpointing_gives_back_a_working_model(tmp_path, gpu_rewrites):
    model, ref = _net(), _net()
    _train(_cfg(tmp_path, 'memory.activation_checkpointing="full"'), model=model)
    assert _types(model) == _types(ref)
    ref.load_state_dict(model.state_dict())
    model.eval(), ref.eval()
    x = _x(2, 3, 32, 32)
    assert torch.equal(model(x), ref(x))


def test_a_run_that_fails_in_prepare_gives_back_the_users_layers(tmp_path, gpu_rewrites):
    # prepare() rewrites the model (build_trainee) and then fails (here: resume finds the run already done);
    # Run is never built, so Run.close never restores the user's model
    from turbotrain.errors import UserError

    _train(_cfg(tmp_path, "train.steps=1", "checkpoint.every=1"), model=_net())
    model = _net()
    with pytest.raises(UserError, match="already reached step 1"):
        _train(_cfg(tmp_path, "train.steps=1", "checkpoint.every=1"), model=model)
    assert _types(model) == _types(_net())  # not left as SpaceToDepthConv2d, FusedSequential


def test_forward_hooks_registered_after_fusion_see_torchs_activations(kernels):
    ref, model = _pair()
    seen = {"ref": [], "model": []}
    for name, m in (("ref", ref), ("model", model)):
        m[1].register_forward_hook(lambda mod, i, o, name=name: seen[name].append(("bn", tuple(o.shape))))
        m[2].register_forward_hook(lambda mod, i, o, name=name: seen[name].append(("relu", tuple(o.shape))))
        m(_x())
    assert seen["model"] == seen["ref"] == [("bn", (2, 8, 9, 10)), ("relu", (2, 8, 9, 10))]


def test_a_callbacks_activation_hook_sees_the_batch_norms_output(tmp_path, gpu_rewrites):
    # callbacks get the model (State.model) after the rewrite: a hook they add sees what the trainer made of it
    class BNShapes(Callback):
        shapes = []

        def on_train_start(self, state):
            state.model[1].register_forward_hook(lambda m, i, o: self.shapes.append(tuple(o.shape)))

    _train(_cfg(tmp_path), model=_net(), callbacks=[BNShapes()])
    assert BNShapes.shapes and set(BNShapes.shapes) == {(4, 8, 16, 16)}  # the BN's output, not the pool's (8×8)


def test_a_sequential_sliced_by_its_parents_forward_computes_the_same(kernels):
    # U-Net encoder: the skip is taken before the pool; the parent calls slices of the Sequential
    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = _stem()

        def forward(self, x):
            skip = self.enc[:3](x)  # conv, bn, relu
            down = self.enc[3:](skip)  # the pool
            return skip.mean((2, 3)) + down.amax((2, 3))

    torch.manual_seed(0)
    ref, model = Encoder(), Encoder()
    set_fused(model, True)
    assert torch.equal(model(_x()), ref(_x()))


def test_replacing_the_pool_after_fusion_drops_the_pool(kernels):
    ref, model = _pair()
    ref[3] = nn.Identity()
    model[3] = nn.Identity()  # e.g. the CIFAR change to a ResNet stem, made on a model once fused
    assert torch.equal(model(_x()), ref(_x()))


def test_fx_symbolic_trace_of_a_fused_model(kernels):
    ref, model = _pair()
    graph = torch.fx.symbolic_trace(model)
    assert torch.equal(graph(_x()), ref(_x()))


def test_torchscript_of_a_fused_model(kernels):
    ref, model = _pair()
    ref.eval(), model.eval()
    torch.jit.script(ref)
    scripted = torch.jit.script(model)
    assert torch.equal(scripted(_x()), ref(_x()))


def test_a_zero_stride_pool_is_torchs_error(kernels):
    # a stride of 0 is not "the kernel's" (None or () are): torch refuses it
    ref, model = _stem(stride=0), _stem(stride=0)
    assert set_fused(model, True) == 0
    with pytest.raises(RuntimeError, match="stride should not be zero"):
        ref(_x())
    with pytest.raises(RuntimeError, match="stride should not be zero"):
        model(_x())


# ====================================================== guards

@pytest.mark.parametrize("shape,training,error", [
    ((3, 9, 10), True, "expected 4D input"),  # unbatched
    ((1, 8, 1, 1), True, "Expected more than 1 value per channel"),  # one value per channel
    ((2, 4, 6, 6), True, "running_mean should contain 4 elements not 8"),
    ((2, 4, 6, 6), False, "running_mean should contain 4 elements not 8"),
])
def test_errors_are_torchs(shape, training, error, kernels):
    ref, model = _pair()
    for m in (ref[1], model[1]):
        m.train(training)
        with pytest.raises((RuntimeError, ValueError), match=error):
            m(torch.randn(shape))


@pytest.mark.parametrize("shape,training", [((1, 8, 1, 1), False), ((0, 8, 6, 6), True), ((0, 8, 6, 6), False),
                                            ((1, 8, 1, 2), True)])
def test_edge_batches_match_torch(shape, training, kernels):
    ref, model = _pair()
    x = torch.randn(shape)
    want = ref[3](ref[2](ref[1].train(training)(x.clone())))
    got = model[3](model[2](model[1].train(training)(x.clone())))
    assert got.shape == want.shape and torch.equal(got, want)
    for (name, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


def test_copies_pickles_and_saves_keep_the_fused_layer_and_can_unfuse(kernels):
    ref, model = _pair()
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    copies = [copy.deepcopy(model), pickle.loads(pickle.dumps(model)), torch.load(buf, weights_only=False)]
    x = _x()
    for c in copies:
        assert type(c) is FusedSequential and torch.equal(c.eval()(x), ref.eval()(x))
        set_fused(c, False)
        assert _types(c) == _types(ref)
        assert torch.equal(c(x), ref(x))
    assert type(model) is FusedSequential  # the original untouched


def test_state_dict_loads_both_ways(kernels):
    ref, model = _pair()
    ref.train()(_x())  # ref's running stats and num_batches_tracked move
    model.load_state_dict(ref.state_dict())
    assert model.state_dict().keys() == ref.state_dict().keys()
    for (name, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    fresh = _stem()
    fresh.load_state_dict(model.state_dict())


@pytest.mark.parametrize("move", [lambda m: m.double(), lambda m: m.to(memory_format=torch.channels_last),
                                  lambda m: m.to(torch.bfloat16)])
def test_dtype_and_memory_format_moves(move, kernels):
    ref, model = _pair()
    ref, model = move(ref), move(model)
    assert type(model) is FusedSequential
    x = _x().to(next(ref.parameters()).dtype).contiguous(memory_format=torch.channels_last)
    for training in (True, False, True):
        ref.train(training), model.train(training)
        assert torch.equal(model(x), ref(x))
    for (name, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


def test_gradients_and_running_stats_over_train_eval_switches(kernels):
    ref, model = _pair(relu_inplace=False)
    for training in (True, False, True, True, False):
        ref.train(training), model.train(training)
        a, b = _x().requires_grad_(), _x().requires_grad_()
        ya, yb = ref(a), model(b)
        assert torch.equal(ya, yb)
        ya.square().sum().backward()
        yb.square().sum().backward()
        assert torch.equal(a.grad, b.grad)
        for (name, p), q in zip(ref.named_parameters(), model.parameters()):
            assert torch.equal(p.grad, q.grad), name
    for (name, u), v in zip(ref.state_dict().items(), model.state_dict().values()):
        assert torch.equal(u, v), name
    assert model[1].num_batches_tracked.item() == 3


def test_nested_sequentials_and_fusing_twice(kernels):
    model = nn.Sequential(nn.Sequential(_stem(), nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2))))
    ref = copy.deepcopy(model)
    assert set_fused(model, True) == 2
    assert set_fused(model, True) == 2
    assert sum(type(m) is FusedSequential for m in model.modules()) == 2
    model.eval(), ref.eval()
    assert torch.equal(model(_x()), ref(_x()))
    set_fused(model, False)
    assert _types(model) == _types(ref)


class _MyBN(nn.BatchNorm2d):
    pass


class _MyReLU(nn.ReLU):
    pass


class _MyPool(nn.MaxPool2d):
    pass


def _registered_twice():
    seq = nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    return nn.Sequential(seq, seq)


def _pool_shared_elsewhere():
    seq = nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    return nn.ModuleDict({"a": seq, "b": nn.Sequential(nn.Conv2d(8, 8, 1), seq[2])})


@pytest.mark.parametrize("build", [
    lambda: nn.Sequential(nn.SyncBatchNorm(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1)),
    lambda: nn.Sequential(_MyBN(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1)),
    lambda: nn.Sequential(nn.BatchNorm2d(8), _MyReLU(), nn.MaxPool2d(3, 2, 1)),
    lambda: nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), _MyPool(3, 2, 1)),
    lambda: nn.Sequential(nn.BatchNorm1d(8), nn.ReLU(), nn.MaxPool1d(3, 2, 1)),
    lambda: nn.Sequential(nn.BatchNorm3d(8), nn.ReLU(), nn.MaxPool3d(3, 2, 1)),
])
def test_structures_not_fused(build, kernels):
    model = build()
    assert set_fused(model, True) == 0
    assert not any(type(m) is FusedSequential for m in model.modules())


@pytest.mark.parametrize("build", [_registered_twice, _pool_shared_elsewhere])
def test_modules_used_in_two_places_compute_the_same_fused(build, kernels):
    # the Sequential's forward is what runs the three in a row: any other use of a child calls it as torch's
    torch.manual_seed(0)
    ref = build()
    model = copy.deepcopy(ref)
    assert set_fused(model, True) == 1
    x = torch.randn(2, 8, 9, 10)
    if isinstance(ref, nn.ModuleDict):
        pairs = [(ref["a"](x), model["a"](x)), (ref["b"](x), model["b"](x))]
    else:
        pairs = [(ref(x), model(x))]
    for want, got in pairs:
        assert torch.equal(got, want)


@pytest.mark.parametrize("bn", [dict(momentum=None), dict(affine=False), dict(track_running_stats=False)])
def test_eval_then_train_with_bn_variants(bn, kernels):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.BatchNorm2d(3, **bn), nn.ReLU(), nn.MaxPool2d(2))
    model = copy.deepcopy(ref)
    assert set_fused(model, True) == 1
    for training in (False, True, True, False):
        ref.train(training), model.train(training)
        assert torch.equal(model(_x()), ref(_x()))
    for (name, u), v in zip(ref.state_dict().items(), model.state_dict().values()):
        assert torch.equal(u, v), name


def test_jit_trace_and_torch_export_on_cpu(kernels):
    ref, model = _pair()
    ref.eval(), model.eval()
    x = _x()
    assert torch.equal(torch.jit.trace(model, x)(x), ref(x))
    assert torch.equal(torch.export.export(model, (x,)).module()(x), ref(x))


def test_resnet_stem_fused_trains_like_torch(kernels):
    torch.manual_seed(0)
    ref = build_resnet(depth=50, num_classes=10, base_width=4)
    model = copy.deepcopy(ref)
    assert set_fused(model, True) == 1 and type(model.stem) is FusedSequential
    outs = []
    for m in (ref, model):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        got = []
        for _ in range(2):
            y = m(_x(4, 3, 32, 32))
            y.square().mean().backward()
            opt.step()
            opt.zero_grad()
            got.append(y.detach())
        got.append(m.eval()(_x(2, 3, 32, 32)).detach())
        outs.append(got)
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    for (name, u), v in zip(ref.state_dict().items(), model.state_dict().values()):
        assert torch.equal(u, v), name


def test_convnet_kernels_on_a_gpu_device_without_pool_triton_fuse_then_restore(kernels, capsys):
    model = build_resnet(depth=50, num_classes=10, base_width=4)
    before = _types(model)
    set_convnet_kernels(model, True, torch.device("cuda"))
    assert type(model.stem) is FusedSequential and type(model.stem[1]) is nn.BatchNorm2d
    assert "1 batch norm + ReLU + max pool run(s) fused" in capsys.readouterr().out
    set_convnet_kernels(model, False, torch.device("cuda"))
    assert _types(model) == before


def test_train_with_fusion_matches_an_unfused_run_and_gives_the_model_back(tmp_path, gpu_rewrites, monkeypatch):
    fused, plain = _net(), _net()
    a = _train(_cfg(tmp_path / "a"), model=fused)
    monkeypatch.setattr(bn_relu_pool, "available", lambda: False)  # the same rewrites (stem conv) but no fusion
    b = _train(_cfg(tmp_path / "b"), model=plain)
    assert a["final_loss"] == b["final_loss"]
    assert _types(fused) == _types(plain)
    for (name, u), v in zip(plain.state_dict().items(), fused.state_dict().values()):
        assert torch.equal(u, v), name
