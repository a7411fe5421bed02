"""kernels.fused_loss under DDP: 2 gloo ranks with the fused head + loss equal one process without it."""
import pytest

from tests.distributed.test_ranks import TINY, losses, run


def test_ddp_with_fused_loss_equals_one_unfused_process(tmp_path):
    run(tmp_path, 0, *TINY, "run.name=one", "data.batch_size=8")
    run(tmp_path, 2, *TINY, "run.name=dist", "parallel.strategy=ddp", "data.batch_size=4", "kernels.fused_loss=true")
    assert losses(tmp_path, "dist") == pytest.approx(losses(tmp_path, "one"), rel=1e-4)
    assert losses(tmp_path, "dist", "grad_norm") == pytest.approx(losses(tmp_path, "one", "grad_norm"), rel=1e-4)
