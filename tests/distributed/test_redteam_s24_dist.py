"""Sixth red-team wave, distributed runs on the CPU: an error line that is the same on every rank is said once
a job (through torchrun's own store), a rank-specific one by its rank; a count of non-finite steps on one rank is
not divided by the world size; DDP's static_graph trains with gradient accumulation; ranks evaluate the
BatchNorm statistics that are saved."""
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

from tests.faults.common import BASE_TOML, lit, rows
from turbotrain.cli import main
from turbotrain.distributed.env import first_to_say


@pytest.fixture
def agent_store(monkeypatch):
    """The store torchrun's agent hosts and shares with its workers (torch >= 2.4), and the variables it sets."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for k, v in {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2",
                 "MASTER_PORT": str(store.port), "RANK": "0", "TORCHELASTIC_RUN_ID": "none",
                 "TORCHELASTIC_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(k, v)
    return store


def test_the_same_error_on_every_rank_is_said_once(agent_store, monkeypatch):
    """Before: 2 ranks, 2 identical `error: train.lr = -1.0: must be > 0` lines (N on N ranks)."""
    line = "error: train.lr = -1.0: must be > 0"
    assert first_to_say(line)
    monkeypatch.setenv("RANK", "1")
    assert not first_to_say(line)  # the same text from another rank: already said
    assert first_to_say("error: planted fault on rank 1")  # a rank's own error is still said
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert first_to_say(line)  # a restarted worker group says its errors again


@pytest.mark.parametrize("env", [{"TORCHELASTIC_USE_AGENT_STORE": "False"}, {"WORLD_SIZE": "1"},
                                 {"MASTER_PORT": "x"}, {"MASTER_PORT": "70000"},
                                 {"MASTER_ADDR": "no-such-node.invalid"}, {"MASTER_ADDR": ""}])
def test_every_line_is_said_where_no_store_can_tell(agent_store, monkeypatch, env):
    """No shared store (the launcher's opt-out, SLURM's srun), one rank, or a launcher variable that is itself the
    error: each rank says its line (twice beats never)."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert first_to_say("error: x") and first_to_say("error: x")


# each rank's loss, peak memory and non-finite streak as RunMonitor.measure reduces them; rank 1's forward alone
# gives NaN (the other rank's loss stays finite under fp16 loss scaling, which skips those steps)
REDUCE = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from turbotrain.distributed.env import all_mean
    rank = int(sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method="tcp://127.0.0.1:" + sys.argv[1])
    mine = [1.0, 0.5, 0.0] if rank == 0 else [float("nan"), 1.5, 4.0]
    print(all_mean(mine, torch.device("cpu"), maxed=(2,)), all_mean([1.0, 3.0], torch.device("cpu")))
    dist.destroy_process_group()
""")


def test_a_streak_on_one_rank_is_counted_whole():
    """Before: the non-finite streak was averaged over ranks, so a NaN forward on 1 rank of 2 (fp16) read
    "non-finite for 2 step(s)" after 4 and train.max_bad_steps=3 stopped the run at step 5, not 3 (N x late on N
    ranks). The max over ranks is the streak of the averaged loss; the rest stays a mean."""
    assert two_ranks(REDUCE) == ["[nan, 1.0, 4.0] [1.0, 3.0]"] * 2


@pytest.fixture
def one_rank(monkeypatch):
    """What torchrun sets for its one process: DDP on a world of 1, in this process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}.items():
        monkeypatch.setenv(k, v)


def test_ddp_static_graph_with_gradient_accumulation_trains(tmp_path, capsys, one_rank):
    """Before: torch's "expect_autograd_hooks_ INTERNAL ASSERT FAILED ... please report a bug to PyTorch"
    traceback on every rank at the first step (its first backward ran under no_sync). The same gradients as
    without static_graph."""
    def run(name, *extra):
        rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f"run.name={name}",
                   "parallel.strategy=ddp", "train.grad_accum=2", "data.batch_size=4", "train.steps=3",
                   "checkpoint.every=0", *extra])
        assert rc == 0, capsys.readouterr().err
        return [v for r in rows(tmp_path / name) for v in (r["loss"], r["grad_norm"])]

    assert run("static", "parallel.static_graph=true") == pytest.approx(run("plain"), rel=1e-6)


def two_ranks(script: str, *args: str) -> list[str]:
    """`script` as ranks 0 and 1 of a gloo world (fresh processes: argv[1] the port, argv[2] the rank)."""
    port, env = free_port(), {**os.environ, "OMP_NUM_THREADS": "1"}
    codes, outs = finished([subprocess.Popen([sys.executable, "-c", script, port, str(r), *args], env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                            for r in (0, 1)])
    assert codes == [0, 0], outs
    return [out.strip() for out, _ in outs]


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def finished(procs: list[subprocess.Popen], timeout: float = 120) -> tuple[list[int], list[tuple[str, str]]]:
    """Each process's exit code and (stdout, stderr); none outlives the call."""
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return [p.returncode for p in procs], outs


# a BatchNorm model under DDP, then FSDP2, trained a step on each rank's own batch, then evaluated as
# step.evaluate does (under DDP: the wrapped module itself, no DDP forward, so no collective in its forwards)
EVAL_BN = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from torch import nn
    from turbotrain.distributed.ddp import apply_ddp, rank0_running_stats
    from turbotrain.distributed.fsdp import apply_fsdp
    from turbotrain.distributed.parallel import ParallelConfig
    rank, cpu = int(sys.argv[2]), torch.device("cpu")
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method="tcp://127.0.0.1:" + sys.argv[1])
    for strategy in ("ddp", "fsdp"):
        torch.manual_seed(0)
        net, cfg = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)), ParallelConfig(strategy=strategy)
        model = apply_ddp(net, cpu, cfg) if strategy == "ddp" else apply_fsdp(net, cpu, 2, None, cfg)
        model(torch.randn(16, 4, generator=torch.Generator().manual_seed(rank)) * (1 + rank)).sum().backward()
        net.eval()
        if strategy == "ddp":  # step.evaluate's start (FSDP2's forwards do it themselves)
            rank0_running_stats(net)
        with torch.no_grad():
            out = net(torch.ones(2, 4))
        print(strategy, round(out.sum().item(), 5), round(net[1].running_var.sum().item(), 5))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo threads outlive destroy_process_group once FSDP is imported: a teardown abort (-6) at exit
""")


def test_ranks_evaluate_the_batchnorm_statistics_that_are_saved():
    """Before: each rank evaluated with its own running statistics, so val_loss was a mean over models that do
    not exist (2 ranks of a BatchNorm model: 8.336 under DDP, 8.434 under FSDP2, where the saved final/ scores
    8.299 on the same val batches, as both now report); checkpoints keep rank 0's. Now every rank's eval
    forward uses rank 0's: all ranks give rank 0's outputs."""
    rank0, rank1 = ([ln for ln in out.splitlines() if ln.startswith(("ddp", "fsdp"))] for out in two_ranks(EVAL_BN))
    assert len(rank0) == 2 and rank0 == rank1
