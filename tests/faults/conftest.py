"""Fixtures of the fault tests: the fused-layer red-team files (tests/faults/test_fused_*_redteam.py), a 1-rank gloo
process group."""
import pytest
import torch
import torch.distributed as dist

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


@pytest.fixture
def gloo1():
    """A 1-rank gloo process group (FSDP2 needs one), torn down after the test."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
