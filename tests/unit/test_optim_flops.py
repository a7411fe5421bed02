import math

import pytest
import torch

from turbotrain.accel.optim import build_optimizer, lr_lambda
from turbotrain.losses import cross_entropy
from turbotrain.models.gpt import build as build_gpt
from turbotrain.monitor.flops import PEAK_FLOPS, count_train_flops, flops_per_sample, peak_flops


def test_warmup_then_cosine():
    assert lr_lambda(0, 10, 100, "cosine") == pytest.approx(0.1)
    assert lr_lambda(9, 10, 100, "cosine") == pytest.approx(1.0)
    assert lr_lambda(10, 10, 100, "cosine") == pytest.approx(1.0)
    assert lr_lambda(55, 10, 100, "cosine") == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_lambda(100, 10, 100, "cosine") == pytest.approx(0.1)
    assert lr_lambda(80, 10, 100, "constant") == 1.0


def test_optimizer_impl_and_decay_groups():
    model = build_gpt(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)
    opt = build_optimizer(model, "adamw", 1e-3, 0.1, torch.device("cpu"))
    assert opt.defaults["foreach"] is True
    decay, no_decay = opt.param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0
    fused = build_optimizer(model, "adamw", 1e-3, 0.1, torch.device("cpu"), impl="fused")
    assert fused.defaults["fused"] is True


def test_counted_flops_of_a_linear_layer():
    lin = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(8, 64, requires_grad=True)
    # forward 2·B·in·out; backward twice that (grad of input and of weight)
    assert count_train_flops(lambda: lin(x).sum()) == 6 * 8 * 64 * 32


def test_gpt_formula_matches_the_count_for_the_matmuls():
    model = build_gpt(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=False)
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    formula, how = flops_per_sample(model, (x, y), lambda a, b: cross_entropy(model(a), b))
    assert how.startswith("formula")
    counted = count_train_flops(lambda: cross_entropy(model(x), y)) / 2
    assert formula == pytest.approx(counted, rel=0.25)  # the formula ignores embeddings' lookups


def test_peak_table():
    assert peak_flops(torch.device("cpu"), "bf16") is None
    assert PEAK_FLOPS["H100"]["bf16"] > PEAK_FLOPS["H100"]["tf32"] > PEAK_FLOPS["H100"]["fp32"]


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 NVL", "H100 NVL"), ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", "H200 NVL"), ("NVIDIA L4", "L4"), ("NVIDIA L40", "L40"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("Tesla T4", "T4"),
])
def test_peak_lookup_matches_whole_model_names(name, key):
    from turbotrain.monitor.flops import lookup_peak

    assert lookup_peak(name) is PEAK_FLOPS[key]


def test_unknown_device_has_no_peak():
    from turbotrain.monitor.flops import lookup_peak

    assert lookup_peak("NVIDIA RTX A6000") is None and lookup_peak("Tesla K80") is None


def test_clip_grad_norm_matches_torch():
    from turbotrain.accel.optim import clip_grad_norm

    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(4)]
    for p in ours:
        p.grad = torch.randn_like(p) * 3
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for p, q in zip(ours, ref):
        q.grad = p.grad.clone()
    norm = clip_grad_norm(ours, 1.0)
    assert norm.item() == pytest.approx(torch.nn.utils.clip_grad_norm_(ref, 1.0).item(), rel=1e-6)
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p.grad, q.grad)
    before = [p.grad.clone() for p in ours]
    assert clip_grad_norm(ours, math.inf).item() == pytest.approx(1.0, rel=1e-5)  # norm only
    assert all(torch.equal(a, p.grad) for a, p in zip(before, ours))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name,clip", [("adamw", 0.5), ("adamw", 1e3), ("sgd", 0.5)])
def test_clip_folded_into_a_fused_optimizer_steps_as_clip_then_step(name, clip, device):
    """The coefficient handed to the fused kernel as grad_scale gives the parameters, moments and gradients the
    separate clip pass gives (to rounding: the kernel divides by 1/coef where the pass multiplies by coef);
    a clip that does not bind (coef 1) changes nothing. The loss is scaled so that 0.5 binds every step."""
    from turbotrain.accel.optim import build_optimizer, clip_grad_norm, folds_clip

    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)).to(device) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [build_optimizer(m, name, 1e-2, 0.1, torch.device(device), impl="fused") for m in models]
    assert folds_clip(opts[0]) and not folds_clip(build_optimizer(models[0], name, 1e-2, 0.1,
                                                                  torch.device(device), impl="foreach"))
    for _ in range(3):
        x = torch.randn(16, 6, device=device)
        norms = []
        for m, opt, fold in zip(models, opts, (False, True)):
            (m(x) ** 2).sum().mul(40).backward()
            norms.append(clip_grad_norm(m.parameters(), clip, opt=opt if fold else None))
            assert hasattr(opt, "grad_scale") == fold
            opt.step()
            opt.__dict__.pop("grad_scale", None)
        assert norms[1].item() == pytest.approx(norms[0].item(), rel=1e-5) and norms[0].item() > 0.5
        for p, q in zip(models[0].parameters(), models[1].parameters()):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)  # steps 2-3: grads of params an ulp apart
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
    s0, s1 = opts[0].state_dict()["state"], opts[1].state_dict()["state"]
    for k in s0:
        for key, v in s0[k].items():
            torch.testing.assert_close(s1[k][key], v, rtol=1e-5, atol=1e-9)  # squares: twice the rounding
