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
        """The readings this device gives, each on its own: a MIG slice or a card without a sensor refuses one
        reading (NVMLError_NotSupported) and the others are still kept."""
        if self.handle is None:
            return {}
        nv, h, out = self._nv, self.handle, {}
        readers = {"gpu_util_pct": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
                   "gpu_mem_used_gib": lambda: round(nv.nvmlDeviceGetMemoryInfo(h).used / 2**30, 3),
                   "gpu_temp_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)}
        for key, read in readers.items():
            try:
                out[key] = read()
            except Exception:  # noqa: BLE001 - NVML's errors (not supported, GPU lost): that reading is absent
                pass
        return out
