"""config.toml holds what ran: auto values resolved, and a setting the run could not honour replaced, with
the reason said once (issue: "resolve before you write")."""
import os
import subprocess
import sys

from tests.helpers import TINY_GPT
from turbotrain.config import load_config

ARGS = [*TINY_GPT, 'run.device="cpu"', "train.steps=3", "train.log_every=1"]


def _run(cmd, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def test_ddp_run_records_the_mode_that_ran_and_says_so_once(tmp_path):
    r = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "turbotrain",
              "train", "gpt2-124m", *ARGS, "compile.enabled=true", 'compile.backend="eager"',
              'compile.mode="reduce-overhead"', 'parallel.strategy="auto"', f"run.out_dir={str(tmp_path)!r}"], tmp_path)
    cfg = load_config(str(tmp_path / "gpt2-124m" / "config.toml"))
    assert cfg.compile.mode == "default" and cfg.parallel.strategy == "ddp" and cfg.precision.dtype == "fp32"
    assert r.stdout.count('compile.mode: "reduce-overhead" → "default"') == 1, r.stdout


def test_auto_precision_and_strategy_on_a_cpu_are_written_resolved(tmp_path):
    _run([sys.executable, "-m", "turbotrain", "train", "gpt2-124m", *ARGS, 'precision.dtype="auto"',
          'parallel.strategy="auto"', f"run.out_dir={str(tmp_path)!r}"], tmp_path)
    text = (tmp_path / "gpt2-124m" / "config.toml").read_text()
    cfg = load_config(str(tmp_path / "gpt2-124m" / "config.toml"))
    assert cfg.precision.dtype == "fp32" and cfg.parallel.strategy == "none" and cfg.run.device == "cpu"
    assert '"auto"' not in text.split("[compile]")[0]  # run, model, data, train, precision: nothing left "auto"
