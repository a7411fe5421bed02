"""`checkpoint.async_save` on 2 gloo FSDP2 ranks: the shards are staged to host memory and written in the
background while training goes on; the run's losses equal a synchronous run's, every checkpoint is sealed
(the one still in flight when the run ended included) and verifies, and a resume from the one written while
training went on continues the exact curve."""
import re
import shutil

import pytest

from tests.distributed.test_ranks import TINY, losses, run
from tests.helpers import userpkg_env
from turbotrain.checkpoint import Checkpointer

COMMON = [*TINY, "train.schedule=constant", "train.warmup_steps=0", "checkpoint.every=2",
          "parallel.strategy=fsdp", 'parallel.fsdp_units="blocks"', "data.batch_size=4"]


def test_async_save_equals_sync_and_resumes_exactly(tmp_path):
    run(tmp_path, 2, *COMMON, "run.name=sync")
    r = run(tmp_path, 2, *COMMON, "run.name=async", "checkpoint.async_save=true",
            'train.callbacks=["userpkg.extensions:CheckpointsOnDisk"]', env={"PYTHONPATH": userpkg_env()["PYTHONPATH"]})
    sealed = [line for line in r.stdout.splitlines() if "written in the background; sealed" in line]
    assert [line.split()[2] for line in sealed] == ["step-00000002", "step-00000004"]  # step 6, the end: waited
    # callbacks see each checkpoint once it is sealed on disk (rank 0's lines; every rank checked its own)
    # (both ranks print to one pipe, so their lines can run together: read the lines' contents, not the lines)
    hooked = sorted(set(re.findall(r"on_checkpoint: step \d+ step-\d{8}", r.stdout)))
    assert hooked == [f"on_checkpoint: step {s} step-{s:08d}" for s in (2, 4, 6)]
    assert losses(tmp_path, "async") == pytest.approx(losses(tmp_path, "sync"), rel=1e-6)
    ckpts = tmp_path / "async" / "checkpoints"
    # step 4 was being written while steps 5 and 6 trained: the end of the run sealed it, then saved step 6
    assert [p.name for p in Checkpointer(None, tmp_path / "async", 0, 2, True).list()] == \
        ["step-00000002", "step-00000004", "step-00000006"]
    assert not list(ckpts.glob(".tmp-step-*"))
    for p in ckpts.glob("step-*"):
        assert Checkpointer.verify(p) is None, p
    resumed = tmp_path / "resumed" / "checkpoints"
    resumed.mkdir(parents=True)
    shutil.copytree(ckpts / "step-00000004", resumed / "step-00000004")
    r = run(tmp_path, 2, *COMMON, "run.name=resumed", "checkpoint.async_save=true")
    assert "resumed from step 4" in r.stdout
    assert losses(tmp_path, "resumed") == pytest.approx(losses(tmp_path, "async")[4:], rel=1e-5, abs=1e-5)



@pytest.mark.timeout(400)
def test_async_save_of_pipeline_stages_resumes_exactly(tmp_path):
    """Pipeline stages write their own parts (DCP) the same way: equal to synchronous saves, and the checkpoint
    still in flight at the end of the run (step 2: step 4 is the end's own) resumes on the same curve."""
    from tests.distributed.test_pipeline_parallel import TINY as PP_TINY
    from tests.distributed.test_pipeline_parallel import metrics, train

    args = [*PP_TINY, "parallel.strategy=pipeline", "data.batch_size=8", "train.schedule=constant",
            "checkpoint.every=2", "train.steps=4"]
    train(tmp_path, 2, *args, "run.name=sync")
    train(tmp_path, 2, *args, "run.name=async", "checkpoint.async_save=true")
    done = [row["loss"] for row in metrics(tmp_path, "async")]
    assert done == pytest.approx([row["loss"] for row in metrics(tmp_path, "sync")], rel=1e-6)
    ckpts = tmp_path / "async" / "checkpoints"
    assert Checkpointer.verify(ckpts / "step-00000002") is None and not list(ckpts.glob(".tmp-step-*"))
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpts / "step-00000002", tmp_path / "resumed" / "checkpoints" / "step-00000002")
    r = train(tmp_path, 2, *args, "run.name=resumed", "checkpoint.async_save=true")
    assert "resumed from step 2" in r.stdout + r.stderr
    assert [row["loss"] for row in metrics(tmp_path, "resumed")] == pytest.approx(done[2:], abs=1e-5, rel=1e-5)
