"""A resume continues the exact loss curve on every data path. Dropout makes the global RNG part of the curve,
so anything that draws from it between the checkpoint's RNG restore and the first step (a DataLoader's
iterator drawing its workers' seed, for one) shifts every later loss."""
import json

import pytest

from tests.faults.common import RESUME_GPT, CrashAt, lit
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.trainer import train

STEPS, EVERY, CRASH = 12, 4, 7


def losses(run_dir) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


@pytest.mark.parametrize("data", [["data.device_resident=true"],
                                  ["data.device_resident=false", "data.num_workers=0"],
                                  ["data.device_resident=false", "data.num_workers=1"]],
                         ids=["resident", "loader", "loader-worker"])
def test_a_resume_with_dropout_continues_the_exact_curve(tmp_path, data):
    common = [*RESUME_GPT, f"train.steps={STEPS}", f"checkpoint.every={EVERY}", *data]
    whole = load_config("gpt2-124m", [*common, f"run.out_dir={lit(tmp_path / 'whole')}"])
    train(whole)
    cut = load_config("gpt2-124m", [*common, f"run.out_dir={lit(tmp_path / 'cut')}"])
    with pytest.raises(UserError, match="crash for the test"):
        train(cut, callbacks=[CrashAt(CRASH)])
    assert train(cut)["resumed_from"] == EVERY
    reference, resumed = losses(tmp_path / "whole" / "gpt2-124m"), losses(tmp_path / "cut" / "gpt2-124m")
    assert [s for s, _ in resumed] == list(range(1, STEPS + 1))
    assert resumed == reference  # bitwise: same losses, every step after the checkpoint included


def test_a_resume_under_another_run_seed_keeps_the_checkpoints_seed_and_says_so(tmp_path, capsys):
    """run.seed fixes the epoch's permutation: a new seed on resume would reshuffle the epoch half-way through
    (some samples twice, some never) while the log said "kept data order"."""
    common = [*RESUME_GPT, f"train.steps={STEPS}", f"checkpoint.every={EVERY}", "data.device_resident=true",
              "run.seed=1"]
    train(load_config("gpt2-124m", [*common, f"run.out_dir={lit(tmp_path / 'whole')}"]))
    cut = [*common, f"run.out_dir={lit(tmp_path / 'cut')}"]
    with pytest.raises(UserError, match="crash for the test"):
        train(load_config("gpt2-124m", cut), callbacks=[CrashAt(CRASH)])
    capsys.readouterr()
    assert train(load_config("gpt2-124m", [*cut, "run.seed=2"]))["resumed_from"] == EVERY
    out = capsys.readouterr().out
    assert "run.seed = 2 differs from the checkpoint's 1: kept 1" in out
    assert losses(tmp_path / "cut" / "gpt2-124m") == losses(tmp_path / "whole" / "gpt2-124m")
    written = load_config(str(tmp_path / "cut" / "gpt2-124m" / "config.toml"), [])
    assert written.run.seed == 1  # the run's config says the seed it ran with


@pytest.mark.parametrize("change, said", [("data.args.size=128", "samples 256 → 128"),
                                          ("data.args.seed=99", "data.args")])
def test_a_resume_on_changed_training_data_says_the_data_order_is_not_kept(tmp_path, capsys, change, said):
    """Other data (more samples, other args) is a deliberate change, as a new lr is: the resume goes on and
    says that the batches now follow the new data's order, instead of claiming it kept the data order."""
    cut = [*RESUME_GPT, f"train.steps={STEPS}", f"checkpoint.every={EVERY}", "data.device_resident=true",
           f"run.out_dir={lit(tmp_path)}"]
    with pytest.raises(UserError, match="crash for the test"):
        train(load_config("gpt2-124m", cut), callbacks=[CrashAt(CRASH)])
    capsys.readouterr()
    assert train(load_config("gpt2-124m", [*cut, change]))["resumed_from"] == EVERY
    out = capsys.readouterr().out
    assert "loss scaler, RNG;" in out or "loss scaler, RNG\n" in out, out
    assert "and data order" not in out
    assert "the training data changed since the checkpoint" in out and said in out, out
