"""A compile that starts warm: a cold run fills an empty cache folder; a second process given only a moved
copy of that folder (a fresh machine) compiles nothing anew — every inductor graph comes from the cache —
and trains to the same losses. Verdicts are cache counters, not timings (machine load varies)."""
import json
import os
import shutil
import sys

import pytest

from tests.helpers import TINY_GPT, losses, run_bounded

pytestmark = pytest.mark.slow

ARGS = [a for a in TINY_GPT if not a.startswith(("compile.", "model.args.n_layer"))] + [
    "model.args.n_layer=1", "compile.enabled=true", "compile.mode=default", "train.steps=2", "train.log_every=1",
    "data.eval_batches=0", "checkpoint.every=0"]


def _train(tmp_path, cache, name):
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env["TURBOTRAIN_CACHE"] = str(cache)  # an empty folder: neither /tmp's nor ~'s caches can help
    cmd = [sys.executable, "-m", "turbotrain", "train", "gpt2-124m", *ARGS, f"run.out_dir={str(tmp_path)!r}",
           f"run.name={name}"]
    proc = run_bounded(cmd, 900, f"compiled run {name}", env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / name / "summary.json").read_text()), proc.stdout


def test_a_copied_cache_folder_starts_the_compile_warm(tmp_path):
    cold, out = _train(tmp_path, tmp_path / "cache_a", "cold")
    assert "compile: cold start" in out
    assert cold["fxgraph_cache_miss"] > 0 and cold["fxgraph_cache_hit"] == 0
    folder = tmp_path / "cache_a" / "compile"
    (bin_file,) = folder.glob("*/*.bin")
    assert bin_file.name == cold["compile_cache"]["artifacts_file"]

    shutil.move(folder.parent, tmp_path / "node2")  # another machine: the same folder at another path
    warm, out = _train(tmp_path, tmp_path / "node2", "warm")
    moved = tmp_path / "node2" / "compile" / bin_file.parent.name / bin_file.name
    assert f"compile: warm start from {moved} (" in out
    assert warm["compile_cache"]["warm_artifacts"] > 0
    assert warm["fxgraph_cache_hit"] > 0 and warm["fxgraph_cache_miss"] == 0
    assert warm["aot_autograd_cache_miss"] == 0
    assert losses(tmp_path, "warm") == losses(tmp_path, "cold")  # the same kernels: the same numbers

    only_bin = tmp_path / "node3" / "compile" / bin_file.parent.name
    only_bin.mkdir(parents=True)
    shutil.copy(moved, only_bin / bin_file.name)  # the portable file alone, no inductor folder
    warm2, _ = _train(tmp_path, tmp_path / "node3", "warm2")
    assert warm2["fxgraph_cache_hit"] > 0 and warm2["fxgraph_cache_miss"] == 0
