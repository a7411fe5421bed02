"""Mixed precision in training runs: bf16 keeps fp32 params and reports its dtype; fp16 trains with a scaler."""
import json

from tests.helpers import tiny_gpt
from turbotrain.trainer import train


def test_bf16_training_keeps_fp32_params_and_reports_dtype(tmp_path):
    summary = train(tiny_gpt(tmp_path, "precision.dtype=bf16", "train.steps=3"))
    assert summary["dtype"] == "bf16"
    saved = json.loads((tmp_path / "gpt2-124m" / "summary.json").read_text())
    assert saved["dtype"] == "bf16"


def test_fp16_with_grad_scaler_trains(tmp_path):
    summary = train(tiny_gpt(tmp_path, "precision.dtype=fp16", "train.steps=4"))
    assert summary["dtype"] == "fp16" and summary["final_loss"] == summary["final_loss"]  # not NaN
