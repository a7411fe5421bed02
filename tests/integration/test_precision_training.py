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


def test_a_clip_folded_into_the_fused_optimizer_trains_as_the_separate_clip(tmp_path, monkeypatch):
    """train.optimizer_impl="fused" takes the clip inside the optimizer's kernel (grad_scale): the run's losses and
    gradient norms follow the separate clip pass's to rounding, with a clip that binds on every step."""
    import turbotrain.accel.optim as optim

    def run(name):
        train(tiny_gpt(tmp_path, "train.steps=6", "train.log_every=1", "train.grad_clip=0.05", "train.lr=0.01",
                       "train.optimizer_impl=\"fused\"", "compile.enabled=false", f"run.name={name}"))
        return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    answers = []
    fold = optim.folds_clip
    monkeypatch.setattr(optim, "folds_clip", lambda opt: answers.append(fold(opt)) or answers[-1])
    folded = run("folded")
    assert answers and all(answers)  # the fused optimizer took the clip in every step
    monkeypatch.setattr(optim, "folds_clip", lambda opt: False)
    separate = run("separate")
    assert [r["grad_norm"] > 0.05 for r in folded] == [True] * 6  # the clip binds every step
    for a, b in zip(folded, separate, strict=True):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]) and abs(a["grad_norm"] - b["grad_norm"]) <= \
            1e-4 * b["grad_norm"]
