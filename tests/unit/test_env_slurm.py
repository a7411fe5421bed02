"""The launcher's environment read without a process: SLURM's srun layout (hostlists, tasks per node, the
head node and port), the cases that must stay one process, torchrun winning, the --max-restarts warning,
and what `turbotrain env` says about them."""
import os
import re

import pytest

from turbotrain.distributed.env import (
    DistEnv,
    expand_hostlist,
    expand_tasks_per_node,
    restart_store_warning,
    slurm_exports,
    slurm_port,
)
from turbotrain.env import describe_distributed, describe_integrations, format_env
from turbotrain.errors import UserError

LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

# task 3 of `srun --nodes=2 --ntasks-per-node=2` (4 tasks): the second task of the second node
SRUN = {"SLURM_JOB_ID": "4711234", "SLURM_JOB_NAME": "train.sbatch", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_NODELIST": "gpu[07-08]"}


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("SLURM_", "TORCHELASTIC_")) or k in LAUNCH or k == "TORCH_DISABLE_SHARE_RDZV_TCP_STORE":
            monkeypatch.delenv(k)
    return monkeypatch


@pytest.mark.parametrize("hostlist, hosts", [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a[9-11],b2", ["a9", "a10", "a11", "b2"]),
    ("gpu-[001-002]-ib", ["gpu-001-ib", "gpu-002-ib"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
])
def test_compressed_hostlists_expand_in_order(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


def test_tasks_per_node_and_port():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    assert slurm_port("4711234") == 15000 + 1234 and slurm_port("7") == 15007


def test_srun_tasks_form_one_world(clean_env):
    for k, v in SRUN.items():
        clean_env.setenv(k, v)
    env = DistEnv.from_environ()
    assert env == DistEnv(rank=3, local_rank=1, world_size=4, local_world_size=2, launcher="slurm")
    # exported as torchrun's variables: the process group, log.is_rank0 and the rest see one launcher
    assert [os.environ[k] for k in LAUNCH] == ["3", "4", "1", "2", "gpu07", str(15000 + 1234)]


def test_a_master_port_the_user_exported_wins(clean_env):
    for k, v in {**SRUN, "MASTER_PORT": "29999"}.items():
        clean_env.setenv(k, v)
    DistEnv.from_environ()
    assert os.environ["MASTER_PORT"] == "29999"


@pytest.mark.parametrize("case, env", [
    ("batch script without srun", {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"} | {"SLURM_PROCID": "0"}),
    ("one task", {**SRUN, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}),
    ("srun --pty bash", {**SRUN, "SLURM_JOB_NAME": "bash"}),
    ("no slurm", {}),
])
def test_one_process_in_an_allocation_stays_world_one(clean_env, case, env):
    for k, v in env.items():
        clean_env.setenv(k, v)
    assert DistEnv.from_environ() == DistEnv(), case
    assert not any(k in os.environ for k in LAUNCH), case


def test_torchrun_wins_over_slurm(clean_env):
    """`srun ... torchrun`: torchrun's per-worker variables, not SLURM's per-task ones."""
    for k, v in {**SRUN, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}.items():
        clean_env.setenv(k, v)
    assert DistEnv.from_environ() == DistEnv(5, 1, 8, 4, "torchrun")


def test_an_unreadable_layout_is_refused_with_the_torchrun_recipe():
    with pytest.raises(UserError) as e:
        slurm_exports({**SRUN, "SLURM_STEP_NODELIST": "gpu[07-", "SLURM_NODELIST": "gpu[07-"})
    msg = str(e.value)
    assert "\n" not in msg and "srun --ntasks-per-node=1 torchrun" in msg and "--rdzv_endpoint" in msg


@pytest.mark.parametrize("env, warns", [
    ({"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_USE_AGENT_STORE": "True"}, True),
    ({"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_USE_AGENT_STORE": "True",
      "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, False),
    ({"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_USE_AGENT_STORE": "False"}, False),
    ({"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"}, False),
    ({}, False),
])
def test_restart_store_warning_names_the_fix(env, warns):
    msg = restart_store_warning(env)
    assert (msg is not None) == warns
    if warns:
        assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun" in msg and "\n" not in msg


def test_env_describes_the_distributed_setup_and_integrations():
    d = describe_distributed({**SRUN, "TORCHELASTIC_MAX_RESTARTS": "2"})
    assert d["launcher"].startswith("slurm srun without torchrun (rank 3 of 4, head gpu07:16234)")
    assert d["SLURM_STEP_NODELIST"] == "gpu[07-08]" and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in d["restarts"]
    assert describe_distributed({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1"})["launcher"].startswith("none")
    assert describe_distributed({"RANK": "0", "WORLD_SIZE": "2"})["launcher"] == "torchrun (rank 0 of 2)"
    integrations = describe_integrations()
    assert set(integrations) == {"transformers", "accelerate", "lightning", "wandb", "mlflow", "prometheus_client",
                                 "torchao", "tensorboard"}
    assert integrations["tensorboard"]  # a dependency: always there
    text = format_env({"cuda_available": True, "distributed": d, "integrations": {"wandb": None}})
    assert "  wandb: not installed" in text and "  launcher: slurm srun" in text


@pytest.mark.parametrize("env, said", [
    ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not an integer"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 is out of range"),
    ({"RANK": "1", "WORLD_SIZE": "1"}, "RANK=1 is out of range (0 .. 0)"),  # it trained and wrote nothing
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 is out of range"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3"}, "LOCAL_WORLD_SIZE=3 is out of range (1 .. 2)"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2 but LOCAL_WORLD"),
])
def test_a_launcher_variable_that_cannot_be_is_one_error(monkeypatch, env, said):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UserError, match="torchrun") as e:
        DistEnv.from_environ()
    assert said in str(e.value)


@pytest.mark.parametrize("port, said", [("junk", "not an integer"), ("99999", "out of range (1 .. 65535)")])
def test_a_master_port_that_cannot_be_is_one_error(monkeypatch, port, said):
    import torch

    from turbotrain.distributed.env import init_distributed

    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UserError, match=f"MASTER_PORT.*{re.escape(said)}"):
        init_distributed(DistEnv.from_environ(), torch.device("cpu"))


def test_ranks_that_never_come_are_one_error_after_the_join_timeout(monkeypatch):
    """One rank of two started: the join waits (said), then ends in one error line, not a store traceback."""
    import socket

    import torch
    import torch.distributed as dist

    from turbotrain.distributed import env as env_mod

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(env_mod, "JOIN_TIMEOUT_MIN", 0.05)  # 3 s
    with pytest.raises(UserError, match=r"the 2 ranks did not all join at 127\.0\.0\.1:\d+ within 0\.05 min"):
        env_mod.init_distributed(DistEnv.from_environ(), torch.device("cpu"))
    assert not dist.is_initialized()
