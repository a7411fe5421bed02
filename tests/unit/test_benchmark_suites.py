"""benchmarks/run.py's suites: tune's naive config is bench's baseline, and every suite builds its commands."""
import importlib.util
import sys
from pathlib import Path

from turbotrain.bench import BASELINE

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"


def _run_module():
    spec = importlib.util.spec_from_file_location("benchmarks_run", RUN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_tunes_naive_config_is_benchs_baseline():
    assert _run_module().NAIVE == BASELINE


def test_tune_suites_train_the_reference_tune_and_the_tuned_config():
    run = _run_module()
    table = run.suites([1], "/tmp/runs")
    for suite in ("tune-gpt", "tune-resnet", "tune-edge"):
        verbs = [c.argv[3] for c in table[suite].commands]
        assert verbs == ["train", "tune", "train"], (suite, verbs)
        assert table[suite].commands[-1].after == "tune_ratio"
        assert table[suite].commands[-1].argv[4].endswith("/tune/tuned.toml")
