"""Async checkpoint saves (one process: DCP without a process group): a save in the background is sealed only
by `finish` or the next save, never before; a background write that fails removes its temp folder, is one
UserError, and leaves the earlier checkpoints as they were."""
import resource
import signal

import pytest
import torch

from turbotrain.checkpoint import CheckpointConfig, Checkpointer
from turbotrain.errors import UserError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state():
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)  # 257 KB of fp32 weights: its DCP shard is larger than the file limit below
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 256)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, opt, sched, torch.amp.GradScaler("cpu", enabled=False)


def test_sealed_at_the_next_save_and_at_finish(tmp_path):
    ck = Checkpointer(CheckpointConfig(every=1, async_save=True), tmp_path, 0, 1, sharded=True)
    parts = state()
    ck.save(1, *parts, {"k": 1}, wait=False)
    assert ck.list() == [] and (tmp_path / "checkpoints" / ".tmp-step-00000001").is_dir()  # in flight
    ck.save(2, *parts, {"k": 1}, wait=False)  # seals step 1 first: one save in flight at a time
    assert [p.name for p in ck.list()] == ["step-00000001"] and Checkpointer.verify(ck.list()[0]) is None
    assert ck.in_flight and ck.finish() == (2, tmp_path / "checkpoints" / "step-00000002")
    assert not ck.in_flight
    assert Checkpointer.verify(ck.list()[1]) is None and ck.finish() is None
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]


def test_a_failed_background_write_removes_its_folder_and_is_one_error(tmp_path):
    """The file-size limit (as a full disk would) fails the background write of the shards, after the small
    files were written at once: reported by `finish`, the temp folder gone, step 1 kept and valid."""
    ck = Checkpointer(CheckpointConfig(every=1, async_save=True), tmp_path, 0, 1, sharded=True)
    parts = state()
    ck.save(1, *parts, {"k": 1}, wait=False)
    ck.finish()
    limit, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, limit[1]))
    try:
        ck.save(2, *parts, {"k": 1}, wait=False)
        assert ck._pending is not None  # the failure is the background write's
        with pytest.raises(UserError, match=r"cannot write .*\.tmp-step-00000002.*the earlier checkpoints are kept"):
            ck.finish()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001"]
    assert Checkpointer.verify(tmp_path / "checkpoints" / "step-00000001") is None
