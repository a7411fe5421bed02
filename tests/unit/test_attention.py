import torch

from turbotrain.accel.attention import attention_backend


def test_auto_keeps_the_default_order_off_hopper():
    ctx = attention_backend("auto", torch.device("cpu"))
    assert type(ctx).__name__ == "nullcontext"
