"""FSDP2's explicit prefetch and reshard policy change when all-gathers are issued and which gathered
parameters are kept, never the math: 2 gloo ranks with each setting equal one process."""
import pytest

from tests.distributed.test_ranks import TINY, losses, run

FOUR = [*TINY, "model.args.n_layer=4"]  # four units: prefetch 2 reaches past the next one


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The single-process curve every setting must equal (trained once for the module)."""
    out = tmp_path_factory.mktemp("one")
    run(out, 0, *FOUR, "run.name=one", "data.batch_size=8")
    return losses(out, "one")


# prefetch 0 with resharding (the default) is test_ranks' FSDP2 case
@pytest.mark.parametrize("prefetch,reshard", [(1, "false"), (2, "true")])
def test_prefetch_and_reshard_equal_one_process(tmp_path, one_process, prefetch, reshard):
    r = run(tmp_path, 2, *FOUR, "run.name=fsdp", "data.batch_size=4", "parallel.strategy=fsdp",
            'parallel.fsdp_units="blocks"', f"parallel.fsdp_prefetch={prefetch}",
            f"parallel.reshard_after_forward={reshard}")
    out = r.stdout + r.stderr
    assert "fsdp: 4 units of 1/1/1/1 blocks" in out
    assert f"explicit prefetch {prefetch} unit" in out
    assert losses(tmp_path, "fsdp") == pytest.approx(one_process, rel=1e-5)
