"""`turbotrain env`: the device, versions, the peak FLOP/s used for MFU and recommended settings."""
from __future__ import annotations

import platform

import torch

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
        info.update(gpu=props.name, gpu_count=torch.cuda.device_count(), gpu_mem_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", bf16_supported=torch.cuda.is_bf16_supported(),
                    nvml=GpuStats(device).available)
    dtype = resolve_dtype("auto", device)
    info["recommended"] = {
        "precision.dtype": dtype,
        "compile.enabled": cuda,
        "train.optimizer_impl": "fused" if cuda else "foreach",
        "memory.channels_last": "auto (on for convnets on GPU)",
    }
    info["peak_tflops"] = {d: (round(p / 1e12, 1) if (p := peak_flops(device, d)) else None)
                           for d in ("fp32", "tf32", "bf16", "fp16")}
    return info


def format_env(info: dict) -> str:
    lines = []
    for k, v in info.items():
        if isinstance(v, dict):
            lines.append(f"{k}:")
            lines.extend(f"  {kk}: {vv}" for kk, vv in v.items())
        else:
            lines.append(f"{k}: {v}")
    if not info["cuda_available"]:
        lines.append("note: no GPU; MFU is null on CPU (no peak FLOP/s to compare against)")
    return "\n".join(lines)
