"""The attention backend order changes the kernel, not the training curve."""
import pytest

from tests.helpers import losses, tiny_gpt
from turbotrain.trainer import train


def test_backend_order_changes_kernel_not_results(tmp_path):
    train(tiny_gpt(tmp_path, "run.name=default", "kernels.attention=default", "train.steps=3"))
    train(tiny_gpt(tmp_path, "run.name=math", "kernels.attention=math", "train.steps=3"))
    assert losses(tmp_path, "math") == pytest.approx(losses(tmp_path, "default"), rel=1e-4)
