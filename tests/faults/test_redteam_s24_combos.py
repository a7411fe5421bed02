"""Red team, session 24, techniques in combination: activation checkpointing under a torch.compile backend that
does not recompute in its graph (dynamo's "eager") over blocks holding BatchNorm or dropout, selective checkpointing
over an in-place op, inductor settings under another backend, adam/sgd weight decay, and accumulation x clipping x
precision x optimizer kernel against a plain loop. User code: tests/userpkg/redteam_s24_combos.py."""
from __future__ import annotations

import json

import pytest
import torch

from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.accel.activation_ckpt import apply_activation_checkpointing

PKG = "userpkg.redteam_s24_combos"


def train_cli(capsys, tmp_path, *overrides) -> tuple[int, str, str]:
    from turbotrain.cli import main

    capsys.readouterr()
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "train.steps=2", *overrides])
    out, err = capsys.readouterr()
    return rc, out, err


def _grads_and_buffers(factory: str, mode: str, backend: str | None):
    from userpkg import redteam_s24_combos as user

    torch.manual_seed(0)
    net = getattr(user, factory)()
    if mode != "none":
        apply_activation_checkpointing(net, mode, backend or "inductor")
    run = torch.compile(net, backend=backend) if backend else net
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(5)  # the same dropout masks in every variant
    for _ in range(2):
        run(x).sum().backward()
    torch._dynamo.reset()
    return [p.grad for p in net.parameters()], list(net.buffers())


@pytest.mark.parametrize(("factory", "mode"), [("bn_blocks", "full"), ("drop_blocks", "selective")])
def test_checkpointed_blocks_under_the_eager_compile_backend_train_as_without_checkpointing(factory, mode):
    """Under compile.backend="eager" dynamo's graph of a checkpointed block was recomputed by rerunning it with no
    RNG state kept: a block holding BatchNorm died in backward (its num_batches_tracked written twice, an autograd
    version error traceback), one holding dropout drew new masks in the recompute (silently wrong gradients)."""
    want_grads, want_bufs = _grads_and_buffers(factory, "none", "eager")
    grads, bufs = _grads_and_buffers(factory, mode, "eager")
    for want, got in zip(want_grads, grads):
        torch.testing.assert_close(got, want)
    for want, got in zip(want_bufs, bufs):
        assert torch.equal(got, want)


def test_the_eager_backend_with_checkpointing_through_the_cli_says_what_it_does(capsys, tmp_path):
    """The run through the CLI (it died with the autograd traceback) trains as the run without checkpointing and
    says why the blocks leave the graph; with compile.fullgraph = true, which forbids that, it is one error line."""
    common = (f'model.name="{PKG}:bn_blocks"', "compile.enabled=true", 'compile.backend="eager"')
    rc, out, err = train_cli(capsys, tmp_path / "ckpt", *common, 'memory.activation_checkpointing="full"')
    assert rc == 0 and "Traceback" not in err, err
    assert "run outside the graph" in out
    rc, _, err = train_cli(capsys, tmp_path / "plain", *common)
    assert rc == 0, err
    rows = [json.loads(p.read_text().splitlines()[-1]) for p in sorted(tmp_path.glob("*/fault/metrics.jsonl"))]
    assert rows[0]["val_loss"] == pytest.approx(rows[1]["val_loss"], rel=1e-5)  # the running statistics as well
    rc, _, err = train_cli(capsys, tmp_path / "full", *common, 'memory.activation_checkpointing="selective"',
                           "compile.fullgraph=true")
    assert rc == 2 and "compile.fullgraph" in error_line(err) and 'compile.backend="aot_eager"' in err


def test_selective_checkpointing_over_an_in_place_op_on_a_kept_output_is_one_line_naming_the_fix(capsys, tmp_path):
    """nn.ReLU(inplace=True) after nn.Linear in a block: selective checkpointing keeps the linear's output for
    backward, the ReLU overwrote it, and backward died with torch's "Tensor cached during selective activation
    checkpoint has been mutated" traceback; "full" (which keeps nothing) trains it."""
    from userpkg.redteam_s24_combos import inplace_blocks

    from turbotrain.errors import UserError

    net = inplace_blocks()
    apply_activation_checkpointing(net, "selective")
    with pytest.raises(UserError, match=r'"selective": a _InplaceBlock block writes in place.*"full"'):
        net(torch.randn(4, 8)).sum().backward()
    rc, _, err = train_cli(capsys, tmp_path / "sel", f'model.name="{PKG}:inplace_blocks"',
                           'memory.activation_checkpointing="selective"')
    assert rc == 2 and 'memory.activation_checkpointing="full"' in error_line(err)
    rc, _, err = train_cli(capsys, tmp_path / "full", f'model.name="{PKG}:inplace_blocks"',
                           'memory.activation_checkpointing="full"')
    assert rc == 0, err


def test_inductor_settings_under_another_backend_are_said_and_recorded_as_unused(capsys):
    """compile.mode, coordinate_descent_tuning and the inductor table reach inductor only (apply_compile passes
    them as its options): under compile.backend="aot_eager" they were accepted, written to config.toml as if in
    force, and silently not applied."""
    from turbotrain.config import load_config
    from turbotrain.resolve import effective_config

    capsys.readouterr()
    cfg = effective_config(load_config(str(BASE_TOML), [
        "compile.enabled=true", 'compile.backend="aot_eager"', 'compile.mode="max-autotune"',
        "compile.coordinate_descent_tuning=true", 'compile.inductor={"max_autotune_gemm"=true}']))
    assert (cfg.compile.mode, cfg.compile.coordinate_descent_tuning, cfg.compile.inductor) == ("default", False, {})
    out = capsys.readouterr().out
    for key in ("compile.mode", "compile.coordinate_descent_tuning", "compile.inductor"):
        assert f'{key}: ' in out and 'compile.backend is "aot_eager"' in out, out
    cfg = effective_config(load_config(str(BASE_TOML), ["compile.enabled=true", 'compile.mode="max-autotune"']))
    assert cfg.compile.mode == "max-autotune"  # inductor's own: kept


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_the_weight_decay_of_adam_and_sgd_says_it_is_not_decoupled(capsys, name):
    """train.weight_decay is documented as decoupled decay; torch's Adam and SGD add it to the gradient (L2, which
    Adam then normalises: another update than adamw's for the same value), and the run said nothing of it."""
    from turbotrain.accel.optim import build_optimizer

    capsys.readouterr()
    build_optimizer(torch.nn.Linear(4, 4), name, 1e-3, 0.1, torch.device("cpu"))
    assert "L2: added to the gradient, not decoupled" in capsys.readouterr().out
    build_optimizer(torch.nn.Linear(4, 4), "adamw", 1e-3, 0.1, torch.device("cpu"))
    build_optimizer(torch.nn.Linear(4, 4), name, 1e-3, 0.0, torch.device("cpu"))
    assert "L2" not in capsys.readouterr().out


@pytest.mark.parametrize("impl", ["foreach", "fused"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_accumulated_clipped_step_equals_one_plain_step_over_the_whole_batch(impl, dtype):
    """Two micro-batches with a binding clip (folded into the fused kernel where it can be, unscaled from fp16's
    loss scale first) make the step a plain loop makes over the whole batch: loss.backward(), clip, step."""
    from torch import nn

    from turbotrain.accel.optim import build_optimizer, build_scheduler
    from turbotrain.accel.precision import autocast
    from turbotrain.losses import mse
    from turbotrain.models.structure import WithLoss
    from turbotrain.pipeline import Trainee
    from turbotrain.step import train_step

    cpu = torch.device("cpu")

    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1), nn.Flatten(0))

    x, y = torch.randn(16, 8) * 3, torch.randn(16) * 10
    ref = net()
    opt = build_optimizer(ref, "sgd", 0.1, 0.0, cpu, "for")
    with autocast(dtype, cpu):
        loss = mse(ref(x), y)
    loss.backward()
    want_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    opt.step()
    model = net()
    opt = build_optimizer(model, "sgd", 0.1, 0.0, cpu, impl)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, enabled=dtype == "fp16")  # a scale that does not overflow
    tr = Trainee(model=model, step_module=WithLoss(model, mse, None), compiled=[], opt=opt,
                 sched=build_scheduler(opt, 0, 10, "constant"), scaler=scaler, dtype=dtype, device=cpu)
    mean, norm = train_step(tr, [(x[:8], y[:8]), (x[8:], y[8:])], 0.5)
    tol = {"fp32": 1e-6, "bf16": 1e-3, "fp16": 1e-4}[dtype]
    assert float(mean) == pytest.approx(loss.item(), rel=tol * 10)
    assert float(norm) == pytest.approx(float(want_norm), rel=tol * 10)
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(b, a, rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_a_block_writing_over_its_input_under_checkpointing_is_one_line_naming_the_fix(capsys, tmp_path, mode):
    """`x *= 0.5` on a block's argument trains without checkpointing; with it, the input kept to recompute the block
    had changed, and backward died with autograd's "modified by an inplace operation" traceback."""
    rc, _, err = train_cli(capsys, tmp_path / mode, f'model.name="{PKG}:input_writer_blocks"',
                           f'memory.activation_checkpointing="{mode}"')
    assert rc == 2 and "writes over its input in place" in error_line(err)
    rc, _, err = train_cli(capsys, tmp_path / "none", f'model.name="{PKG}:input_writer_blocks"')
    assert rc == 0, err
