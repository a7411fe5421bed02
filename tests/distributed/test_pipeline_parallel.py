"""Pipeline parallelism over 2 gloo ranks on a CPU equals one process: a tiny GPT with tied embeddings (wte on
the first stage, head on the last), split 2/1 by blocks, both schedules, with and without accumulation; the
loss, the global gradient norm (clipping acts on these steps) and the validation loss match. Configs the
pipeline cannot run stop at start with one `error:` line on every rank."""
import json
import socket
import subprocess
import sys

import pytest

from tests.faults.common import BASE_TOML, error_line, subprocess_env
from tests.helpers import run_bounded

TINY = ["model.args.n_layer=3", "model.args.n_embd=32", "model.args.n_head=2", "data.args.block_size=32",
        "precision.dtype=fp32", "model.args.dropout=0.0", "train.steps=6", "train.log_every=1", "train.eval_every=3"]


def train(tmp_path, nproc, *args) -> subprocess.CompletedProcess:
    tail = ["-m", "turbotrain", "train", *args, f"run.out_dir={str(tmp_path)!r}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *tail] \
        if nproc else [sys.executable, *tail]
    r = run_bounded(cmd, 240, "pipeline run", env=subprocess_env())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def metrics(tmp_path, name) -> list[dict]:
    return [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    path = tmp_path_factory.mktemp("single")
    train(path, 0, *TINY, "run.name=one", "data.batch_size=8")
    return metrics(path, "one")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule, micro, accum", [("1f1b", 8, 1), ("gpipe", 8, 1), ("1f1b", 4, 2), ("gpipe", 4, 2)])
def test_two_stages_equal_one_process(tmp_path, single, schedule, micro, accum):
    r = train(tmp_path, 2, *TINY, "run.name=pp", "parallel.strategy=pipeline", f"parallel.pp_schedule={schedule}",
              f"data.batch_size={micro}", f"train.grad_accum={accum}")
    assert "pipeline: 2 stages of 2/1 blocks; 1 tied parameter(s)" in r.stdout + r.stderr
    pp = metrics(tmp_path, "pp")
    assert len(pp) == len(single) == 6
    for key in ("loss", "grad_norm"):
        assert [row[key] for row in pp] == pytest.approx([row[key] for row in single], abs=1e-5, rel=0), key
    for key in ("val_loss", "val_acc"):
        assert [row.get(key) for row in pp if key in row] == pytest.approx(
            [row.get(key) for row in single if key in row], abs=1e-5, rel=0), key
    assert sum("val_loss" in row for row in pp) == 2  # steps 3 and 6


def two_ranks(tmp_path, *args) -> list[subprocess.CompletedProcess]:
    """Ranks 0 and 1 of a world of 2 as two plain processes (torchrun's variables set here), so each
    rank's own exit code and stderr can be read."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-m", "turbotrain", "train", *args, f"run.out_dir={str(tmp_path)!r}"],
                              env=subprocess_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                                                 LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                                 MASTER_PORT=str(port)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung on a config the pipeline refuses")
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args, says", [
    ([*TINY, "model.args.n_layer=1"], "the model has 1 blocks, fewer than one a stage"),
    ([str(BASE_TOML)], "splits the built-in transformer"),
    ([*TINY, "data.batch_size=6", "parallel.pp_microbatches=4"], "parallel.pp_microbatches = 4: needs >= 2"),
])
def test_configs_the_pipeline_cannot_run_are_one_error_line(tmp_path, args, says):
    for rank, r in enumerate(two_ranks(tmp_path, *args, "parallel.strategy=pipeline")):
        assert r.returncode == 2, f"rank {rank}: rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        assert says in error_line(r.stderr)


@pytest.mark.timeout(400)
def test_resume_at_the_same_layout_continues_the_curve(tmp_path):
    """Each stage writes its own parameters and optimizer state (DCP, original names); a run stopped at step
    3 and resumed to 6 has the loss curve of one that ran 6 steps straight. Constant LR: the schedule's
    length does not change between the two halves."""
    args = [*TINY, "parallel.strategy=pipeline", "data.batch_size=8", "train.schedule=constant", "checkpoint.every=3"]
    train(tmp_path, 2, *args, "run.name=straight", "train.steps=6")
    train(tmp_path, 2, *args, "run.name=halves", "train.steps=3")
    r = train(tmp_path, 2, *args, "run.name=halves", "train.steps=6")
    assert "resumed from step 3" in r.stdout + r.stderr
    straight, halves = metrics(tmp_path, "straight"), metrics(tmp_path, "halves")
    assert [row["step"] for row in halves] == list(range(1, 7))
    assert [row["loss"] for row in halves] == pytest.approx([row["loss"] for row in straight], abs=1e-6, rel=0)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("schedule, micro, accum, units", [("1f1b", 4, 1, "model"), ("gpipe", 2, 2, "blocks")])
def test_two_stages_of_two_fsdp_shards_equal_one_process(tmp_path, single, schedule, micro, accum, units):
    """4 ranks = 2 stages x 2 FSDP2 shards on a ("pp", "dp") mesh: each dp group reads half the global batch
    of 8, the tied wte/head gradient is summed shard by shard over the pp group, the norm over both."""
    r = train(tmp_path, 4, *TINY, "run.name=pp2d", "parallel.strategy=pipeline", "parallel.pp_stages=2",
              f"parallel.pp_schedule={schedule}", f"parallel.fsdp_units={units}", f"data.batch_size={micro}",
              f"train.grad_accum={accum}")
    assert "pipeline: 2 stages of 2/1 blocks, each sharded over 2 ranks (FSDP2); 1 tied" in r.stdout + r.stderr
    pp = metrics(tmp_path, "pp2d")
    assert len(pp) == len(single) == 6
    for key in ("loss", "grad_norm", "val_loss", "val_acc"):
        assert [row[key] for row in pp if key in row] == pytest.approx(
            [row[key] for row in single if key in row], abs=1e-5, rel=0), key
    assert sum("val_loss" in row for row in pp) == 2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stages", ["3", "1"])
def test_pp_stages_that_do_not_divide_the_world_are_one_error_line(tmp_path, stages):
    for rank, r in enumerate(two_ranks(tmp_path, *TINY, "parallel.strategy=pipeline", f"parallel.pp_stages={stages}")):
        assert r.returncode == 2, f"rank {rank}: rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        assert f"parallel.pp_stages = {stages}: must be >= 2 and divide WORLD_SIZE=2" in error_line(r.stderr)


@pytest.mark.timeout(400)
def test_resume_of_fsdp_sharded_stages_continues_the_curve(tmp_path):
    """2 stages x 2 FSDP2 shards: each rank writes its shard of its stage (DCP, original names, flat
    optimizer); a run stopped at step 3 and resumed to 6 has the loss curve of one that ran 6 steps straight."""
    args = [*TINY, "parallel.strategy=pipeline", "parallel.pp_stages=2", "data.batch_size=4",
            "train.schedule=constant", "checkpoint.every=3"]
    train(tmp_path, 4, *args, "run.name=straight", "train.steps=6")
    train(tmp_path, 4, *args, "run.name=halves", "train.steps=3")
    r = train(tmp_path, 4, *args, "run.name=halves", "train.steps=6")
    assert "resumed from step 3" in r.stdout + r.stderr
    straight, halves = metrics(tmp_path, "straight"), metrics(tmp_path, "halves")
    assert [row["step"] for row in halves] == list(range(1, 7))
    assert [row["loss"] for row in halves] == pytest.approx([row["loss"] for row in straight], abs=1e-6, rel=0)
