"""kernels.convnet's batch norm + ReLU + max pool in one layer: fused only where the forward is known to run the
three in a row, torch's own three layers wherever the kernels do not serve a call, the same math where they do."""
import pytest
import torch
from torch import nn

from turbotrain.accel.convnet import bn_relu_pool, set_convnet_kernels
from turbotrain.accel.convnet.bn_relu_pool import FusedSequential, set_fused
from turbotrain.models.resnet import build as build_resnet


@pytest.fixture
def kernels_available(monkeypatch):
    """Fusing needs triton installed; the CPU tests fuse without it (a CPU call runs torch's layers anyway)."""
    monkeypatch.setattr(bn_relu_pool, "available", lambda: True)


def _stem(**pool):
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                         nn.MaxPool2d(**{"kernel_size": 3, "stride": 2, "padding": 1, **pool}))


def test_fuses_a_sequential_run_and_switching_off_restores_torchs_layers(kernels_available):
    model = nn.Sequential(_stem(), nn.Flatten())
    keys, kids = model.state_dict().keys(), [type(m) for m in model[0]]
    assert set_fused(model, True) == 1
    assert type(model[0]) is FusedSequential and type(model) is nn.Sequential  # only the one holding the run
    assert [type(m) for m in model[0]] == kids  # the children stay torch's
    assert model.state_dict().keys() == keys
    assert set_fused(model, True) == 1  # again: the run is found again
    assert set_fused(model, False) == 0
    assert type(model[0]) is nn.Sequential


def _hooked():
    stem = _stem()
    stem[1].register_forward_hook(lambda *a: None)
    return stem


class _MySequential(nn.Sequential):
    def forward(self, x):
        return super().forward(x) * 2


@pytest.mark.parametrize("build", [
    lambda: _stem(ceil_mode=True), lambda: _stem(dilation=2), lambda: _stem(return_indices=True),
    lambda: _stem(kernel_size=13, padding=0), lambda: _stem(stride=0), _hooked,
    lambda: _MySequential(*_stem()),  # its own forward
    lambda: nn.Sequential(nn.BatchNorm2d(8), nn.MaxPool2d(3, 2, 1), nn.ReLU()),  # another order
    lambda: nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.Identity(), nn.MaxPool2d(3, 2, 1)),
    lambda: nn.Sequential(nn.SyncBatchNorm(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1)),
    lambda: nn.Sequential(nn.BatchNorm2d(8), nn.GELU(), nn.MaxPool2d(3, 2, 1)),
    lambda: nn.ModuleList([nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]),  # no known order
])
def test_leaves_runs_it_cannot_prove_or_serve(build, kernels_available):
    model = build()
    assert set_fused(model, True) == 0
    assert not any(type(m) is FusedSequential for m in model.modules())


def test_a_hook_added_after_fusing_runs_the_three_layers(kernels_available):
    # fusing is decided at each call: a child hooked later sees its own input and output
    model = _stem()
    assert set_fused(model, True) == 1
    seen = []
    model[2].register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    model(torch.randn(2, 3, 9, 10))
    assert seen == [(2, 8, 9, 10)]


def test_fuses_nothing_without_triton(monkeypatch):
    monkeypatch.setattr(bn_relu_pool, "available", lambda: False)
    assert set_fused(_stem(), True) == 0


def _train_steps(model, steps=3):
    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outs = []
    for _ in range(steps):
        x = torch.randn(4, 3, 9, 10, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
        y = model(x)
        y.square().sum().backward()
        opt.step()
        opt.zero_grad()
        outs.append(y.detach())
    model.eval()
    outs.append(model(torch.randn(2, 3, 9, 10, dtype=torch.float64)).detach())
    return outs


@pytest.mark.parametrize("bn", [dict(), dict(momentum=None), dict(affine=False), dict(track_running_stats=False)])
def test_off_the_kernels_the_fused_layer_is_torchs_three_layers(bn, kernels_available):
    # a CPU call (as any the kernels do not serve) runs batch norm, relu and the pool as torch does, bit for bit
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8, **bn), nn.ReLU(inplace=True),
                        nn.MaxPool2d(3, 2, 1)).double()
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8, **bn), nn.ReLU(inplace=True),
                          nn.MaxPool2d(3, 2, 1)).double()
    model.load_state_dict(ref.state_dict())
    assert set_fused(model, True) == 1
    for got, want in zip(_train_steps(model), _train_steps(ref)):
        assert torch.equal(got, want)
    for (name, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_wrong_channel_count_is_torchs_error(kernels_available):
    model = _stem()[1:]
    assert set_fused(model, True) == 1
    with pytest.raises(RuntimeError, match="running_mean should contain 4 elements not 8"):
        model(torch.randn(2, 4, 6, 6))


def test_on_a_cpu_the_convnet_kernels_fuse_nothing(capsys):
    model = build_resnet(depth=50, num_classes=10, base_width=4)
    set_convnet_kernels(model, True, torch.device("cpu"))
    assert type(model.stem) is nn.Sequential
    assert "0 batch norm + ReLU + max pool run(s) fused" in capsys.readouterr().out


def test_the_fused_ops_fake_implementations_give_the_kernels_shapes_and_layouts():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 5, 13, 12, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
        w, b = torch.empty(5), torch.empty(5)
        out, offsets, xmax, mean, var = torch.ops.turbotrain.bn_relu_max_pool2d(
            x, w, b, None, None, True, 1e-5, [3, 3], [2, 2], [1, 1])
        dx, dw, db = torch.ops.turbotrain.bn_relu_max_pool2d_backward(
            out, x, offsets, xmax, w, b, mean, var, True, 1e-5, [3, 3], [2, 2], [1, 1])
    assert out.shape == (2, 5, 7, 6) and out.dtype == torch.bfloat16
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert offsets.shape == xmax.shape == (2, 7, 6, 5) and offsets.dtype == torch.int8
    assert mean.shape == var.shape == (5,) and mean.dtype == torch.float32
    assert dx.shape == x.shape and dx.is_contiguous(memory_format=torch.channels_last)
    assert dw.shape == db.shape == (5,)


# ------------------------------------------------------------------ GPU: the Triton kernels against torch's layers

def _gpu_pair(c, bn, pool, dtype):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.BatchNorm2d(c, **bn), nn.ReLU(), nn.MaxPool2d(*pool)).cuda()
    with torch.no_grad():
        if ref[0].affine:
            ref[0].weight.uniform_(-1.5, 1.5)  # negative scales too: the max is not taken before the norm
            ref[0].bias.normal_(0, 0.5)
        if ref[0].running_mean is not None:
            ref[0].running_mean.normal_(0, 0.2)
            ref[0].running_var.uniform_(0.5, 2)
    model = nn.Sequential(nn.BatchNorm2d(c, **bn), nn.ReLU(), nn.MaxPool2d(*pool)).cuda()
    model.load_state_dict(ref.state_dict())
    assert set_fused(model, True) == 1
    return ref, model


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.gpu
@pytest.mark.parametrize("shape,pool,bn,training", [
    ((8, 64, 56, 56), (3, 2, 1), {}, True), ((8, 64, 56, 56), (3, 2, 1), {}, False),
    ((3, 130, 17, 15), (3, 2, 1), dict(affine=False), True), ((2, 3, 20, 21), (2, 2, 0), {}, True),
    ((2, 16, 19, 19), (5, 3, 2), dict(track_running_stats=False), True),
    ((2, 16, 19, 19), (5, 3, 2), dict(track_running_stats=False), False),  # eval on batch statistics
    ((5000, 1, 4, 4), (3, 1, 1), {}, True),  # many partial sums, one channel
    ((8, 64, 56, 56), (3, 2, 1), dict(momentum=None), True)])  # the unfused path: torch's layers
def test_gpu_fused_layer_computes_torchs_three_layers_in_fp32(shape, pool, bn, training):
    ref, model = _gpu_pair(shape[1], bn, pool, torch.float32)
    ref.train(training)
    model.train(training)
    for step in range(2):
        x = (torch.randn(shape, device="cuda") * 2 + 0.5).contiguous(memory_format=torch.channels_last)
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = ref(a), model(b)
        assert got.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        g = torch.randn_like(want)
        want.backward(g)
        got.backward(g)
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5)
        for (name, p), q in zip(ref.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4, msg=name)
    for (name, u), v in zip(ref.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(v, u, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_fused_layer_in_half_precision_stays_within_its_rounding(dtype):
    # the activation is rounded before pooling, as the unfused layers store it; a value one unit of rounding
    # apart can move a window's argmax, so outputs are compared element by element and gradients as wholes
    ref, model = _gpu_pair(64, {}, (3, 2, 1), dtype)
    x = torch.randn(16, 64, 56, 56, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=dtype):
        want, got = ref(a), model(b)
    assert got.dtype == want.dtype == dtype
    assert (got != want).float().mean().item() < 1e-3
    g = torch.randn_like(want)
    want.backward(g)
    got.backward(g)
    assert _rel(b.grad, a.grad) < 2e-2
    for p, q in zip(ref.parameters(), model.parameters()):
        assert _rel(q.grad, p.grad) < 1e-2
    torch.testing.assert_close(model[0].running_var, ref[0].running_var, rtol=1e-4, atol=1e-5)
