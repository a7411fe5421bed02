"""Models bigger than one device, more than one machine (gloo ranks on a CPU through torchrun):
meta-device initialisation equals a full-size build and keeps set-up host memory below the model's size;
two "nodes" (two torchrun processes, c10d rendezvous) equal one process; HSDP (2 x 2) equals one process;
an FSDP2 checkpoint saved at 4 ranks resumes at 2 on the same loss curve."""
import json
import os
import shutil
import socket
import sys

import pytest

from tests.distributed.test_ranks import TINY, losses, run
from tests.helpers import run_bounded


def one_process(tmp_path, *args):
    run(tmp_path, 0, *TINY, "run.name=one", "data.batch_size=8", *args)
    return losses(tmp_path, "one")


def test_meta_init_equals_full_size_build(tmp_path):
    """The seeded per-parameter init gives a meta build (materialised after sharding) the full-size build's
    weights: the same loss curve in one process and on 2 FSDP2 ranks (meta_init "auto" is on there)."""
    full = one_process(tmp_path, "parallel.meta_init=false")
    r = run(tmp_path, 0, *TINY, "run.name=meta1", "data.batch_size=8", "parallel.meta_init=true")
    assert "initialised by GPT.init_weights(seed=0)" in r.stdout + r.stderr
    assert losses(tmp_path, "meta1") == full
    r = run(tmp_path, 2, *TINY, "run.name=meta2", "data.batch_size=4", "parallel.strategy=fsdp",
            'parallel.fsdp_units="blocks"')
    assert "built on the meta device" in r.stdout + r.stderr
    assert losses(tmp_path, "meta2") == pytest.approx(full, rel=1e-5)
    cfg = (tmp_path / "meta2" / "config.toml").read_text()
    assert "meta_init = true" in cfg


def test_llama_meta_init_on_two_ranks_equals_full_size_build(tmp_path):
    """Llama (RoPE tables as non-persistent buffers, grouped-query attention) the same way."""
    llama = ['model.name="llama"', "model.args.n_layer=2", "model.args.n_embd=32", "model.args.n_head=4",
             "model.args.n_kv_head=2", "model.args.ffn_hidden=48", "data.args.block_size=32",
             "model.args.block_size=32", "precision.dtype=fp32", "train.steps=4", "train.log_every=1"]
    run(tmp_path, 0, *llama, "run.name=full", "data.batch_size=8")
    r = run(tmp_path, 2, *llama, "run.name=meta", "data.batch_size=4", "parallel.strategy=fsdp")
    assert "initialised by FSDPLlama.init_weights(seed=0)" in r.stdout + r.stderr
    assert losses(tmp_path, "meta") == pytest.approx(losses(tmp_path, "full"), rel=1e-5)


BIG = ["model.args.n_layer=12", "model.args.n_embd=768", "model.args.n_head=12", "model.args.vocab_size=50304",
       "data.args.block_size=64", "model.args.block_size=64", "precision.dtype=fp32", "train.steps=1",
       "data.batch_size=1", "parallel.strategy=fsdp", 'parallel.fsdp_units="blocks"', "train.log_every=1",
       "checkpoint.every=0", "checkpoint.final=false", "data.eval_batches=0"]


def setup_growth(tmp_path, nproc, name, *args):
    run(tmp_path, nproc, *BIG, f"run.name={name}", *args)
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    growth = summary["setup_host_growth_mb"]
    print(f"{name}: model fp32 {summary['params'] * 4 / 2**20:.0f} MiB; set-up host growth per rank {growth} MiB")
    assert len(growth) == nproc and None not in growth
    return summary["params"] * 4 / 2**20, growth


def test_meta_init_keeps_setup_host_memory_below_the_model(tmp_path):
    """GPT-2 124M shapes (block 64) under FSDP2: each rank's peak host memory growth while the model is built,
    sharded and initialised (summary's setup_host_growth_mb). A meta build holds its shard plus one 4 MiB
    chunk of draws: below 3/4 of the model's fp32 size at 2 ranks (where the shard alone is half of it) and below
    half of it at 4 ranks (a full-size build grows by more than the whole model: docs/scale-out.md)."""
    model_mb, meta2 = setup_growth(tmp_path, 2, "meta2")
    assert max(meta2) < 0.75 * model_mb, (meta2, model_mb)
    _, meta4 = setup_growth(tmp_path, 4, "meta4")
    assert max(meta4) < model_mb / 2, (meta4, model_mb)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_nodes_equal_one_process(tmp_path):
    """The same command on two "nodes": two torchrun processes (--nnodes=2, one rank each) meeting through
    c10d rendezvous, as srun starts them under SLURM."""
    single = one_process(tmp_path)
    port = free_port()
    out = tmp_path / "nodes"
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
               f"--node_rank={node}", "--rdzv_backend=c10d", f"--rdzv_endpoint=localhost:{port}", "--rdzv_id=tt",
               "-m", "turbotrain", "train", *TINY, "run.name=nodes", "data.batch_size=4", "parallel.strategy=ddp",
               f"run.out_dir={str(out)!r}"]
        procs.append(cmd)
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: run_bounded(c, 240, f"node {c[5]}", env=dict(os.environ)), procs))
    for r in results:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    summary = json.loads((out / "nodes" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_batch"] == 8
    assert losses(out, "nodes") == pytest.approx(single, rel=1e-4)


def test_hsdp_two_by_two_equals_one_process(tmp_path):
    """HSDP on 4 ranks: 2 replicas x shard groups of 2 (a 2-D mesh); the clipped grad norm is the global one."""
    single = one_process(tmp_path)
    norms = losses(tmp_path, "one", "grad_norm")
    r = run(tmp_path, 4, *TINY, "run.name=hsdp", "data.batch_size=2", "parallel.strategy=hsdp",
            "parallel.shard_size=2", 'parallel.fsdp_units="blocks"')
    assert "hsdp: 2 replicas x 2 ranks a shard group" in r.stdout + r.stderr
    assert losses(tmp_path, "hsdp") == pytest.approx(single, rel=1e-4)
    assert losses(tmp_path, "hsdp", "grad_norm") == pytest.approx(norms, rel=1e-4)


def test_fsdp_checkpoint_from_four_ranks_resumes_at_two(tmp_path):
    """DCP reshards on load; the data order is the global permutation cut into the same global batches at
    any world size, so 4 ranks x 2 and 2 ranks x 4 samples continue the same curve."""
    common = [*TINY, "train.schedule=constant", "train.warmup_steps=0", "checkpoint.every=4",
              "parallel.strategy=fsdp", "train.steps=8"]
    run(tmp_path, 4, *common, "run.name=whole", "data.batch_size=2")
    parts = tmp_path / "parts" / "checkpoints"
    parts.mkdir(parents=True)
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "step-00000004", parts / "step-00000004")
    r = run(tmp_path, 2, *common, "run.name=parts", "data.batch_size=4")
    assert "resumed from step 4" in r.stdout
    assert losses(tmp_path, "parts") == pytest.approx(losses(tmp_path, "whole")[4:], rel=1e-5, abs=1e-5)
