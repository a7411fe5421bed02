"""kernels.fused_loss: the chunked head + cross-entropy equals F.cross_entropy(h @ W.T) in loss and gradients,
trains a GPT exactly as the unfused path, compiles, and is refused where it cannot apply."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from turbotrain.accel.activation_ckpt import MemoryConfig
from turbotrain.accel.compile import CompileConfig
from turbotrain.accel.fused_loss import fused_linear_cross_entropy
from turbotrain.accel.optim import build_optimizer
from turbotrain.config import config_from_dict
from turbotrain.distributed.parallel import ParallelConfig
from turbotrain.errors import UserError
from turbotrain.losses import cross_entropy, mse
from turbotrain.models.gpt import build as build_gpt
from turbotrain.models.structure import WithLoss
from turbotrain.pipeline import apply_techniques
from turbotrain.resolve import Facts, facts_of, resolve

CPU = torch.device("cpu")


def _grads(loss_fn, h, w, y):
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = loss_fn(h, w, y)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def _close(a, b, rel=1e-5):
    assert (a - b).abs().max() <= rel * b.abs().max(), (a - b).abs().max() / b.abs().max()


@pytest.mark.parametrize("n_tok,chunk", [(37, 8), (64, 64), (5, 128)])
def test_reference_path_equals_cross_entropy_in_loss_and_gradients(n_tok, chunk):
    torch.manual_seed(0)
    h, w = torch.randn(n_tok, 24), torch.randn(101, 24) * 0.3  # vocab, tokens: not multiples of the chunk
    y = torch.randint(0, 101, (n_tok,))
    y[::4] = -100  # ignored targets leave the mean and get no gradient
    want = _grads(lambda h, w, y: F.cross_entropy(h @ w.t(), y), h, w, y)
    got = _grads(lambda h, w, y: fused_linear_cross_entropy(h, w, y, chunk_tokens=chunk), h, w, y)
    for g, r in zip(got, want):
        _close(g, r)
    assert got[1][::4].abs().max() == 0


def test_all_targets_ignored_gives_nan_like_cross_entropy():
    h, w, y = torch.randn(4, 8), torch.randn(10, 8), torch.full((4,), -100)
    assert F.cross_entropy(h @ w.t(), y).isnan() and fused_linear_cross_entropy(h, w, y).isnan()


def test_batched_hidden_and_grad_output_scaling():
    torch.manual_seed(1)
    h, w, y = torch.randn(2, 9, 16), torch.randn(33, 16), torch.randint(0, 33, (2, 9))
    want = _grads(lambda h, w, y: 3.0 * cross_entropy(h @ w.t(), y), h, w, y)
    got = _grads(lambda h, w, y: 3.0 * fused_linear_cross_entropy(h, w, y, chunk_tokens=4), h, w, y)
    for g, r in zip(got, want):
        _close(g, r)


def test_the_first_chunk_overwrites_grad_w_whatever_it_held():
    """grad_W starts uninitialised (no pass of zeros): the first chunk's product must never read it (NaN there
    stays out), later chunks add to it. Both branches a CPU takes: fp32 (addmm beta 0) and bf16 logits into the
    fp32 accumulator."""
    from turbotrain.accel.fused_loss import _accumulate_grad_w

    torch.manual_seed(3)
    for dt in (torch.float32, torch.bfloat16):
        d1, d2 = torch.randn(5, 6).to(dt), torch.randn(5, 6).to(dt)  # d(logits) of two chunks: (tokens, V)
        h1, h2 = torch.randn(5, 4).to(dt), torch.randn(5, 4).to(dt)
        grad_w = torch.full((6, 4), float("nan"))
        _accumulate_grad_w(grad_w, d1, h1, first=True)
        want = d1.t().float() @ h1.float()
        _close(grad_w, want, rel=1e-2 if dt == torch.bfloat16 else 1e-6)
        _accumulate_grad_w(grad_w, d2, h2, first=False)
        _close(grad_w, want + d2.t().float() @ h2.float(), rel=1e-2 if dt == torch.bfloat16 else 1e-6)


def test_an_empty_batch_gives_a_zero_weight_gradient():
    from turbotrain.accel.fused_loss import _chunked_linear_ce

    h, w, y = torch.randn(0, 8), torch.randn(10, 8), torch.zeros(0, dtype=torch.long)
    _, grad_h, grad_w, _ = _chunked_linear_ce(h, w, y, -100, 4, torch.float32)
    assert grad_h.shape == (0, 8) and torch.equal(grad_w, torch.zeros(10, 8))


def test_under_autocast_the_gradient_of_fp32_hidden_is_the_scaled_bf16_one():
    """The op takes h in the compute dtype (cast outside it, where the compiler fuses the cast): the gradient that
    reaches an fp32 hidden state is the scaled product rounded once to bf16, then cast up, as autocast's unfused
    path rounds its scaled gradient of h."""
    torch.manual_seed(4)
    h, w, y = torch.randn(24, 16), torch.randn(40, 16) * 0.3, torch.randint(0, 40, (24,))
    y[::5] = -100  # N = 19 targets: 1/N is not a power of two
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, gh, gw = _grads(lambda h, w, y: fused_linear_cross_entropy(h, w, y), h, w, y)
        _, rh, rw = _grads(lambda h, w, y: F.cross_entropy(h @ w.t(), y), h, w, y)
    assert gh.dtype == torch.float32 and torch.equal(gh, gh.bfloat16().float())  # bf16 values, as autocast's
    _close(gh, rh, rel=2e-2)
    _close(gw, rw, rel=2e-2)


def test_gpt_forward_is_head_of_hidden():
    model = build_gpt(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16)
    x = torch.randint(0, 50, (2, 8))
    assert torch.equal(model(x), model.head(model.hidden(x)))


def _train(fused: bool, comp: CompileConfig, steps: int = 5) -> list[float]:
    torch.manual_seed(0)
    model = build_gpt(vocab_size=67, block_size=16, n_layer=2, n_head=2, n_embd=32)
    _, step_module, _ = apply_techniques(model, cross_entropy, CPU, 1, "fp32", MemoryConfig(), comp,
                                         ParallelConfig(), fused_loss=fused)
    opt = build_optimizer(model, "adamw", 1e-2, 0.1, CPU, "foreach")
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 67, (3, 16), generator=gen), torch.randint(0, 67, (3, 16), generator=gen)
    y[0, :5] = -100
    losses = []
    for _ in range(steps):  # one batch again and again: the loss must fall, through the gradients
        loss = step_module(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_tiny_gpt_trains_the_same_loss_curve_fused_or_not():
    off, on = _train(False, CompileConfig()), _train(True, CompileConfig())
    assert off[-1] < off[0]  # it learns, so equal curves say something about the gradients
    assert on == pytest.approx(off, rel=1e-5)


def test_compiled_fullgraph_over_model_and_fused_loss():
    torch._dynamo.reset()
    model = build_gpt(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_embd=16)
    step = WithLoss(model, cross_entropy, fused_linear_cross_entropy)
    x, y = torch.randint(0, 40, (2, 8)), torch.randint(0, 40, (2, 8))
    want = _grad_of(step, x, y)
    got = _grad_of(torch.compile(step, backend="aot_eager", fullgraph=True), x, y)
    torch._dynamo.reset()
    _close(got[0], want[0])
    _close(got[1], want[1])


def test_compiled_graph_with_fused_loss_is_kept_by_aot_autograds_cache():
    """A warm start reuses the traced forward and backward only if every node of dynamo's graph is cacheable:
    the op with its autograd formula registered on it is; a Python autograd.Function would bypass the cache."""
    check_cacheable = pytest.importorskip("torch._functorch._aot_autograd.autograd_cache").check_cacheable
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    model = build_gpt(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_embd=16)
    step = WithLoss(model, cross_entropy, fused_linear_cross_entropy)
    x, y = torch.randint(0, 40, (2, 8)), torch.randint(0, 40, (2, 8))
    torch.compile(step, backend=capture, fullgraph=True)(x, y).backward()
    torch._dynamo.reset()
    assert len(graphs) == 1
    assert any("fused_linear_ce" in str(n.target) for n in graphs[0].graph.nodes)
    check_cacheable(graphs[0])  # raises BypassAOTAutogradCache naming the node that is not


def test_compiled_under_cpu_autocast_matches_eager():
    torch._dynamo.reset()
    model = build_gpt(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_embd=16)
    step = WithLoss(model, cross_entropy, fused_linear_cross_entropy)
    x, y = torch.randint(0, 40, (2, 8)), torch.randint(0, 40, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = step(x, y)
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(x, y)
        unfused = cross_entropy(model(x), y)
    torch._dynamo.reset()
    assert compiled.dtype == torch.float32
    assert compiled.item() == pytest.approx(eager.item(), rel=1e-6)
    assert eager.item() == pytest.approx(unfused.item(), rel=2e-2)  # bf16 logits both ways


def _grad_of(step, x, y):
    model = step.model if isinstance(step, WithLoss) else step._orig_mod.model
    model.zero_grad(set_to_none=True)
    loss = step(x, y)
    loss.backward()
    return loss.detach(), model.head.weight.grad.clone()


def _resolved(model: nn.Module, **sections):
    cfg = config_from_dict({"kernels": {"fused_loss": True}, **sections})
    return resolve(cfg, facts_of(CPU, model, torch.utils.data.TensorDataset(torch.zeros(1)), {}))


def test_resolver_accepts_gpt_and_refuses_what_cannot_fuse():
    gpt = build_gpt(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_embd=16)
    assert _resolved(gpt).kernels.fused_loss
    with pytest.raises(UserError, match="kernels.fused_loss.*hidden"):
        _resolved(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)))
    with pytest.raises(UserError, match="kernels.fused_loss.*train.loss"):
        _resolved(gpt, train={"loss": "mse"})
    fsdp = config_from_dict({"kernels": {"fused_loss": True}, "parallel": {"strategy": "fsdp"}})
    with pytest.raises(UserError, match="kernels.fused_loss.*FSDP2"):
        resolve(fsdp, Facts(device=CPU, world_size=2, local_world_size=2, fused_loss_ready=True))


def test_a_loss_passed_in_code_is_refused_with_fused_loss():
    model = build_gpt(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_embd=16)
    with pytest.raises(UserError, match="kernels.fused_loss"):
        apply_techniques(model, mse, CPU, 1, "fp32", MemoryConfig(), CompileConfig(), ParallelConfig(), fused_loss=True)


@pytest.mark.gpu
def test_gpu_kernel_equals_cross_entropy_in_fp32_and_is_as_accurate_as_unfused_bf16():
    torch.manual_seed(0)
    cuda = torch.device("cuda")
    h, w = torch.randn(1000, 64, device=cuda), torch.randn(5003, 64, device=cuda) * 0.1
    y = torch.randint(0, 5003, (1000,), device=cuda)
    y[::9] = -100
    torch.backends.cuda.matmul.allow_tf32 = False  # the conftest fixture restores it
    want = _grads(lambda h, w, y: F.cross_entropy(h @ w.t(), y), h, w, y)
    got = _grads(lambda h, w, y: fused_linear_cross_entropy(h, w, y, chunk_tokens=384), h, w, y)
    for g, r in zip(got, want):
        _close(g, r, rel=1e-4)

    def bf16(fn):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return _grads(fn, h, w, y)

    unfused = bf16(lambda h, w, y: F.cross_entropy(h @ w.t(), y))
    fused = bf16(lambda h, w, y: fused_linear_cross_entropy(h, w, y, chunk_tokens=384))
    for f, u, r in zip(fused, unfused, want):
        assert (f.float() - r).abs().max() <= 2 * (u.float() - r).abs().max() + 1e-6


@pytest.mark.gpu
def test_gpu_inductor_fullgraph_over_gpt_and_fused_loss():
    torch._dynamo.reset()
    model = build_gpt(vocab_size=1000, block_size=64, n_layer=2, n_head=2, n_embd=64).cuda()
    step = WithLoss(model, cross_entropy, fused_linear_cross_entropy)
    x, y = (torch.randint(0, 1000, (4, 64), device="cuda") for _ in range(2))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = _grad_of(step, x, y)
        got = _grad_of(torch.compile(step, fullgraph=True), x, y)
    torch._dynamo.reset()
    _close(got[0], want[0], rel=1e-2)  # bf16 activations: inductor's fusions round differently from eager
    _close(got[1], want[1], rel=5e-2)
