"""GPU utilization, memory and temperature through NVML (nvidia-ml-py), when it is there."""
from __future__ import annotations

import torch


class GpuStats:
    def __init__(self, device: torch.device):
        self.handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            # NVML numbers GPUs its own way: map through CUDA_VISIBLE_DEVICES (rank 0 on "2,3" is NVML's 2)
            index = torch.cuda._get_nvml_device_index(device.index if device.index is not None else None)
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nv = pynvml
        except Exception:  # no driver library / no permission: stats are simply absent
            self.handle = None

    @property
    def available(self) -> bool:
        return self.handle is not None

    def read(self) -> dict:
        if self.handle is None:
            return {}
        nv = self._nv
        try:
            util = nv.nvmlDeviceGetUtilizationRates(self.handle)
            mem = nv.nvmlDeviceGetMemoryInfo(self.handle)
            temp = nv.nvmlDeviceGetTemperature(self.handle, nv.NVML_TEMPERATURE_GPU)
        except Exception:
            return {}
        return {"gpu_util_pct": util.gpu, "gpu_mem_used_gib": round(mem.used / 2**30, 3), "gpu_temp_c": temp}
