"""The resolver turns the requested config into the effective one before anything is written: auto values
become concrete, device facts and incompatible combinations are settled, and each override of an explicit
setting is said once."""
import pytest
import torch

from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.resolve import Facts, resolve

CPU = torch.device("cpu")


def test_auto_values_become_concrete_on_a_cpu(capsys):
    cfg = resolve(load_config("gpt2-124m"), Facts(device=CPU, block_params=(7,) * 12, in_memory_bytes=1 << 20, cpus=4))
    assert cfg.precision.dtype == "fp32" and cfg.parallel.strategy == "none" and cfg.run.device == "cpu"
    assert cfg.memory.channels_last is False and cfg.train.optimizer_impl == "foreach"
    assert cfg.data.device_resident is True and cfg.data.num_workers == 3 and cfg.data.pin_memory is False
    assert cfg.kernels.attention == "default"
    # reduce-overhead (the preset's CUDA graphs) cannot run without a GPU: said once, with the reason
    assert cfg.compile.mode == "default"
    out = capsys.readouterr().out
    assert out.count('compile.mode: "reduce-overhead" → "default" (CUDA graphs need a GPU)') == 1


def test_ddp_turns_cuda_graphs_off_and_says_so_once(capsys):
    cfg = load_config("gpt2-124m", ["compile.mode=\"reduce-overhead\"", "parallel.strategy=\"ddp\""])
    out_cfg = resolve(cfg, Facts(device=CPU, world_size=2, block_params=(7,) * 12))
    assert out_cfg.compile.mode == "default" and out_cfg.parallel.strategy == "ddp"
    out = capsys.readouterr().out
    assert out.count("compile.mode") == 1 and "CUDA graphs cannot hold DDP/FSDP collectives" in out


def test_resolving_twice_changes_nothing(capsys):
    """The written config reproduces the run: resolving the effective config again is the identity."""
    facts = Facts(device=CPU, world_size=2, block_params=(60_000_000,) * 4, in_memory_bytes=None,
                  data_args={"vocab_size": 65})
    once = resolve(load_config("gpt2-124m", ["parallel.strategy=\"fsdp\""]), facts)
    capsys.readouterr()
    assert resolve(once, facts) == once
    assert capsys.readouterr().out == ""
    assert once.parallel.fsdp_units == "blocks" and once.compile.scope == "blocks"  # big blocks: a unit each
    assert once.data.device_resident is False and once.model.args["vocab_size"] == 50304  # the config's own wins


def test_data_derived_model_args_are_recorded():
    cfg = load_config("gpt-shakespeare")
    out = resolve(cfg, Facts(device=CPU, block_params=(1,) * 4, data_args={"vocab_size": 65}))
    assert out.model.args["vocab_size"] == 65 and "vocab_size" not in cfg.model.args


def test_impossible_combinations_are_refused():
    with pytest.raises(UserError, match="activation_checkpointing"):
        resolve(load_config("mlp-seed", ["memory.activation_checkpointing=\"full\""]), Facts(device=CPU))
    with pytest.raises(UserError, match="device_resident"):
        resolve(load_config("mlp-seed", ["data.device_resident=true"]), Facts(device=CPU, block_params=(1, 1)))
    with pytest.raises(UserError, match="WORLD_SIZE=2"):
        resolve(load_config("mlp-seed", ["parallel.strategy=\"none\""]), Facts(device=CPU, world_size=2))


def test_bf16_on_a_cpu_warns_that_it_is_slow(capsys):
    cfg = resolve(load_config("mlp-seed", ["precision.dtype=\"bf16\""]), Facts(device=CPU, block_params=(1, 1)))
    assert cfg.precision.dtype == "bf16"
    assert "usually slower than fp32" in capsys.readouterr().out


def test_async_save_is_for_sharded_checkpoints():
    """Under ddp/none rank 0 writes one state.pt: async_save is refused there, before any work."""
    facts = Facts(device=CPU, world_size=2, block_params=(7,) * 12)
    with pytest.raises(UserError, match='checkpoint.async_save = true with parallel.strategy = "ddp"'):
        resolve(load_config("gpt2-124m", ["checkpoint.async_save=true", "parallel.strategy=\"ddp\""]), facts)
    cfg = resolve(load_config("gpt2-124m", ["checkpoint.async_save=true", "parallel.strategy=\"fsdp\""]), facts)
    assert cfg.checkpoint.async_save is True


def test_fused_loss_auto_is_on_exactly_where_an_explicit_true_would_run(capsys):
    """"auto" (the LM presets) becomes true where the fused loss applies and false, quietly, where an explicit
    true is refused with one error line: a model without `hidden` + `head`, another loss, FSDP2, the FP8 head."""
    ready = dict(device=CPU, block_params=(7,) * 12, fused_loss_ready=True)
    cases = [({}, [], True), ({"fused_loss_ready": False}, [], False), ({}, ['train.loss="mse"'], False),
             ({"world_size": 2}, ['parallel.strategy="fsdp"'], False),
             ({"world_size": 2}, ['parallel.strategy="ddp"'], True)]
    for facts, overrides, on in cases:
        f = Facts(**{**ready, **facts})
        assert resolve(load_config("gpt2-124m", overrides), f).kernels.fused_loss is on, (facts, overrides)
        if not on:
            with pytest.raises(UserError, match=r"^kernels.fused_loss = true .*kernels.fused_loss=false"):
                resolve(load_config("gpt2-124m", [*overrides, "kernels.fused_loss=true"]), f)
    assert "kernels.fused_loss" not in capsys.readouterr().out  # auto resolves quietly (config.toml shows it)
