import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolate(monkeypatch):
    """Each test starts with dynamo reset, default TF32 flags and the process env restored."""
    saved = dict(os.environ)
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)
