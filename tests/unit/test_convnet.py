"""kernels.convnet: the stem conv as space-to-depth and the Triton max pool compute what torch computes."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import losses
from turbotrain.accel.convnet import convnet_targets, set_convnet_kernels
from turbotrain.accel.convnet.bn_relu_pool import FusedSequential
from turbotrain.accel.convnet.max_pool import MaxPool2dNHWC
from turbotrain.accel.convnet.stem import SpaceToDepthConv2d, is_stem, set_stems, space_to_depth_conv
from turbotrain.config import config_from_dict, load_config
from turbotrain.errors import UserError
from turbotrain.models.resnet import build as build_resnet
from turbotrain.resolve import Facts, resolve

CPU = torch.device("cpu")


@pytest.mark.parametrize("k,pad,h,w,cin", [(7, 3, 32, 35, 3), (3, 1, 31, 30, 1), (5, 2, 17, 19, 4), (4, 1, 20, 21, 3),
                                           (6, 2, 15, 14, 2), (7, 0, 30, 33, 3), (3, 0, 9, 8, 3), (4, 3, 11, 12, 2)])
@pytest.mark.parametrize("nhwc", [False, True])
def test_space_to_depth_equals_the_strided_conv_in_output_and_gradients(k, pad, h, w, cin, nhwc):
    torch.manual_seed(0)
    x = torch.randn(2, cin, h, w, dtype=torch.float64)
    if nhwc:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(5, cin, k, k, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, requires_grad=True)
    want = F.conv2d(x, weight, bias, stride=2, padding=pad)
    got = space_to_depth_conv(x, weight, bias, (pad, pad))
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(want, (weight, bias), g), torch.autograd.grad(got, (weight, bias), g)):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


def test_space_to_depth_with_unequal_kernel_and_padding_per_axis():
    x = torch.randn(1, 3, 23, 18, dtype=torch.float64)
    conv = nn.Conv2d(3, 4, (7, 5), stride=2, padding=(3, 1)).double()
    want = conv(x)
    assert set_stems(conv, True) == 1 and type(conv) is SpaceToDepthConv2d
    torch.testing.assert_close(conv(x), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("conv,stem", [
    (nn.Conv2d(3, 64, 7, stride=2, padding=3), True),
    (nn.Conv2d(4, 8, 3, stride=2, padding=1), True),
    (nn.Conv2d(8, 8, 3, stride=2, padding=1), False),  # cuDNN is efficient from 8 channels
    (nn.Conv2d(3, 8, 3, stride=1, padding=1), False),
    (nn.Conv2d(3, 8, 2, stride=2), False),  # a 2x2/2 conv is a plain GEMM already
    (nn.Conv2d(3, 8, 3, stride=2, padding="valid"), False),
    (nn.Conv2d(3, 8, 3, stride=2, padding=1, padding_mode="reflect"), False),
    (nn.Conv2d(3, 9, 3, stride=2, padding=1, groups=3), False),
    (nn.Conv2d(3, 8, 3, stride=2, padding=1, dilation=2), False),
])
def test_which_convs_count_as_a_stem(conv, stem):
    assert is_stem(conv) is stem


def test_swaps_keep_the_state_dict_and_the_outputs():
    torch.manual_seed(0)
    ref = build_resnet(depth=50, num_classes=10, base_width=4).double()
    model = build_resnet(depth=50, num_classes=10, base_width=4).double()
    model.load_state_dict(ref.state_dict())
    assert convnet_targets(model, CPU) == 1  # the stem conv; its max pool's kernels are GPU kernels
    set_convnet_kernels(model, True, CPU)
    assert type(model.stem[0]) is SpaceToDepthConv2d
    assert model.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    torch.testing.assert_close(model(x), ref(x), rtol=1e-10, atol=1e-10)
    assert convnet_targets(model, CPU) == 1  # a rewritten layer still counts: a second run finds it
    set_convnet_kernels(model, False, CPU)  # off: torch's own layers back
    assert type(model.stem[0]) is nn.Conv2d and type(model.stem[3]) is nn.MaxPool2d


def test_max_pool_off_the_fast_path_is_torchs_own():
    # on a CPU (and for what the kernels do not cover) the module is nn.MaxPool2d's forward, unchanged
    x = torch.randn(2, 5, 13, 12).contiguous(memory_format=torch.channels_last)
    for args in [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, ceil_mode=True),
                 dict(kernel_size=3, stride=1, dilation=2), dict(kernel_size=3, stride=2, return_indices=True)]:
        ours, theirs = MaxPool2dNHWC(**args), nn.MaxPool2d(**args)
        a, b = ours(x), theirs(x)
        for u, v in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert torch.equal(u, v)


def test_the_pool_ops_fake_implementations_give_the_kernels_shapes_and_layouts():
    # what dynamo sees of the ops under compile: a wrong fake output makes it fall back around the op and split
    # the CUDA graph (this happened: new_empty takes no memory_format)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 5, 13, 12, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
        out, offsets = torch.ops.turbotrain.max_pool2d_nhwc(x, [3, 3], [2, 2], [1, 1])
        gin = torch.ops.turbotrain.max_pool2d_nhwc_backward(out, offsets, [13, 12], [3, 3], [2, 2], [1, 1])
    assert out.shape == (2, 5, 7, 6) and out.dtype == torch.bfloat16
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert offsets.shape == (2, 7, 6, 5) and offsets.dtype == torch.int8
    assert gin.shape == x.shape and gin.is_contiguous(memory_format=torch.channels_last)


def _resolved(setting, device=CPU, targets=2):
    cfg = config_from_dict({"kernels": {"convnet": setting}})
    return resolve(cfg, Facts(device=device, convnet_targets=targets)).kernels.convnet


def test_resolver_turns_auto_on_only_on_a_gpu_for_a_model_with_targets():
    assert _resolved("auto") is False  # CPU
    assert _resolved("auto", torch.device("cuda")) is True
    assert _resolved("auto", torch.device("cuda"), targets=0) is False
    assert _resolved(True) is True  # explicit: runs on a CPU too (the stem rewrite is exact there)
    assert _resolved(False, torch.device("cuda")) is False
    with pytest.raises(UserError, match=r"kernels.convnet = true .* none to rewrite on cpu; set kernels.convnet"):
        _resolved(True, targets=0)


def test_convnet_true_on_a_model_without_targets_is_one_error_line(tmp_path, capsys):
    from turbotrain.cli import main

    code = main(["train", "mlp-seed", "kernels.convnet=true", "train.steps=1", f"run.out_dir={str(tmp_path)!r}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: kernels.convnet = true") and "Traceback" not in "".join(err)


def test_a_resnet_trains_the_same_loss_curve_with_the_rewrites(tmp_path, capsys):
    from turbotrain.trainer import train

    common = ["model.args.depth=50", "model.args.base_width=4", "model.args.num_classes=10", "data.batch_size=4",
              "data.args.shape=[3, 32, 32]", "data.args.num_classes=10", "data.args.size=16", "data.eval_batches=0",
              "train.steps=4", "train.log_every=1", "precision.dtype=fp32", "checkpoint.every=0",
              "checkpoint.final=false", f"run.out_dir={str(tmp_path)!r}"]
    curves = []
    for on in ("false", "true"):
        train(load_config("resnet50-synthetic", [*common, f"kernels.convnet={on}", f"run.name=c{on}"]))
        curves.append(losses(tmp_path, f"c{on}"))
    assert "kernels.convnet: 1 stem conv(s) as space-to-depth, 0 max pool(s) by Triton kernels, 0 batch norm + " \
           "ReLU + max pool run(s) fused (1 left to torch: on a CPU)" in capsys.readouterr().out
    assert len(curves[0]) == 4
    torch.testing.assert_close(curves[1], curves[0], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ GPU: the Triton kernels against torch's CUDA ones

def _pool_case(shape, k, s, p, dtype, special):
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda")
    if special:  # ties, -inf windows and NaNs: first maximum in window order wins, a NaN wins over any number
        x = (x * 2).round()
        x.view(-1)[::7] = float("-inf")
        x.view(-1)[::13] = float("nan")
    x = x.to(dtype).contiguous(memory_format=torch.channels_last)
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("shape,k,s,p,dtype,special", [
    ((4, 64, 112, 112), 3, 2, 1, torch.bfloat16, True), ((4, 64, 56, 56), 3, 2, 1, torch.bfloat16, False),
    ((3, 130, 17, 15), 3, 2, 1, torch.float16, True), ((2, 33, 20, 21), 2, 2, 0, torch.float32, True),
    ((2, 64, 19, 19), 5, 3, 2, torch.bfloat16, True), ((2, 8, 12, 12), 3, 1, 1, torch.float32, True),
    ((2, 3, 9, 10), 4, 5, 1, torch.float32, True)])
def test_gpu_max_pool_kernels_equal_torch_bit_for_bit(shape, k, s, p, dtype, special):
    x = _pool_case(shape, k, s, p, dtype, special)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = F.max_pool2d(a, k, s, p)
    got = MaxPool2dNHWC(k, s, p)(b)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
    g = torch.randn_like(want)
    want.backward(g)
    got.backward(g)
    assert torch.equal(b.grad, a.grad)


@pytest.mark.gpu
def test_gpu_compiled_resnet_with_the_rewrites_matches_eager_torch():
    torch._dynamo.reset()
    torch.manual_seed(0)
    ref = build_resnet(depth=50, num_classes=10, base_width=16).cuda().to(memory_format=torch.channels_last)
    model = build_resnet(depth=50, num_classes=10, base_width=16).cuda().to(memory_format=torch.channels_last)
    model.load_state_dict(ref.state_dict())
    set_convnet_kernels(model, True, torch.device("cuda"))
    assert type(model.stem) is FusedSequential  # the stem's batch norm, ReLU and pool run fused
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(8, 3, 64, 64, device="cuda").contiguous(memory_format=torch.channels_last)
    torch.backends.cudnn.allow_tf32 = False  # the conftest fixture restores it
    want, got = ref(x), compiled(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    want.square().sum().backward()
    got.square().sum().backward()
    for (name, a), b in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-4, msg=name)
    for (name, a), b in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.gpu
def test_gpu_max_pool_refuses_what_torch_refuses():
    x = torch.randn(2, 4, 9, 9, device="cuda").contiguous(memory_format=torch.channels_last)
    for args in [dict(kernel_size=2, padding=2), dict(kernel_size=11, stride=1), dict(kernel_size=3, padding=-1)]:
        with pytest.raises(RuntimeError):
            nn.MaxPool2d(**args)(x)
        with pytest.raises(RuntimeError):  # the kernels leave such calls to nn.MaxPool2d and its checks
            MaxPool2dNHWC(**args)(x)


@pytest.mark.gpu
def test_gpu_max_pool_gives_a_window_of_only_minus_inf_to_its_first_element_as_torch_on_cpu():
    x = torch.randn(2, 8, 10, 10)
    x[..., :5, :5] = float("-inf")
    a = x.clone().requires_grad_()
    b = x.cuda().contiguous(memory_format=torch.channels_last).requires_grad_()
    want, got = F.max_pool2d(a, 3, 2, 1), MaxPool2dNHWC(3, 2, 1)(b)
    assert torch.equal(got.cpu(), want)
    g = torch.randn_like(want)
    want.backward(g)
    got.backward(g.cuda())
    assert torch.equal(b.grad.cpu(), a.grad)
