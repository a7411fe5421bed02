"""kernels.attention="auto" on a GPU: measured on the model's own SDPA calls, kept, and what the run uses."""
import json
import tomllib

import pytest

from tests.helpers import tiny_gpt
from turbotrain.trainer import train

pytestmark = pytest.mark.gpu


def test_auto_measures_the_backends_and_the_run_uses_the_fastest(tmp_path, capsys):
    cfg = tiny_gpt(tmp_path, "kernels.attention=auto", "precision.dtype=bf16", "run.device=cuda", "train.steps=2",
                   f"compile.cache_dir={str(tmp_path / 'cache')!r}", "model.args.n_embd=128", "model.args.n_head=2")
    train(cfg)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "attention: cudnn" in ln)
    chosen = line.rsplit("→ ", 1)[1].strip()
    assert chosen in ("cudnn", "flash", "efficient"), line
    effective = tomllib.loads((tmp_path / "gpt2-124m" / "config.toml").read_text())["kernels"]["attention"]
    assert effective == chosen
    (kept,) = (tmp_path / "cache").glob("*/attention-*.json")
    assert json.loads(kept.read_text())["choice"] == chosen
    train(tiny_gpt(tmp_path, "kernels.attention=auto", "precision.dtype=bf16", "run.device=cuda", "train.steps=2",
                   f"compile.cache_dir={str(tmp_path / 'cache')!r}", "model.args.n_embd=128", "model.args.n_head=2",
                   "run.name=again"))
    assert f"→ {chosen} (measured earlier: {kept})" in capsys.readouterr().out
