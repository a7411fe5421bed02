"""Fixtures of the fused-layer red-team files (tests/faults/test_fused_*_redteam.py)."""
import pytest
import torch

import turbotrain.pipeline as pipeline
from turbotrain.accel.convnet import bn_relu_pool, set_convnet_kernels


@pytest.fixture
def kernels(monkeypatch):
    """Fusing needs triton; on a CPU the fused layer runs torch's layers anyway."""
    monkeypatch.setattr(bn_relu_pool, "available", lambda: True)


@pytest.fixture
def gpu_rewrites(monkeypatch, kernels):
    """The trainer's convnet rewrite as on a GPU (fusing the run), everything else on the CPU."""
    def on_gpu(model, on, device):
        set_convnet_kernels(model, on, torch.device("cuda"))

    monkeypatch.setattr(pipeline, "set_convnet_kernels", on_gpu)
