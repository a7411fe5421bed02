import pytest
import torch

from tests.helpers import losses, tiny_gpt
from turbotrain.accel.attention import attention_backend
from turbotrain.trainer import train


def test_backend_order_changes_kernel_not_results(tmp_path):
    train(tiny_gpt(tmp_path, "run.name=default", "kernels.attention=default", "train.steps=3"))
    train(tiny_gpt(tmp_path, "run.name=math", "kernels.attention=math", "train.steps=3"))
    assert losses(tmp_path, "math") == pytest.approx(losses(tmp_path, "default"), rel=1e-4)


def test_auto_keeps_the_default_order_off_hopper():
    ctx = attention_backend("auto", torch.device("cpu"))
    assert type(ctx).__name__ == "nullcontext"
