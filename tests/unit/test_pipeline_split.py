"""The pipeline split on one process (no process group needed for 2 stages): the stages keep the model's own
parameter names and chained they compute the model's forward; the resolver's pipeline rules."""
import re

import pytest
import torch

from turbotrain.config import load_config
from turbotrain.distributed.pipeline_parallel import split_model, stage_bounds
from turbotrain.errors import UserError
from turbotrain.models import gpt
from turbotrain.resolve import Facts, resolve

CPU = torch.device("cpu")


def test_blocks_are_spread_evenly_over_the_stages():
    assert stage_bounds(3, 2) == [(0, 2), (2, 3)]
    assert stage_bounds(12, 4) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert [b - a for a, b in stage_bounds(7, 3)] == [2, 3, 2]


def test_stages_keep_the_names_and_chain_to_the_models_forward():
    torch.manual_seed(0)
    model = gpt.build(vocab_size=17, block_size=8, n_layer=3, n_head=2, n_embd=8)
    first, first_ties = split_model(model, 0, 2)
    last, last_ties = split_model(model, 1, 2)
    names = set(first.state_dict()) | set(last.state_dict())
    assert names == set(model.state_dict())  # both copies of the tied weight: wte.weight and head.weight
    assert "blocks.2.qkv.weight" in last.state_dict() and "blocks.2.qkv.weight" not in first.state_dict()
    # the tied weight: one copy a stage, counted in the norm on the first stage only
    assert [(name, counted) for name, _, counted in first_ties] == [("wte.weight", True)]
    assert [(name, counted) for name, _, counted in last_ties] == [("head.weight", False)]
    idx = torch.randint(0, 17, (2, 8))
    torch.testing.assert_close(last(first(idx)), model(idx), rtol=0, atol=0)


def test_a_model_without_the_transformer_layout_is_refused():
    from turbotrain.models import mlp

    with pytest.raises(UserError, match="not a built-in transformer"):
        split_model(mlp.build(in_features=4, width=4, depth=2, num_classes=3), 0, 2)


def pipeline_cfg(*overrides):
    return load_config("gpt2-124m", ["parallel.strategy=\"pipeline\"", "data.batch_size=8", *overrides])


def test_pp_stages_resolve_the_grid_and_the_fsdp_units():
    from turbotrain.distributed.parallel import data_parallel, fsdp_sharded

    cfg = resolve(pipeline_cfg("parallel.pp_stages=2"), Facts(device=CPU, world_size=4, block_params=(7,) * 12,
                                                               pipeline_layout=True))
    assert cfg.parallel.pp_stages == 2 and cfg.parallel.fsdp_units == "model" and fsdp_sharded(cfg.parallel, 4)
    # rank = stage x dp + dp coordinate: ranks 0 and 2 (stages 0 and 1) read dp shard 0 of 2
    assert [data_parallel("pipeline", r, 4, 2) for r in range(4)] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    every = resolve(pipeline_cfg(), Facts(device=CPU, world_size=4, block_params=(7,) * 12, pipeline_layout=True))
    assert every.parallel.pp_stages == 4 and not fsdp_sharded(every.parallel, 4)
    assert data_parallel("pipeline", 3, 4, 4) == (0, 1)


def test_pipeline_resolves_chunks_compile_scope_and_final_export(capsys):
    cfg = resolve(pipeline_cfg("compile.enabled=true"),
                  Facts(device=CPU, world_size=2, block_params=(7,) * 12, pipeline_layout=True))
    assert cfg.parallel.pp_microbatches == 4 and cfg.compile.scope == "blocks" and cfg.checkpoint.final is False
    out = capsys.readouterr().out
    assert "compile.scope" in out and "there is no whole-model forward" in out


@pytest.mark.parametrize("overrides, facts, says", [
    ((), dict(world_size=1, block_params=(7,) * 12, pipeline_layout=True), "needs 2 or more ranks"),
    ((), dict(world_size=4, block_params=(7,) * 3, pipeline_layout=True), "has 3 blocks, fewer than one a stage"),
    ((), dict(world_size=2, block_params=(7,) * 3, pipeline_layout=False), "splits the built-in transformer"),
    (("parallel.pp_microbatches=3",), dict(world_size=2, block_params=(7,) * 3, pipeline_layout=True),
     "parallel.pp_microbatches = 3: needs >= 2"),
    (("precision.dtype=\"fp16\"",), dict(world_size=2, block_params=(7,) * 3, pipeline_layout=True),
     "no fp16 loss scaling"),
    # the user left it at 0: the line says so, not a value they never wrote
    ((), dict(world_size=3, block_params=(7,) * 3, pipeline_layout=True),
     re.escape("parallel.pp_microbatches = 0 (auto: 3, one a stage): needs >= 3")),
    (("parallel.pp_stages=3",), dict(world_size=4, block_params=(7,) * 12, pipeline_layout=True),
     "parallel.pp_stages = 3: must be >= 2 and divide WORLD_SIZE=4"),
    (("parallel.pp_stages=1",), dict(world_size=4, block_params=(7,) * 12, pipeline_layout=True),
     "parallel.pp_stages = 1: must be >= 2"),
    (("parallel.pp_stages=4",), dict(world_size=8, block_params=(7,) * 3, pipeline_layout=True),
     "with 4 stages: the model has 3 blocks, fewer than one a stage"),
])
def test_what_the_pipeline_cannot_run_is_refused(overrides, facts, says):
    with pytest.raises(UserError, match=says):
        resolve(pipeline_cfg(*overrides), Facts(device=CPU, **facts))


@pytest.mark.parametrize("asked, batch, fix", [
    (3, 8, "set parallel.pp_microbatches to a divisor of 8 that is >= 2 (e.g. 2), or data.batch_size to a multiple "
           "of 3"),
    (4, 6, "set parallel.pp_microbatches to a divisor of 6 that is >= 2 (e.g. 2), or data.batch_size to a multiple "
           "of 4"),
    (1, 8, "set parallel.pp_microbatches to a divisor of 8 that is >= 2 (e.g. 2)"),  # a batch size cannot help
    (3, 1, "set data.batch_size to a multiple of 3"),  # no chunk count fits a batch of 1
])
def test_chunks_the_user_set_that_do_not_fit_are_told_a_value_that_does(asked, batch, fix):
    """pp_microbatches = 3 with data.batch_size = 8 on 2 stages was told "set data.batch_size to a multiple of 2",
    which 8 already is: following the advice changed nothing."""
    with pytest.raises(UserError) as e:
        resolve(pipeline_cfg(f"parallel.pp_microbatches={asked}", f"data.batch_size={batch}"),
                Facts(device=CPU, world_size=2, block_params=(7,) * 12, pipeline_layout=True))
    assert str(e.value).endswith(fix), str(e.value)
