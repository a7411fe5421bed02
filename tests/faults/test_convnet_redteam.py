"""Red-team cases on `kernels.convnet` (accel/convnet): the space-to-depth stem must behave as the nn.Conv2d it
replaces — same outputs and gradients (weight AND input), same errors for inputs torch refuses, the same
module API (unbatched inputs, FX tracing) —, the resolver must write what ran, and a user's model passed to
`turbotrain.train` must not be left unusable for a later run. Each test fails while its bug is there."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import turbotrain
from turbotrain.accel.convnet import convnet_targets, set_convnet_kernels
from turbotrain.accel.convnet.stem import SpaceToDepthConv2d, is_stem, set_stems, space_to_depth_conv
from turbotrain.config import load_config
from turbotrain.errors import UserError

CPU = torch.device("cpu")


def _pair(cin=3, cout=8, k=7, pad=3, bias=True):
    torch.manual_seed(0)
    ref = nn.Conv2d(cin, cout, k, stride=2, padding=pad, bias=bias).double()
    ours = copy.deepcopy(ref)
    assert set_stems(ours, True) == 1 and type(ours) is SpaceToDepthConv2d
    return ref, ours


# ------------------------------------------------------------------------------------------------ held cases

@pytest.mark.parametrize("k", range(3, 12))
@pytest.mark.parametrize("cin", [1, 2, 3, 4])
def test_held_output_weight_and_input_gradients_over_kernels_paddings_and_sizes(k, cin):
    # odd/even/tiny sizes (smaller than the kernel too: both sides must then raise), padding up to k + 1
    torch.manual_seed(k * 10 + cin)
    for pad in range(0, k + 2):
        for h, w in [(1, 1), (2, 3), (k, k + 1), (9, 8), (13, 16)]:
            x = torch.randn(1, cin, h, w, dtype=torch.float64, requires_grad=True)
            wt = torch.randn(2, cin, k, k, dtype=torch.float64, requires_grad=True)
            b = torch.randn(2, dtype=torch.float64, requires_grad=True)
            try:
                want = F.conv2d(x, wt, b, stride=2, padding=pad)
            except RuntimeError:
                with pytest.raises(RuntimeError):
                    space_to_depth_conv(x, wt, b, (pad, pad))
                continue
            got = space_to_depth_conv(x, wt, b, (pad, pad))
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
            if not want.numel():
                continue
            g = torch.randn_like(want)
            for a_, b_ in zip(torch.autograd.grad(want, (x, wt, b), g), torch.autograd.grad(got, (x, wt, b), g)):
                torch.testing.assert_close(b_, a_, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("conv", [
    nn.Conv2d(3, 8, 3, stride=(2, 1), padding=1), nn.Conv2d(3, 8, (3, 2), stride=2), nn.Conv2d(5, 8, 3, stride=2),
    nn.ConvTranspose2d(3, 8, 3, stride=2), type("MyConv", (nn.Conv2d,), {})(3, 8, 3, stride=2, padding=1)])
def test_held_non_stems_and_user_subclasses_are_left_alone(conv):
    assert not is_stem(conv) and set_stems(conv, True) == 0


def test_held_user_max_pool_subclass_left_alone_and_shared_weights_and_a_conv_called_twice():
    class MyPool(nn.MaxPool2d):
        pass

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.pre = nn.Conv2d(3, 3, 1)  # the stem's input needs a gradient
            self.a = nn.Conv2d(3, 4, 5, 2, 2, bias=False)
            self.b = nn.Conv2d(3, 4, 5, 2, 2)
            self.b.weight = self.a.weight
            self.pool = MyPool(2)

        def forward(self, x):
            x = self.pre(x)
            y = self.a(x) + self.b(x)
            return self.pool(self.a(y[:, :3].contiguous())).sum() + y.sum()

    torch.manual_seed(0)
    ref = Net().double()
    model = copy.deepcopy(ref)
    set_convnet_kernels(model, True, CPU)
    assert type(model.a) is SpaceToDepthConv2d
    assert type(model.pool).__name__ == "MyPool" and model.a.weight is model.b.weight
    x = torch.randn(2, 3, 17, 16, dtype=torch.float64, requires_grad=True)
    ga = torch.autograd.grad(ref(x), [x, *ref.parameters()])
    gb = torch.autograd.grad(model(x), [x, *model.parameters()])
    for a_, b_ in zip(ga, gb):
        torch.testing.assert_close(b_, a_, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("nhwc", [False, True])
def test_held_low_precision_and_layouts_on_cpu(dtype, nhwc):
    ref, ours = _pair()
    ref, ours = ref.to(dtype), ours.to(dtype)
    x = torch.randn(1, 3, 31, 30).to(dtype)
    if nhwc:
        x = x.contiguous(memory_format=torch.channels_last)
    want, got = ref(x), ours(x)
    assert got.is_contiguous(memory_format=torch.channels_last) == want.is_contiguous(
        memory_format=torch.channels_last)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------------------------- the findings

def test_unbatched_input_works_as_with_nn_conv2d():
    # nn.Conv2d takes an unbatched [C, H, W] input; the rewrite's _fold unpacks 4 dims -> ValueError
    ref, ours = _pair()
    x = torch.randn(3, 32, 32, dtype=torch.float64)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cin,given", [(3, 4), (1, 2), (2, 1), (4, 3)])
def test_an_input_with_the_wrong_channel_count_is_refused_as_torch_refuses_it(cin, given):
    # torch: "expected input[...] to have 3 channels"; the rewrite folds 4 channels into the 16 the folded
    # 3-channel weight has (12 + 4 zero channels) and returns a tensor: silently wrong math (RGBA into RGB)
    ref, ours = _pair(cin=cin)
    x = torch.randn(2, given, 32, 32, dtype=torch.float64)
    with pytest.raises(RuntimeError):
        ref(x)
    with pytest.raises(RuntimeError):
        ours(x)


def test_a_model_trained_with_the_rewrite_still_fx_traces(tmp_path):
    # nn.Conv2d is an FX leaf and SpaceToDepthConv2d is not: a run gives the user's model back with torch's own
    # layers, so torchvision feature extraction and FX quantization keep working on it after training
    model = _Stem()
    turbotrain.train(_cfg(tmp_path, "fx", "true"), model=model, train_data=_data())
    assert type(model.c) is nn.Conv2d
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(1, 3, 16, 16)
    torch.testing.assert_close(gm(x), model(x))


class _Stem(nn.Module):
    def __init__(self, pool_only=False):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, 1 if pool_only else 2, 1)
        self.p = nn.MaxPool2d(2) if pool_only else nn.Identity()
        self.f = nn.Linear(8, 10)

    def forward(self, x):
        return self.f(torch.relu(self.p(self.c(x))).mean((2, 3)))


def _cfg(tmp_path, name, convnet):
    return load_config("mlp-seed", [f"run.out_dir={str(tmp_path)!r}", f"run.name={name!r}", "train.steps=1",
                                    "data.batch_size=4", f"kernels.convnet={convnet}", "checkpoint.every=0",
                                    "checkpoint.final=false", "data.eval_batches=0"])


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g))


def test_a_model_trained_with_the_rewrite_can_be_trained_again_with_it(tmp_path):
    # train() swaps the user's own module's class in place and leaves it so; convnet_targets then counts 0 and
    # a second train(..., kernels.convnet=true) on the same model says it has no stem ("has neither")
    model, ds = _Stem(), _data()
    turbotrain.train(_cfg(tmp_path, "a", "true"), model=model, train_data=ds)
    turbotrain.train(_cfg(tmp_path, "b", "true"), model=model, train_data=ds)


def test_a_run_with_convnet_false_runs_no_rewritten_layer(tmp_path):
    # the same model trained again with kernels.convnet=false still runs SpaceToDepthConv2d: config.toml says
    # convnet = false while the rewrite ran
    model, ds = _Stem(), _data()
    turbotrain.train(_cfg(tmp_path, "a", "true"), model=model, train_data=ds)
    turbotrain.train(_cfg(tmp_path, "b", "false"), model=model, train_data=ds)
    assert "convnet = false" in (tmp_path / "b" / "config.toml").read_text()
    assert not any(isinstance(m, SpaceToDepthConv2d) for m in model.modules())


def test_convnet_true_on_a_cpu_for_a_model_with_only_max_pools_does_not_record_a_no_op(tmp_path):
    # on a CPU `true` rewrites stems only; a model whose only target is an nn.MaxPool2d passes the resolver
    # (convnet_targets counts pools on any device) and config.toml says convnet = true with nothing rewritten
    model = _Stem(pool_only=True)
    assert convnet_targets(model, CPU) == 0
    try:
        turbotrain.train(_cfg(tmp_path, "p", "true"), model=model, train_data=_data())
    except UserError as e:
        assert "kernels.convnet" in str(e)
        return
    assert "convnet = false" in (tmp_path / "p" / "config.toml").read_text()
