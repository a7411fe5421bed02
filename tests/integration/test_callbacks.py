"""The loop is open without being slowed: callbacks from the config and the Python API, user eval metrics,
a user optimizer factory; callbacks add no host read of a device value to the step."""
import json

import pytest
import torch

from tests.faults.common import BASE_TOML, error_line, lit
from tests.helpers import TINY_GPT, count_host_reads
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.trainer import train

BASE = str(BASE_TOML)


pytestmark = pytest.mark.usefixtures("userpkg_importable")


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_callback_from_the_config_and_a_user_metric_reach_metrics_jsonl(tmp_path):
    assert main(["train", BASE, f"run.out_dir={lit(tmp_path)}", "train.steps=6", "train.log_every=2",
                 'train.callbacks=["userpkg.extensions:CountSteps"]', "train.eval_every=3",
                 'train.eval_metrics=["userpkg.extensions:mean_abs_error"]']) == 0
    got = rows(tmp_path / "fault")
    assert [(r["step"], r["steps_counted"]) for r in got if "loss" in r] == [(2, 2), (3, 3), (4, 4), (6, 6)]
    evals = [r for r in got if "val_loss" in r]
    assert [r["step"] for r in evals] == [3, 6] and all(r["val_mean_abs_error"] > 0 for r in evals)


def test_callbacks_from_python_see_every_hook_in_order(tmp_path):
    from userpkg.extensions import CountSteps

    cb = CountSteps()
    cfg = load_config(BASE, [f"run.out_dir={lit(tmp_path)}", "train.steps=4", "checkpoint.every=2"])
    summary = train(cfg, callbacks=[cb])
    assert cb.steps == 4 and summary["steps"] == 4
    assert cb.seen == ["train_start", "checkpoint:step-00000002", "eval_end", "checkpoint:step-00000004", "train_end"]


def test_a_user_optimizer_factory_trains(tmp_path, capsys):
    from userpkg.models import linear

    model = linear(dim=8)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = load_config(BASE, [f"run.out_dir={lit(tmp_path)}", "train.steps=8", "train.lr=0.002",
                             'train.optimizer="userpkg.extensions:sgd_nesterov"'])
    summary = train(cfg, model=model)
    assert summary["steps"] == 8 and all(r["loss"] == r["loss"] for r in rows(tmp_path / "fault") if "loss" in r)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert "optimizer: SGD from userpkg.extensions:sgd_nesterov" in capsys.readouterr().out


@pytest.mark.parametrize("override, expect", [
    ('train.optimizer="userpkg.extensions:not_an_optimizer"', ["train.optimizer", "str", "Optimizer"]),
    ('train.optimizer="adamx"', ["train.optimizer", "adamx"]),
    ('train.callbacks=["userpkg.extensions:nope"]', ["train.callbacks", "nope"]),
    ('train.callbacks=["userpkg.extensions:mean_abs_error"]', ["train.callbacks"]),
    ('train.eval_metrics=["mean_abs_error"]', ["train.eval_metrics", "pkg.module:name"]),
])
def test_bad_extensions_are_one_error_line(tmp_path, capsys, override, expect):
    capsys.readouterr()
    assert main(["train", BASE, f"run.out_dir={lit(tmp_path)}", override]) == 2
    line = error_line(capsys.readouterr().err)
    assert all(e in line for e in expect), line


def _host_reads(monkeypatch, tmp_path, name, *extra):
    """How often the run reads a tensor's value on the host (item/tolist/float/bool; on a GPU, a device sync
    when the tensor lives there). Counted over a whole 12-step run with one log step."""
    cfg = load_config("gpt2-124m", [*TINY_GPT, 'run.device="cpu"', f"run.out_dir={lit(tmp_path)}", f"run.name={name}",
                                    "train.steps=12", "train.log_every=100", "data.eval_batches=0", *extra])
    return count_host_reads(monkeypatch, lambda: train(cfg))


def test_callbacks_add_no_device_sync_to_the_step(tmp_path, monkeypatch):
    from userpkg.extensions import CountSteps  # noqa: F401  (imported before counting)

    plain = _host_reads(monkeypatch, tmp_path, "plain")
    with_cb = _host_reads(monkeypatch, tmp_path, "cb", 'train.callbacks=["userpkg.extensions:CountSteps"]')
    assert with_cb == plain
    # the count has teeth: a callback that reads a device value each step shows up, once per step
    reads = _host_reads(monkeypatch, tmp_path, "reads", 'train.callbacks=["userpkg.extensions:ReadsWeights"]')
    assert reads == plain + 12
