import torch

from turbotrain.accel import precision

CPU = torch.device("cpu")


def test_autocast_runs_in_the_asked_dtype():
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with precision.autocast("bf16", CPU):
        assert lin(x).dtype == torch.bfloat16
    with precision.autocast("fp32", CPU):
        assert lin(x).dtype == torch.float32
    assert lin.weight.dtype == torch.float32  # master weights stay fp32


def test_auto_is_fp32_on_cpu_and_scaler_only_for_fp16():
    assert precision.resolve_dtype("auto", CPU) == "fp32"
    assert precision.build_scaler("fp16", CPU).is_enabled()
    assert not precision.build_scaler("bf16", CPU).is_enabled()


def test_tf32_switch():
    precision.apply_tf32("fp32")
    assert not torch.backends.cuda.matmul.allow_tf32
    precision.apply_tf32("tf32")
    assert torch.backends.cuda.matmul.allow_tf32
