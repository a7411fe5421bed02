"""FSDP2 units: which blocks share a unit (decided before sharding; nothing here needs a process group)."""
import pytest

from turbotrain.distributed.fsdp import unit_groups
from turbotrain.models.gpt import build as build_gpt


@pytest.mark.parametrize("setting, sizes", [
    ("model", []), ("auto", []), (1, []), ("blocks", [1] * 5), (2, [2, 3]), (3, [2, 1, 2]), (9, [1] * 5)])
def test_units_are_runs_of_consecutive_blocks(setting, sizes):
    model = build_gpt(vocab_size=65, block_size=16, n_layer=5, n_head=2, n_embd=16)  # 5 small blocks: auto = one unit
    groups = unit_groups(model, setting)
    assert [len(g) for g in groups] == sizes
    assert [b for g in groups for b in g] == (list(model.blocks) if sizes else [])


def test_fsdp_units_must_count_at_least_one():
    from turbotrain.config import load_config
    from turbotrain.errors import UserError

    with pytest.raises(UserError, match="fsdp_units = 0"):
        load_config("gpt-shakespeare", ["parallel.fsdp_units=0"])


def test_local_shard_stepping_only_for_elementwise_optimizers(capsys):
    """FSDP2 steps on local shards only where that is the same math (AdamW, Adam, SGD); any other optimizer
    keeps torch's DTensor step, and the run says so once."""
    import torch

    from turbotrain.distributed.fsdp import shard_local_step

    params = list(torch.nn.Linear(4, 4).parameters())
    adamw = shard_local_step(torch.optim.AdamW(params))
    assert type(adamw).__name__ == "ShardLocalAdamW"
    adagrad = torch.optim.Adagrad(params)
    assert shard_local_step(adagrad) is adagrad and type(adagrad) is torch.optim.Adagrad
    assert "Adagrad is not known to be elementwise" in capsys.readouterr().out
