"""2 gloo ranks on a CPU through torchrun: DDP and FSDP2 equal one process; stragglers are named."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from tests.helpers import run_bounded, userpkg_env

TINY = ["model.args.n_layer=2", "model.args.n_embd=32", "model.args.n_head=2", "data.args.block_size=32",
        "precision.dtype=fp32", "model.args.dropout=0.0", "train.steps=6", "train.log_every=1"]


def run(tmp_path, nproc, *args, env=None):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "turbotrain", "train", *args, f"run.out_dir={str(tmp_path)!r}"] if nproc else \
          [sys.executable, "-m", "turbotrain", "train", *args, f"run.out_dir={str(tmp_path)!r}"]
    r = run_bounded(cmd, 240, " ".join(cmd[3:6]), env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def losses(tmp_path, name, key="loss"):
    return [json.loads(line)[key] for line in open(tmp_path / name / "metrics.jsonl")]


single_dir: list = []  # the 1-process run's directory, filled with `single`


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    path = tmp_path_factory.mktemp("single")
    single_dir.append(path / "one")
    run(path, 0, *TINY, "run.name=one", "data.batch_size=8")
    single_norms.extend(losses(path, "one", "grad_norm"))
    return losses(path, "one")


single_norms: list[float] = []  # the 1-process run's gradient norms, filled with `single`


@pytest.mark.parametrize("strategy, micro, accum, extra", [
    ("ddp", 4, 1, ""), ("fsdp", 4, 1, "model"), ("fsdp", 4, 1, "blocks"), ("ddp", 2, 2, ""), ("fsdp", 2, 2, "blocks")])
def test_two_ranks_equal_one_process(tmp_path, single, strategy, micro, accum, extra):
    run(tmp_path, 2, *TINY, "run.name=dist", f"parallel.strategy={strategy}", f"data.batch_size={micro}",
        f"train.grad_accum={accum}", *([f"parallel.fsdp_units={extra}"] if extra else []))
    dist = losses(tmp_path, "dist")
    assert len(dist) == len(single) == 6
    assert dist == pytest.approx(single, rel=1e-4)
    # the norm (clipping at 1.0 acts on these steps) over sharded / all-reduced gradients is the global one
    assert losses(tmp_path, "dist", "grad_norm") == pytest.approx(single_norms, rel=1e-4)
    summary = json.loads((tmp_path / "dist" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["strategy"] == strategy and summary["global_batch"] == 8
    # final/ holds the whole model (gathered under FSDP2), the same weights as the 1-process run's
    from turbotrain import load

    mine, theirs = load(tmp_path / "dist").state_dict(), load(single_dir[0]).state_dict()
    assert mine.keys() == theirs.keys()
    for k in mine:
        torch.testing.assert_close(mine[k], theirs[k], rtol=1e-3, atol=1e-5)


def test_fsdp_units_of_several_blocks_equal_one_process(tmp_path):
    """parallel.fsdp_units=2 on 4 blocks: two units of two blocks each (plus the root), the same losses."""
    deep = [*TINY, "model.args.n_layer=4"]
    run(tmp_path, 0, *deep, "run.name=one", "data.batch_size=8")
    r = run(tmp_path, 2, *deep, "run.name=dist", "parallel.strategy=fsdp", "data.batch_size=4", "parallel.fsdp_units=2")
    assert "fsdp: 2 units of 2/2 blocks" in r.stdout + r.stderr
    assert losses(tmp_path, "dist") == pytest.approx(losses(tmp_path, "one"), rel=1e-4)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_bf16_gradient_compression_stays_close(tmp_path, single, strategy):
    """Gradients reduced in bf16 (DDP comm hook / FSDP2 reduce dtype): close to the fp32 run, not equal."""
    run(tmp_path, 2, *TINY, "run.name=dist", f"parallel.strategy={strategy}", "data.batch_size=4",
        'parallel.grad_compression="bf16"')
    dist = losses(tmp_path, "dist")
    assert dist == pytest.approx(single, rel=1e-2)
    assert dist != single  # the reduction did run in bf16


def test_ddp_compiles_model_and_loss_as_one_graph(tmp_path):
    """DDP wraps model + loss: dynamo breaks the graph at DDP's forward, and the loss must land in the same
    graph as the head (a separate loss graph keeps fp32 logits in memory: 0.80-0.84x on an H200)."""
    run(tmp_path, 1, *TINY, "run.name=g", "parallel.strategy=ddp", "data.batch_size=4", "compile.enabled=true",
        'compile.backend="eager"')
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert not summary["compile_fell_back"] and summary["unique_graphs"] == 1


def test_straggler_is_named(tmp_path):
    env = userpkg_env()
    r = run(tmp_path, 2, "mlp-seed", "model.name=\"userpkg.slow:build_model\"", "data.name=\"userpkg.slow:build_data\"",
            "parallel.strategy=ddp", "data.batch_size=4", "data.num_workers=0", "train.steps=12",
            "train.log_every=2", "precision.dtype=fp32", "run.name=slow", env=env)
    assert "straggler: rank 1" in r.stdout
    rows = [json.loads(line) for line in open(tmp_path / "slow" / "metrics.jsonl")]
    assert rows[-1]["slowest_rank"] == 1 and rows[-1]["rank_time_ratio"] > 1.25


def test_scale_writes_both_rows(tmp_path):
    """Repeats go in rounds over the world sizes; the NCCL environment of the call is recorded."""
    r = subprocess.run([sys.executable, "-m", "turbotrain", "scale", *TINY, "train.steps=8",
                        f"run.out_dir={str(tmp_path)!r}", "--gpus", "1,2", "--repeats", "2"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "NCCL_MAX_CTAS": "8"})
    assert r.returncode == 0, r.stderr[-2000:]
    order = re.findall(r"scale: ddp on (\d) .*\(repeat (\d)/2\)$", r.stderr + r.stdout, flags=re.M)  # not heartbeats
    assert order == [("1", "1"), ("2", "1"), ("1", "2"), ("2", "2")]
    result = json.loads((tmp_path / "gpt-shakespeare-scale" / "scale.json").read_text())
    rows = result["rows"]
    assert [row["world_size"] for row in rows] == [1, 2]
    # CPU processes share the host's cores: no efficiency and no GPU target is claimed for them
    assert all(row["efficiency"] is None and row["target"] is None and not row["below_target"] for row in rows)
    assert all(row["runs"] == 2 and row["spread_per_device"][0] <= row["samples_per_s_per_device"]
               <= row["spread_per_device"][1] for row in rows)
    table = (tmp_path / "gpt-shakespeare-scale" / "scale.md").read_text()
    assert "Median of 2 runs" in table and "NCCL_MAX_CTAS=8" in table and result["nccl_env"]["NCCL_MAX_CTAS"] == "8"
    assert result["performance_figure"] is False and "not a performance figure" in r.stdout


def test_fsdp_sharded_checkpoint_resumes_exactly_and_reshards(tmp_path):
    """FSDP2 checkpoints go through torch.distributed.checkpoint: a 2-rank run resumes bit-exactly, and
    the same checkpoint loads into 1 rank (resharded) with the same global batch."""
    common = [*TINY, "train.schedule=constant", "train.warmup_steps=0", "checkpoint.every=4",
              "parallel.strategy=fsdp"]
    run(tmp_path, 2, *common, "run.name=whole", "train.steps=12", "data.batch_size=4")
    run(tmp_path, 2, *common, "run.name=parts", "train.steps=8", "data.batch_size=4")
    assert (tmp_path / "parts" / "checkpoints" / "step-00000008" / "dcp").is_dir()
    r = run(tmp_path, 2, *common, "run.name=parts", "train.steps=12", "data.batch_size=4")
    assert "resumed from step 8" in r.stdout
    assert losses(tmp_path, "parts") == losses(tmp_path, "whole")
    one = tmp_path / "one" / "checkpoints"
    one.mkdir(parents=True)
    import shutil
    shutil.copytree(tmp_path / "parts" / "checkpoints" / "step-00000008", one / "step-00000008")
    r = run(tmp_path, 1, *common, "run.name=one", "train.steps=12", "data.batch_size=8")
    assert "resumed from step 8" in r.stdout
    assert losses(tmp_path, "one") == pytest.approx(losses(tmp_path, "whole")[8:], rel=1e-5)
