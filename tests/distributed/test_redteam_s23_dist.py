"""Red-team faults of distributed runs, in this process as rank 0 (gloo on the CPU): a rank lost mid-run is one
error line on the ranks left behind, not their traceback; parallel.sync_batchnorm is applied or refused, never
a traceback (CPU DDP) or silently ignored (FSDP2)."""
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.cli import main
from turbotrain.distributed.env import shutdown

PKG = "userpkg.redteam_s23_dist"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# rank 1 joins the world, then dies at once (killed, out of host memory, its own error): os._exit, no goodbye;
# rank 0's collectives then meet the dead peer while train()'s `finally` (shutdown) runs. Both are fresh processes:
# a process group that failed to form earlier in this one (test_env_slurm) shifts the group's store prefix
RANKS = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from turbotrain.distributed.env import shutdown
    from turbotrain.errors import UserError
    rank = int(sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method="tcp://127.0.0.1:" + sys.argv[1])
    if rank == 1:
        os._exit(1)
    try:
        try:
            for _ in range(3):  # the first may still be written to the socket before the peer's end is seen
                dist.all_reduce(torch.ones(4))
        finally:
            shutdown()
    except UserError as e:
        print("UserError:", e, "| initialized:", dist.is_initialized())
""")


def test_a_collective_with_a_lost_rank_is_one_error_line():
    """Rank 0 printed gloo's "Connection reset by peer" traceback before (a RuntimeError out of DDP's forward)."""
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", RANKS, port, str(r)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        out, err = ranks[0].communicate(timeout=120)
    finally:
        for p in ranks:
            p.kill()
            p.wait()
    assert ranks[0].returncode == 0, err[-3000:]
    line = out.strip()
    assert "\n" not in line and "Traceback" not in err, out + err
    assert re.fullmatch(r"UserError: distributed: rank 0 lost another rank mid-run \(.+\); that rank failed or was "
                        r"killed: .*torchrun's exit code.* \| initialized: False", line), line


def test_other_errors_pass_through_shutdown():
    """Only a lost peer is rewritten: the run's own error (here: not under a process group) stays what it was."""
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        try:
            raise RuntimeError("Connection reset by peer")
        finally:
            shutdown()


@pytest.fixture
def one_rank(monkeypatch):
    """What torchrun sets for its one process: DDP and FSDP2 on a world of 1, in this process."""
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("strategy, said", [
    ("ddp", "SyncBatchNorm runs on GPUs only"),  # torch's ValueError traceback before
    ("fsdp", "synchronised under \"ddp\" only"),  # trained on per-rank statistics, silently, before
])
def test_sync_batchnorm_is_applied_or_refused(tmp_path, capsys, one_rank, strategy, said):
    capsys.readouterr()
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f'model.name="{PKG}:frozen"',
               f"parallel.strategy={strategy}", "parallel.sync_batchnorm=true", "train.steps=2",
               "checkpoint.every=0"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert said in error_line(err) and "parallel.sync_batchnorm=false" in err


def test_sync_batchnorm_without_batchnorm_trains(tmp_path, capsys, one_rank):
    """Nothing to synchronise: the setting changes nothing and the run trains (DDP on the CPU)."""
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f'model.name="{PKG}:tied"',
               "parallel.strategy=ddp", "parallel.sync_batchnorm=true", "train.steps=2", "checkpoint.every=0"])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("addr", ["no-such-node.invalid", ""])
def test_a_master_addr_that_resolves_nowhere_is_one_line_at_once(tmp_path, capsys, monkeypatch, one_rank, addr):
    """A typo in MASTER_ADDR: torch retried the lookup for JOIN_TIMEOUT_MIN (10 min, a warning a second); here
    bounded to a few seconds, where it ended with torch's own error instead of the fix."""
    from turbotrain.distributed import env

    monkeypatch.setenv("MASTER_ADDR", addr)
    monkeypatch.setattr(env, "JOIN_TIMEOUT_MIN", 0.05)
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "parallel.strategy=ddp", "train.steps=2"])
    err = capsys.readouterr().err
    assert rc == 2 and f"MASTER_ADDR={addr!r} is not a known host" in error_line(err)


def test_ranks_whose_datasets_differ_in_length_are_one_error_line(tmp_path):
    """Each rank permuted its own length: samples repeated or went missing across ranks, unsaid."""
    from tests.helpers import run_bounded, userpkg_env

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "turbotrain",
           "train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f'data.name="{PKG}:sized_by_rank"',
           "parallel.strategy=\"ddp\"", "train.steps=2"]
    r = run_bounded(cmd, 240, "ranks of different dataset lengths", env=userpkg_env())
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert lines and all("different lengths (rank 0: 64, rank 1: 80)" in ln for ln in lines), r.stderr[-2000:]
    assert "[rank" not in r.stderr  # no rank's traceback (torchrun's own report of the exit codes follows)
