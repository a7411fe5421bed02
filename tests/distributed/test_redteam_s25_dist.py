"""Seventh red-team wave, distributed runs on the CPU: a MASTER_PORT that another process holds is one error line,
not torch's DistNetworkError traceback; ranks started with different configs are refused at the start, naming the
keys, instead of training different models or waiting 10 min in a collective and printing tracebacks."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.distributed.test_redteam_s24_dist import finished, free_port, two_ranks
from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.cli import main


@pytest.fixture
def taken_port(monkeypatch):
    """torchrun's variables for one rank whose MASTER_PORT another process listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(held.getsockname()[1])}.items():
            monkeypatch.setenv(k, v)
        yield held.getsockname()[1]


def test_a_master_port_in_use_is_one_error_line(tmp_path, capsys, taken_port):
    """Before: torch.distributed.DistNetworkError "The server socket has failed to listen on any local network
    address ... EADDRINUSE" as a traceback, exit 1."""
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "parallel.strategy=ddp", "train.steps=2"])
    line = error_line(capsys.readouterr().err)
    assert rc == 2 and f"MASTER_PORT={taken_port} is in use" in line and "--master_port" in line, line


# the ranks compare the same config, then one where rank 1 adds the overrides argv[3:]
CONFIGS = textwrap.dedent("""
    import sys, torch.distributed as dist
    from turbotrain.config import load_config
    from turbotrain.distributed.env import same_config
    from turbotrain.errors import UserError
    rank = int(sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method="tcp://127.0.0.1:" + sys.argv[1])
    for theirs in ([], sys.argv[3:]):
        try:
            same_config(load_config("mlp-seed", ["train.steps=4"] + (theirs if rank == 1 else [])))
            print("same")
        except UserError as e:
            print("UserError:", e)
    dist.destroy_process_group()
""")


def test_ranks_with_different_configs_are_refused():
    """Before: nothing compared them. train.steps 4 on rank 0 and 6 on rank 1 (a node's copy of the TOML edited)
    ran until rank 0 finished, then rank 1 waited 10 min in its next all-reduce and both printed gloo's timeout
    traceback; a different lr trained a different optimizer on each rank of one DDP model, unsaid."""
    out = two_ranks(CONFIGS, "train.steps=6", "train.lr=0.5")
    assert out[0] == out[1], out  # the same lines on every rank: said once under torchrun
    same, line = out[0].splitlines()
    assert same == "same" and line.startswith("UserError: config: the ranks were started with different configs"), line
    assert "train.lr: rank 0 0.001, rank 1 0.5" in line and "train.steps: rank 0 4, rank 1 6" in line, line


def test_a_signal_on_one_rank_stops_every_rank_at_one_step_whatever_log_every(tmp_path):
    """Before: the ranks compared their stop flags at log steps only, so with train.log_every=1000 a SIGTERM at
    step 3 ran on for up to 1000 steps, past the grace a scheduler gives (torchrun's agent and SLURM kill 30 s
    after SIGTERM), and the stop's checkpoint was lost. Now they agree a step later, at every step."""
    port = free_port()
    argv = [sys.executable, "-m", "turbotrain", "train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}",
            "parallel.strategy=ddp", "train.steps=200", "train.log_every=1000", "checkpoint.every=1000",
            'train.callbacks=["userpkg.redteam_s24_dist:TermRank1AtStep3"]']
    ranks = []
    for r in (0, 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "PYTHONPATH": os.pathsep.join([str(BASE_TOML.parents[1]), os.environ.get("PYTHONPATH", "")])}
        ranks.append(subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    codes, outs = finished(ranks)
    assert codes == [143, 143], outs
    assert "stopped by SIGTERM at step 4" in outs[0][0] + outs[0][1], outs  # cast at step 3, agreed at step 4
    meta = json.loads((tmp_path / "fault" / "checkpoints" / "step-00000004" / "meta.json").read_text())
    assert meta["step"] == 4
