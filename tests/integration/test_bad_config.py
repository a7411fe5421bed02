"""Black-box: bad configs through the real CLI (`python -m turbotrain train ...`) are refused as user
errors — exit code 2, exactly one stderr line starting `error:`, no traceback, and the line names the
key or the problem. One subprocess per case (~3 s each: the torch import dominates)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

# mlp-seed shrunk to a few thousand parameters, for the cases that get as far as building data / model
TINY_MLP = ["model.args.depth=1", "model.args.width=16", "model.args.in_features=16", "data.args.in_features=16",
            "data.args.size=64", "data.batch_size=8", "train.steps=2"]

MALFORMED = '[train]\nsteps = = 3\n[run\n'


def run_cli(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turbotrain", "train", *args], cwd=cwd, env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)


# (id, argv after `train`, substrings the error line must contain). `{tmp}` is replaced by tmp_path.
CASES = [
    ("unknown-key", ["mlp-seed", "train.foo=1"], ["train.foo"]),
    ("unknown-section", ["mlp-seed", "bogus.x=1"], ["bogus"]),
    ("bad-choice", ["mlp-seed", "precision.dtype=bf17"], ["precision.dtype", "bf17", "bf16"]),
    ("bad-type-int", ["mlp-seed", 'train.steps="many"'], ["train.steps", "integer"]),
    ("bad-type-float", ["mlp-seed", "train.lr=true"], ["train.lr", "number"]),
    ("batch-size-zero", ["mlp-seed", "data.batch_size=0"], ["data.batch_size"]),
    ("negative-steps", ["mlp-seed", "train.steps=-5"], ["train.steps", "-5"]),
    ("missing-file", ["nope.toml"], ["nope.toml", "not found"]),
    ("malformed-toml", ["{tmp}/broken.toml"], ["broken.toml", "malformed"]),
    ("unknown-preset", ["no-such-preset"], ["no-such-preset", "mlp-seed"]),
    ("override-without-equals", ["mlp-seed", "train.steps"], ["train.steps", "KEY=VALUE"]),
    ("unimportable-model", ["mlp-seed", *TINY_MLP, 'model.name="nosuchmod.x:build"'], ["model.name", "nosuchmod"]),
    ("unknown-data-name", ["mlp-seed", *TINY_MLP, 'data.name="nosuchdata"'], ["data.name", "nosuchdata"]),
    ("user-data-bad-arg", ["mlp-seed", *TINY_MLP, "data.args.no_such_arg=1"], ["data.args", "no_such_arg"]),
    ("gpt-heads-mismatch", ["gpt2-124m", "model.args.n_embd=32", "model.args.n_head=3", "data.args.size=64",
                            "data.args.seq_len=32", "model.args.block_size=32"], ["model.args.n_embd", "n_head"]),
    ("ddp-without-torchrun", ["mlp-seed", "parallel.strategy=ddp", 'run.device="cpu"'], ["torchrun", "RANK"]),
    ("resnet-depth", ["resnet50-synthetic", "model.args.depth=18", "data.args.size=8", "data.batch_size=4",
                      "data.args.shape=[3,32,32]"], ["model.args.depth = 18", "50"]),
]
PRESETS = ("mlp-seed", "gpt2-124m", "resnet50-synthetic")


@pytest.mark.parametrize("argv, expect", [pytest.param(a, e, id=i) for i, a, e in CASES])
def test_bad_config_is_a_user_error(tmp_path, argv, expect):
    (tmp_path / "broken.toml").write_text(MALFORMED)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    # every case writes (if it writes at all) under tmp_path, never into the repository
    argv = argv + ([f"run.out_dir={str(tmp_path / 'runs')!r}"] if argv[0] in PRESETS else [])
    r = run_cli(argv, cwd=tmp_path)
    report = f"argv={argv}\nrc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.returncode == 2, report
    assert "Traceback" not in r.stderr, report
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, report
    assert lines[0].startswith("error:"), report
    assert len(lines[0]) > len("error: "), report
    for text in expect:
        assert text in lines[0], f"{text!r} not in the error line\n{report}"
    # a refused config trains nothing
    assert not list(tmp_path.rglob("summary.json")), report
