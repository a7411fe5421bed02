"""SLURM without torchrun: docs/slurm.md's sbatch script, run by bash with a stand-in `srun` that starts the
tasks as SLURM does (SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_*), forms one world of 2 (gloo on a CPU): one
run, one metrics.jsonl with each step once; never two runs at world size 1."""
import json
import os
import re
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.faults.common import BASE_TOML, subprocess_env
from tests.helpers import run_bounded

DOC = Path(__file__).resolve().parents[2] / "docs" / "slurm.md"

# `srun [--ntasks=N|-n N] CMD...`: N copies of CMD on this machine, with the variables srun gives each task
FAKE_SRUN = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, subprocess, sys
    args, n = sys.argv[1:], int(os.environ.get("SLURM_NTASKS", "1"))
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt in ("-n", "--ntasks"):
            n = int(args.pop(0))
        elif opt.startswith("--ntasks="):
            n = int(opt.split("=", 1)[1])
    step = {{"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": str(n), "SLURM_STEP_TASKS_PER_NODE": str(n),
            "SLURM_STEP_NODELIST": os.environ["SLURM_NODELIST"], "SLURM_NODEID": "0"}}
    tasks = [subprocess.Popen(args, env={{**os.environ, **step, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)}})
             for i in range(n)]
    sys.exit(max(t.wait() for t in tasks))
    """)


def recipe() -> str:
    """The sbatch script of docs/slurm.md ("The recipe" section), as the user copies it."""
    section = DOC.read_text().split("## The recipe", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def free_slurm_port() -> int:
    """A free port in the range SLURM_JOB_ID maps to (15000 + last 4 digits)."""
    for port in range(15000 + os.getpid() % 9000, 25000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


def sbatch(tmp_path, ntasks: int, *overrides: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(stat.S_IRWXU)
    (tmp_path / "train.sbatch").write_text(recipe())
    port = free_slurm_port()
    env = subprocess_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", CONFIG=str(BASE_TOML),
                         OUT_DIR=str(tmp_path / "runs"), SLURM_JOB_ID=f"9{port - 15000:04d}",
                         SLURM_JOB_NAME="turbotrain", SLURM_NTASKS=str(ntasks), SLURM_NNODES="1",
                         SLURM_NODELIST="localhost", SLURM_TASKS_PER_NODE=str(ntasks), SLURM_PROCID="0")
    for k in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # the script's `python`: ours
    (bin_dir / "python").chmod(stat.S_IRWXU)
    return run_bounded(["bash", str(tmp_path / "train.sbatch"), *overrides], 240, "the sbatch recipe", cwd=tmp_path,
                       env=env)


def test_the_sbatch_recipe_forms_one_world_of_two_tasks(tmp_path):
    r = sbatch(tmp_path, 2, "train.steps=4")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()  # one run directory: turbotrain-<job id>
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["strategy"] == "ddp"
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 4  # rank 0 alone writes, each step once
    assert r.stdout.count("[turbotrain] model:") == 1  # rank-0 logging: the other task is quiet
