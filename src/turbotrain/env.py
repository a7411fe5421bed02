"""`turbotrain env`: the device, versions, the peak FLOP/s used for MFU, recommended settings, the distributed
environment (torchrun / SLURM variables and the world they make, NCCL, GPU topology) and the integrations."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess

import torch

from turbotrain.accel.optim import auto_impl
from turbotrain.accel.precision import resolve_dtype
from turbotrain.monitor.flops import peak_flops
from turbotrain.monitor.nvml import GpuStats


def describe_env() -> dict:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    info = {
        "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
        "cpus": torch.get_num_threads(), "cuda_available": cuda, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "gloo": torch.distributed.is_gloo_available() if torch.distributed.is_available() else False,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }
    if cuda:
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_count=torch.cuda.device_count(),
                    gpu_mem_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", bf16_supported=torch.cuda.is_bf16_supported(),
                    nvml=GpuStats(device).available)
    dtype = resolve_dtype("auto", device)
    info["recommended"] = {
        "precision.dtype": dtype,
        "compile.enabled": cuda,
        "train.optimizer_impl": recommended_optimizer_impl(device),
        "memory.channels_last": "auto (on for convnets on GPU)",
    }
    info["peak_tflops"] = {d: (round(p / 1e12, 1) if (p := peak_flops(device, d)) else None)
                           for d in ("fp32", "tf32", "bf16", "fp16")}
    info["distributed"] = describe_distributed()
    info["integrations"] = describe_integrations()
    return info


def recommended_optimizer_impl(device: torch.device) -> str:
    """What "auto" takes here, as a value every optimizer accepts: a bare "triton" is AdamW's kernel only, which
    the resolver refuses for adam, sgd and FSDP2's shards."""
    from turbotrain.accel.optim import OPTIMIZERS

    picks = {name: auto_impl(name, device) for name in OPTIMIZERS}
    if len(set(picks.values())) == 1 and "triton" not in picks.values():
        return picks["adamw"]
    fsdp = auto_impl("adamw", device, sharded=True)
    return "auto (" + ", ".join([f"{impl} for {name}" for name, impl in picks.items()]
                                + ([f"{fsdp} for adamw under FSDP2"] if picks["adamw"] != fsdp else [])) + ")"


LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE",
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_STEP_ID", "SLURM_PROCID",
               "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS_PER_NODE",
               "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODELIST", "SLURM_STEP_NODELIST",
               "CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_DEBUG")
INTEGRATIONS = ("transformers", "accelerate", "lightning", "wandb", "mlflow", "prometheus_client", "torchao",
                "tensorboard")


INT_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_MAX_RESTARTS", "SLURM_NTASKS",
            "SLURM_STEP_NUM_TASKS")  # read with int() where the launcher's layout is worked out


def describe_distributed(environ=os.environ) -> dict:
    """What a `train` started with this environment would join: the launcher, its world, the variables it
    comes from, the NCCL version, the GPU topology, and the warnings a run would print. A launch environment
    that `train` would refuse is said as refused, with the reason: this command is where one looks for it."""
    from turbotrain.distributed.env import restart_store_warning
    from turbotrain.errors import UserError

    out: dict = {}
    bad = ", ".join(f"{k}={environ[k]!r}" for k in INT_VARS if k in environ and not _is_int(environ[k]))
    try:
        out["launcher"] = _launcher(environ)
    except ValueError:
        out["launcher"] = f"refused: {bad} is not an integer; fix or unset it (torchrun and srun set it themselves)"
    out.update({k: environ[k] for k in LAUNCH_VARS if k in environ})
    if torch.cuda.is_available():
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    if (topo := gpu_topology()) is not None:
        out["gpu_topology"] = topo
    try:
        if (warning := restart_store_warning(environ)) is not None:
            out["restarts"] = warning
    except UserError as e:
        out["restarts"] = f"refused: {e}"
    return out


def _is_int(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


def _launcher(environ) -> str:
    from turbotrain.distributed.env import DistEnv, slurm_exports, srun_tasks
    from turbotrain.errors import UserError

    try:
        if "RANK" in environ or "WORLD_SIZE" in environ:
            if environ is os.environ:  # the ranges train checks (RANK past the world, LOCAL_RANK past its node)
                DistEnv.from_environ()
            return f"torchrun (rank {environ.get('RANK', 0)} of {environ.get('WORLD_SIZE', 1)})"
        if srun_tasks(environ) > 1:
            x = slurm_exports(environ)
            return (f"slurm srun without torchrun (rank {x['RANK']} of {x['WORLD_SIZE']}, "
                    f"head {x['MASTER_ADDR']}:{x['MASTER_PORT']})")
    except UserError as e:
        return f"{'torchrun' if 'RANK' in environ or 'WORLD_SIZE' in environ else 'slurm srun'}, refused: {e}"
    return "none (one process)" + (" inside a SLURM allocation" if "SLURM_JOB_ID" in environ else "")


def gpu_topology() -> str | None:
    """`nvidia-smi topo -m` (links between GPUs, NICs and CPUs), None where nvidia-smi is not there."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.rstrip() if r.returncode == 0 else None


def describe_integrations() -> dict:
    """The installed version of each package turbotrain works with (None: not installed); nothing is imported."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in INTEGRATIONS:
        dists = {"prometheus_client": ("prometheus-client", "prometheus_client"),
                 "lightning": ("lightning", "pytorch-lightning")}.get(name, (name,))
        out[name] = None
        for dist in dists:
            try:
                out[name] = version(dist)
                break
            except PackageNotFoundError:
                continue
    return out


def format_env(info: dict) -> str:
    lines = []
    for k, v in info.items():
        if isinstance(v, dict):
            lines.append(f"{k}:")
            for kk, vv in v.items():
                if isinstance(vv, str) and "\n" in vv:  # the topology matrix keeps its columns
                    lines.append(f"  {kk}:")
                    lines.extend(f"    {row}" for row in vv.splitlines())
                elif vv is None and k == "integrations":
                    lines.append(f"  {kk}: not installed")
                else:
                    lines.append(f"  {kk}: {vv}")
        else:
            lines.append(f"{k}: {v}")
    if not info["cuda_available"]:
        lines.append("note: no GPU; MFU is null on CPU (no peak FLOP/s to compare against)")
    return "\n".join(lines)
