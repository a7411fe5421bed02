"""A run directory that not every rank sees: 2 ranks as 2 "nodes" (one process each, torchrun's variables set
by the test), each in its own working directory with a relative run.out_dir, so rank 1 sees a directory of its
own, as a node whose out_dir is on local disk would. Both stop at start with one `error:` line; rank 0's
directory holds nothing half-written. The same 2 ranks in one working directory train normally."""
import os
import signal
import socket
import subprocess

import pytest

from tests.faults.common import BASE_TOML, error_line, subprocess_env, train_argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(cwds, *overrides: str) -> list[subprocess.CompletedProcess]:
    """Ranks 0 and 1 of a world of 2, one per "node" (LOCAL_WORLD_SIZE=1), rank r started in cwds[r]."""
    port, procs = free_port(), []
    for rank, cwd in enumerate(cwds):
        env = subprocess_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                             MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GROUP_RANK=str(rank))
        procs.append(subprocess.Popen(train_argv(str(BASE_TOML), 'run.out_dir="runs"', *overrides), cwd=cwd,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                os.killpg(q.pid, signal.SIGKILL)
            pytest.fail("a rank hung: the shared-filesystem check must not wait forever")
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def test_ranks_that_do_not_share_the_run_directory_stop_at_start(tmp_path):
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    node0.mkdir(), node1.mkdir()
    results = two_nodes([node0, node1], "checkpoint.every=1")
    for rank, r in enumerate(results):
        assert r.returncode == 2, f"rank {rank}: rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        error_line(r.stderr)
        assert "run.out_dir is not shared: rank(s) 1 (" in r.stderr and "filesystem every node mounts" in r.stderr
    run0 = node0 / "runs" / "fault"
    # nothing half-written: no token, no checkpoint (not even a temp folder), no config, no metrics
    assert sorted(p.name for p in run0.rglob("*")) in ([], [".lock"]), sorted(run0.rglob("*"))


def test_ranks_that_share_the_run_directory_train(tmp_path):
    results = two_nodes([tmp_path, tmp_path], "train.steps=2")
    for rank, r in enumerate(results):
        assert r.returncode == 0, f"rank {rank}: rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    run_dir = tmp_path / "runs" / "fault"
    assert (run_dir / "summary.json").exists() and not (run_dir / ".shared-fs-check").exists()
