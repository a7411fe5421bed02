"""`tune`'s search space learns today's levers exactly where the resolver accepts them: the fused loss for a
model with `hidden` + a bias-free `head` (not an MLP, not under FSDP2), FP8 only on an sm89+ GPU with torchao
and only when allowed, the measured attention backend where the GPU runs several, HSDP where the world holds
several shard groups; and the fused loss comes before checkpointing where memory is the limit. The GPU is
faked (its capability and bf16 support), so these run on a CPU."""
import sys
import types

import pytest
import torch

from turbotrain.config import load_config
from turbotrain.models import ModelConfig, build_model
from turbotrain.resolve import facts_of, resolve
from turbotrain.tune_space import Ctx, Probe, dimensions, levers

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
TINY_GPT = ModelConfig("gpt", {"vocab_size": 65, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32})
TINY_MLP = ModelConfig("mlp", {"in_features": 8, "width": 8, "depth": 2, "num_classes": 4, "dropout": 0.0})


@pytest.fixture
def gpu(monkeypatch):
    """A fake GPU of a given capability (bf16 from sm80, as torch says); `gpu((9, 0))`."""
    def fake(capability: tuple[int, int]) -> torch.device:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: capability)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: capability >= (8, 0))
        return CUDA
    return fake


@pytest.fixture
def torchao(monkeypatch):
    """torchao importable (its float8 module as an empty stand-in: the resolver only imports it)."""
    pkg, f8 = types.ModuleType("torchao"), types.ModuleType("torchao.float8")
    pkg.float8 = f8
    monkeypatch.setitem(sys.modules, "torchao", pkg)
    monkeypatch.setitem(sys.modules, "torchao.float8", f8)


def _space(preset: str, model_cfg: ModelConfig, device: torch.device, overrides=(), world: int = 1,
           allow_fp8: bool = False, **probe) -> tuple[Probe, Ctx, dict[str, list]]:
    """The probe's levers for a real (tiny) model on `device`, and each dimension's candidates."""
    cfg = load_config(preset, ["compile.enabled=false", *overrides])
    model = build_model(model_cfg)
    facts = facts_of(device, model, None, {}, world, world)
    eff = resolve(cfg, facts)
    base = dict(on_gpu=device.type == "cuda", bf16=True, world_size=world, strategy=eff.parallel.strategy,
                has_conv=False, has_blocks=True, has_batchnorm=False, has_attention=device.type == "cuda",
                in_memory=True, cpus=4, builtin_optimizer=True, static_bytes=1 << 30, capacity_bytes=80 << 30)
    p = Probe(**{**base, **probe, **levers(cfg, eff, facts, model)})
    ctx = Ctx(p, eff, allow_fp8=allow_fp8)
    return p, ctx, {d.name: d.build(ctx) for d in dimensions(p)}


def _keys(cands: dict[str, list]) -> set[str]:
    return {k for cs in cands.values() for c in cs for k in c.changes}


def test_a_gpt_on_an_fp8_gpu_gets_fused_loss_and_fp8_only_when_allowed(gpu, torchao):
    p, _, cands = _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)))
    assert p.fused_loss and p.fp8
    assert [c.changes for c in cands["fused loss"]] == [{"kernels.fused_loss": True}]
    assert cands["fp8"] == [] and "precision.fp8" not in _keys(cands)  # changes numerics: not by default
    _, _, cands = _space("gpt-shakespeare", TINY_GPT, CUDA, allow_fp8=True)
    fp8 = cands["fp8"]
    assert [c.changes for c in fp8] == [{"precision.dtype": "bf16", "precision.fp8": r}
                                        for r in ("tensorwise", "rowwise")]
    assert all(c.numerics for c in fp8) and not any(c.numerics for c in cands["fused loss"])
    names = [d.name for d in dimensions(p)]
    assert names.index("compile") < names.index("fp8") < names.index("fused loss") < names.index(
        "micro-batch x accumulation, checkpointing")


def test_the_head_in_fp8_is_a_candidate_where_the_head_can_take_it(gpu, torchao):
    """A head of multiple-of-16 dims: "fp8 tensorwise + head" after plain tensorwise, with the fused loss off (it
    would compute the head in bf16); once it is the best, no fused-loss candidate turns the loss back on."""
    gpt64 = ModelConfig("gpt", {**TINY_GPT.args, "vocab_size": 64})
    p, ctx, cands = _space("gpt-shakespeare", gpt64, gpu((9, 0)), allow_fp8=True)
    assert p.fp8_head and [c.label for c in cands["fp8"]] == ["fp8 tensorwise", "fp8 tensorwise + head", "fp8 rowwise"]
    head = cands["fp8"][1]
    assert head.numerics and head.changes == {"precision.dtype": "bf16", "precision.fp8": "tensorwise",
                                              "precision.fp8_head": True, "kernels.fused_loss": False}
    ctx.best = dict(head.changes)
    for d in dimensions(p):
        built = d.build(ctx)
        assert not any(c.changes.get("kernels.fused_loss") for c in built), d.name
    ctx.best_fits = False  # memory is the problem: still no fused loss under the FP8 head
    mem = next(d for d in dimensions(p) if d.makes_fit).build(ctx)
    assert mem and not any(c.changes.get("kernels.fused_loss") for c in mem)
    # the input has the head in FP8 already: the plain recipes are the candidates, and they turn it off
    _, _, cands = _space("gpt-shakespeare", gpt64, gpu((9, 0)), ['precision.fp8="tensorwise"',
                                                                 "precision.fp8_head=true"], allow_fp8=True)
    assert [(c.label, c.changes["precision.fp8_head"]) for c in cands["fp8"]] == [("fp8 tensorwise", False),
                                                                                  ("fp8 rowwise", False)]
    # a 65-wide head (FP8 needs multiples of 16), or no FP8 at all: no head candidate
    assert not _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)), allow_fp8=True)[0].fp8_head
    assert not _space("gpt-shakespeare", gpt64, gpu((8, 0)), allow_fp8=True)[0].fp8_head


def test_fp8_needs_sm89_torchao_and_a_gpu(gpu, torchao, monkeypatch):
    assert not _space("gpt-shakespeare", TINY_GPT, gpu((8, 0)), allow_fp8=True)[0].fp8  # A100: no FP8 cores
    assert _space("gpt-shakespeare", TINY_GPT, gpu((8, 9)), allow_fp8=True)[0].fp8
    p, _, cands = _space("gpt-shakespeare", TINY_GPT, CPU, allow_fp8=True, bf16=False)
    assert not p.fp8 and "precision.fp8" not in _keys(cands) and "fp8" not in cands  # a CPU never gets fp8
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # torchao not importable
    p, _, cands = _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)), allow_fp8=True)
    assert not p.fp8 and cands["fp8"] == []


def test_an_mlp_never_gets_the_fused_loss(gpu):
    for device in (gpu((9, 0)), CPU):
        p, _, cands = _space("mlp-seed", TINY_MLP, device, has_attention=False)
        assert not p.fused_loss and "kernels.fused_loss" not in _keys(cands)
    # nor where memory is the problem (nothing fits yet): checkpointing and smaller micro-batches only
    p, ctx, _ = _space("mlp-seed", TINY_MLP, CPU, has_attention=False)
    ctx.best_fits = False
    mem = next(d for d in dimensions(p) if d.makes_fit).build(ctx)
    assert mem and not any("kernels.fused_loss" in c.changes for c in mem)


def test_fused_loss_is_refused_where_the_resolver_refuses_it(gpu):
    assert not _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)), ['train.loss="mse"'])[0].fused_loss
    p, _, cands = _space("gpt-shakespeare", TINY_GPT, CPU, ['parallel.strategy="fsdp"'], world=4, bf16=False)
    assert not p.fused_loss and "kernels.fused_loss" not in _keys(cands)
    # on where the input has it on: the speed candidate turns it off; no memory lever adds it again
    p, ctx, cands = _space("gpt-shakespeare", TINY_GPT, CPU, ["kernels.fused_loss=true"], bf16=False)
    assert p.fused_loss and [c.changes for c in cands["fused loss"]] == [{"kernels.fused_loss": False}]


def test_the_fused_loss_comes_before_checkpointing_where_memory_is_the_limit(gpu):
    p, ctx, _ = _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)), ["data.batch_size=8", "train.grad_accum=4"],
                       static_bytes=10 << 30, capacity_bytes=80 << 30)
    memory = next(d for d in dimensions(p) if d.makes_fit)
    ctx.best_fits = False  # the input ran out of memory: the same micro-batch with the fused loss first
    first = memory.build(ctx)[0]
    assert first.changes == {"data.batch_size": 8, "train.grad_accum": 4, "memory.activation_checkpointing": "none",
                             "kernels.fused_loss": True}
    # it fits at 8 and 16 would need checkpointing by the estimate: 16 with the fused loss first, then checkpointed
    ctx.best_fits, ctx.act_bytes_per_sample = True, 5 << 30  # 10 + 16 x 5 GiB > 80 x 0.92; 10 + 16 x 3 GiB fits
    labels = [c.label for c in memory.build(ctx)]
    i = labels.index("micro-batch 16 x accumulation 2, fused loss, none checkpointing")
    assert labels[i + 1] == "micro-batch 16 x accumulation 2, selective checkpointing"
    assert not any("micro-batch 8 x" in lb for lb in labels)  # fits, no checkpointing: no memory problem at 8
    ctx.best = {"memory.activation_checkpointing": "selective"}  # checkpointing: one level less with the fused loss
    assert memory.build(ctx)[0].label == "micro-batch 8 x accumulation 4, fused loss, none checkpointing"
    ctx.best = {"kernels.fused_loss": True}  # on already: no lever
    assert not any("fused loss" in c.label for c in memory.build(ctx))


def test_attention_auto_vs_explicit_where_the_gpu_runs_several(gpu):
    p, _, cands = _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)), ['kernels.attention="default"'])
    assert [c.changes["kernels.attention"] for c in cands["attention backend"]] == ["auto", "cudnn", "flash",
                                                                                      "efficient"]
    _, _, cands = _space("gpt-shakespeare", TINY_GPT, CUDA, ['kernels.attention="auto"'])  # the input measures
    assert [c.changes["kernels.attention"] for c in cands["attention backend"]] == ["cudnn", "flash", "efficient"]
    p, _, cands = _space("gpt-shakespeare", TINY_GPT, gpu((7, 5)), ['precision.dtype="fp16"'])  # T4: efficient only
    assert p.attention_backends == ("efficient",) and cands["attention backend"] == []


@pytest.mark.parametrize("strategy, world, shards", [("fsdp", 8, (4, 2)), ("fsdp", 4, (2,)), ("fsdp", 2, ()),
                                                     ("ddp", 4, ()), ("hsdp", 4, (2,))])
def test_hsdp_where_the_world_holds_several_shard_groups(strategy, world, shards):
    over = [f'parallel.strategy="{strategy}"'] + (["parallel.shard_size=4"] if strategy == "hsdp" else [])
    p, ctx, cands = _space("gpt-shakespeare", TINY_GPT, CPU, over, world=world, bf16=False)
    assert p.hsdp_shards == shards
    tried = [c.changes for c in cands["parallel"] if "parallel.strategy" in c.changes]
    expect = [{"parallel.strategy": "hsdp", "parallel.shard_size": s} for s in shards if s != 4 or strategy != "hsdp"]
    assert tried == expect + ([{"parallel.strategy": "fsdp"}] if strategy == "hsdp" else [])


def test_the_search_lets_the_fused_loss_fit_a_larger_micro_batch_before_checkpointing(gpu):
    """A stand-in runner (no processes): the fused loss is no faster by itself (as on an H200 with GPT-2) but
    keeps 1.5 of 5 GiB a sample; micro-batch 16 fits without checkpointing only with it, and wins over
    checkpointing at 16 and 32."""
    def run(name, config, timeout_s, what):
        micro, ckpt = config.get("data.batch_size", 8), config.get("memory.activation_checkpointing", "none")
        share = {"none": 1.0, "selective": 0.6, "full": 0.25}[ckpt]
        peak = 10 + micro * (3.5 if config.get("kernels.fused_loss") else 5.0) * share
        if peak > 76:
            return {"status": "oom", "reason": "exit 2: out of memory", "wall_s": 1.0}
        speed = 100 * 1.1 ** {8: 0, 16: 1, 32: 2}[micro] * {"none": 1.0, "selective": 0.85, "full": 0.7}[ckpt]
        return {"status": "ok", "samples_per_s": speed, "peak_mem_gib": peak, "wall_s": 1.0}

    from turbotrain.tune import Budget, Search

    p, ctx, _ = _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)), ["data.batch_size=8", "train.grad_accum=4"],
                       static_bytes=10 << 30, capacity_bytes=80 << 30)
    ctx.best_fits = False
    search = Search(ctx, run, Budget(10))
    search.baseline()
    search.explore(dimensions(p))
    labels = [t["label"] for t in search.trials]
    assert search.best["config"] == {"data.batch_size": 16, "train.grad_accum": 2,
                                     "memory.activation_checkpointing": "none", "kernels.fused_loss": True}
    assert next(t for t in search.trials if t["label"] == "fused loss on")["status"] == "slower"
    assert labels.index("micro-batch 16 x accumulation 2, fused loss, none checkpointing") < labels.index(
        "micro-batch 16 x accumulation 2, selective checkpointing")
    assert all(t["config"].get("data.batch_size", 8) * t["config"].get("train.grad_accum", 4) == 32
               for t in search.trials)  # the same global batch throughout


def test_tuned_toml_says_fp8_changes_the_numerics():
    from turbotrain.tune_report import tuned_toml

    changes = {"precision.dtype": "bf16", "precision.fp8": "tensorwise"}
    trial = {"id": "t03", "status": "ok", "tried": changes, "gain": 1.15, "samples_per_s": 115.0, "label": "fp8"}
    result = {"config": "gpt2-124m", "overrides": [], "run_name": "gpt2-124m", "device": "H200", "torch": "2.11",
              "trials": [trial], "winner": {"label": "fp8 tensorwise", "changes": changes, "speedup": 1.15,
                                            "samples_per_s": 115.0}}
    line = next(ln for ln in tuned_toml(result).splitlines() if ln.startswith("fp8"))
    assert 'fp8 = "tensorwise"' in line and "changes the numerics" in line and "1.15x" in line


def test_tuned_toml_writes_an_inductor_table_with_its_effect_and_a_trial_passes_it_as_a_toml_table():
    import tomllib

    from turbotrain.config import literal, parse_value
    from turbotrain.tune_report import tuned_toml

    changes = {"compile.inductor": {"triton.mix_order_reduction": False}}
    trial = {"id": "t07", "status": "ok", "tried": changes, "gain": 1.012, "samples_per_s": 101.2,
             "label": "compile, inductor mix-order reduction off"}
    result = {"config": "gpt2-124m", "overrides": [], "run_name": "gpt2-124m", "device": "H200", "torch": "2.11",
              "trials": [trial], "winner": {"label": trial["label"], "changes": changes, "speedup": 1.012,
                                            "samples_per_s": 101.2}}
    text = tuned_toml(result)
    line = next(ln for ln in text.splitlines() if ln.startswith('"triton.mix_order_reduction"'))
    assert "mix-order reduction off" in line and "t07" in line
    assert tomllib.loads(text)["compile"]["inductor"] == {"triton.mix_order_reduction": False}
    key, value = literal("compile.inductor", changes["compile.inductor"]).split("=", 1)
    assert key == "compile.inductor" and parse_value(value) == changes["compile.inductor"]


def test_compiler_kernel_tuning_keeps_the_best_compile_and_is_budgeted_as_several_compiles(gpu):
    """Coordinate-descent tuning is tried on the compile mode and scope found so far (CUDA graphs stay on), before
    max-autotune; each candidate says how many plain compiles its compile costs, and the max-autotune one keeps
    the scope it is given."""
    from turbotrain.tune_space import AUTOTUNE_COMPILE_FACTOR, CDT_COMPILE_FACTOR

    _, ctx, _ = _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)))
    tuning = next(d for d in dimensions(ctx.probe) if d.name == "compiler kernel tuning")
    ctx.best = {"compile.enabled": True, "compile.mode": "reduce-overhead", "compile.scope": "blocks"}
    mix, cdt, mat = tuning.build(ctx)
    assert mix.changes == {"compile.enabled": True, "compile.mode": "reduce-overhead", "compile.scope": "blocks",
                           "compile.inductor": {"triton.mix_order_reduction": False}}
    assert (mix.compile, mix.compile_factor) == (True, 1.0)  # one plain compile
    assert cdt.changes == {"compile.enabled": True, "compile.mode": "reduce-overhead", "compile.scope": "blocks",
                           "compile.coordinate_descent_tuning": True}
    assert mat.changes["compile.mode"] == "max-autotune-no-cudagraphs" and mat.changes["compile.scope"] == "blocks"
    assert (cdt.compile, cdt.compile_factor, mat.compile_factor) == (True, CDT_COMPILE_FACTOR, AUTOTUNE_COMPILE_FACTOR)
    assert 1 < CDT_COMPILE_FACTOR < AUTOTUNE_COMPILE_FACTOR  # measured: several plain compiles, fewer than max-autotune
    ctx.best = {}  # compile off so far (the fixture's input): tuning brings compile on, in its default mode
    _, cdt, _ = tuning.build(ctx)
    assert cdt.changes["compile.enabled"] is True and cdt.changes["compile.mode"] == "default"
    ctx.best = {"compile.inductor": {"triton.mix_order_reduction": False, "coordinate_descent_search_radius": 2}}
    assert [c.label for c in tuning.build(ctx)] == ["compile + coordinate-descent tuning",
                                                    "compile max-autotune-no-cudagraphs"]  # already off: not again


def test_mix_order_reduction_is_a_gpu_candidate_only_and_keeps_the_users_other_inductor_settings(gpu):
    _, ctx, _ = _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)))
    tuning = next(d for d in dimensions(ctx.probe) if d.name == "compiler kernel tuning")
    ctx.best = {"compile.inductor": {"coordinate_descent_search_radius": 2}}
    mix = tuning.build(ctx)[0]
    assert mix.changes["compile.inductor"] == {"coordinate_descent_search_radius": 2,
                                               "triton.mix_order_reduction": False}
    _, _, on_cpu = _space("gpt-shakespeare", TINY_GPT, torch.device("cpu"))
    assert not any("mix-order" in c.label for cands in on_cpu.values() for c in cands)


TINY_RESNET = ModelConfig("resnet", {"depth": 50, "base_width": 4, "num_classes": 10})


def test_the_convnet_kernels_are_a_gpu_candidate_for_a_model_with_a_stem_and_never_on_a_cpu(gpu):
    # the input's "auto" is on on a GPU: tune tries it off; from a naive config (off) it tries it on
    p, _, cands = _space("resnet50-synthetic", TINY_RESNET, gpu((9, 0)), has_conv=True)
    assert p.convnet and [c.changes for c in cands["convnet kernels"]] == [{"kernels.convnet": False}]
    _, _, cands = _space("resnet50-synthetic", TINY_RESNET, gpu((9, 0)), ["kernels.convnet=false"], has_conv=True)
    assert [c.changes for c in cands["convnet kernels"]] == [{"kernels.convnet": True}]
    names = [d.name for d in dimensions(p)]
    assert names.index("channels_last") < names.index("convnet kernels") < names.index("compiler kernel tuning")
    p, _, cands = _space("resnet50-synthetic", TINY_RESNET, CPU, ["kernels.convnet=false"], has_conv=True)
    assert not p.convnet and "kernels.convnet" not in _keys(cands)
    p, _, cands = _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)), ["kernels.convnet=false"])
    assert not p.convnet and "kernels.convnet" not in _keys(cands)


@pytest.fixture
def frontend(monkeypatch):
    """cudnn-frontend importable (an empty stand-in: the resolver only imports it)."""
    monkeypatch.setitem(sys.modules, "cudnn", types.ModuleType("cudnn"))


def test_packed_attention_is_a_lever_for_gpt_blocks_in_bf16_on_a_gpu(gpu, frontend):
    """From a naive fp32 config the lever is there (its trial sets it; bf16 comes from the precision trial first);
    never for an MLP, on a CPU, or without cudnn-frontend."""
    p, ctx, cands = _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)), ["precision.dtype=bf16",
                                                                       "kernels.packed_attention=false"])
    assert p.packed_attention and [c.changes for c in cands["packed attention"]] == [{"kernels.packed_attention": True}]
    p, ctx, cands = _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)), ["precision.dtype=fp32",
                                                                       "kernels.packed_attention=false"])
    assert p.packed_attention and cands["packed attention"] == []  # fp32: not until a precision trial wins
    ctx.best = {"precision.dtype": "bf16"}
    assert [c.changes for c in dimensions(p)[[d.name for d in dimensions(p)].index("packed attention")].build(ctx)] \
        == [{"kernels.packed_attention": True}]
    assert not _space("mlp-seed", TINY_MLP, gpu((9, 0)))[0].packed_attention
    assert not _space("gpt-shakespeare", TINY_GPT, CPU)[0].packed_attention


def test_packed_attention_needs_the_frontend(gpu, monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)
    assert not _space("gpt-shakespeare", TINY_GPT, gpu((9, 0)), ["precision.dtype=bf16"])[0].packed_attention
