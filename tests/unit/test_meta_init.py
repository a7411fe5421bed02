"""parallel.meta_init, HSDP's shard size and the seeded per-parameter init, without ranks."""
import pytest
import torch
from torch import nn

from turbotrain.config import load_config
from turbotrain.distributed import meta_init
from turbotrain.errors import UserError
from turbotrain.models import BUILTIN, gpt
from turbotrain.resolve import Facts, resolve

CPU = torch.device("cpu")


def test_hsdp_shard_size_defaults_to_the_node_and_must_divide_the_world():
    cfg = load_config("gpt-shakespeare", ['parallel.strategy="hsdp"'])
    out = resolve(cfg, Facts(device=CPU, world_size=8, local_world_size=4, block_params=(7,) * 2))
    assert out.parallel.shard_size == 4 and out.parallel.meta_init is False  # the model was not built on meta
    with pytest.raises(UserError, match="parallel.shard_size = 3: WORLD_SIZE=8 must be a multiple"):
        resolve(load_config("gpt-shakespeare", ['parallel.strategy="hsdp"', "parallel.shard_size=3"]),
                Facts(device=CPU, world_size=8, local_world_size=4, block_params=(7,) * 2))
    with pytest.raises(UserError, match="parallel.meta_init"):
        load_config("gpt-shakespeare", ['parallel.meta_init="yes"'])


def test_meta_init_auto_is_for_built_in_models_under_fsdp():
    assert meta_init.wanted("auto", "fsdp", "gpt", BUILTIN) and meta_init.wanted("auto", "hsdp", "gpt", BUILTIN)
    assert not meta_init.wanted("auto", "ddp", "gpt", BUILTIN)
    assert not meta_init.wanted("auto", "fsdp", "pkg.mod:build", BUILTIN)  # it may load weights: asked for
    assert meta_init.wanted(True, "ddp", "pkg.mod:build", BUILTIN)
    with pytest.raises(UserError, match="Hugging Face"):
        meta_init.wanted(True, "fsdp", "hf:gpt2", BUILTIN)


class Rope(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("cache", torch.arange(8.0).cos(), persistent=False)


def test_meta_build_holds_no_parameter_storage_keeps_ties_and_buffers():
    with meta_init.params_on_meta():
        m = gpt.build(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16)
        rope = Rope()
    assert all(p.is_meta for p in m.parameters()) and m.head.weight is m.wte.weight
    assert rope.proj.weight.is_meta and not rope.cache.is_meta
    meta_init.materialize(rope, CPU, 0)  # a non-persistent cache survives to_empty
    assert torch.equal(rope.cache, torch.arange(8.0).cos()) and rope.proj.weight.abs().max() <= 0.5
    meta_init.materialize(m, CPU, 7)
    assert m.head.weight is m.wte.weight
    full = gpt.build(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16)
    assert meta_init.initialise(full, 7, fresh=False) == "GPT.init_weights(seed=7)"
    for (name, a), (_, b) in zip(full.named_parameters(), m.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    other = gpt.build(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16)
    meta_init.initialise(other, 8, fresh=False)
    assert not torch.equal(other.wte.weight, full.wte.weight)  # the seed matters


def test_a_user_model_is_reset_by_torch_convention():
    with meta_init.params_on_meta():
        m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    how = meta_init.materialize(m, CPU, 0)
    assert how == "reset_parameters() of LayerNorm, Linear"
    assert torch.equal(m[1].weight, torch.ones(4)) and m[0].weight.abs().max() <= 0.5  # kaiming bound 1/sqrt(4)
    assert meta_init.initialise(nn.Linear(2, 2), 0, fresh=False) is None  # a full-size user model is left alone


def test_draws_do_not_depend_on_wrappers_or_chunking():
    from turbotrain.models import init

    plain = init.seeded(3, "blocks.0.fc.weight", 0).initial_seed()
    assert init.seeded(3, "blocks.0._checkpoint_wrapped_module.fc.weight", 0).initial_seed() == plain
    assert init.seeded(3, "blocks.0._orig_mod.fc.weight", 0).initial_seed() == plain
    assert init.seeded(3, "blocks.0.fc.weight", 1).initial_seed() != plain
    rows = init.CHUNK_ELEMENTS // 8 + 3  # a parameter of two chunks, the second partial
    a, b = torch.empty(rows, 8), torch.empty(rows, 8)
    init.normal_(a, 0, "w", 0.02)
    init.normal_(b, 0, "w", 0.02)
    assert torch.equal(a, b) and 0.019 < a.std().item() < 0.021
    assert not torch.equal(a[:3], a[init.CHUNK_ELEMENTS // 8:])  # chunks draw from their own generators


@pytest.mark.parametrize("tie", [True, False])
def test_llama_meta_build_equals_full_size_and_keeps_rope_tables(tie):
    from turbotrain.models import llama

    args = dict(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48,
                tie_weights=tie)
    full = llama.build(**args)
    meta_init.initialise(full, 5, fresh=False)
    with meta_init.params_on_meta():
        m = llama.build(**args)
    assert meta_init.materialize(m, CPU, 5) == "Llama.init_weights(seed=5)"
    assert (m.head.weight is m.tok_emb.weight) == tie
    for (name, a), (_, b) in zip(full.named_parameters(), m.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(m.rope_cos, full.rope_cos) and torch.equal(m.rope_sin, full.rope_sin)
    assert torch.equal(m.norm.weight, torch.ones(32)) and abs(m.blocks[0].attn.wq.weight.std().item() - 0.02) < 3e-3
