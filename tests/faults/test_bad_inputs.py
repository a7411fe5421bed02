"""Bad inputs and faults through `turbotrain train`: each is refused as a user error — exit 2 and exactly
one stderr line starting `error:` that names the problem, no traceback, nothing trained — or, for a
malicious checkpoint, refused without running its code.

THE table of bad configs and inputs is CASES below (config parsing, user code, devices, training numbers, run
dirs, checkpoint settings): add new bad-config cases there, not in another file. They call
`turbotrain.cli.main(["train", ...])` in-process (same code path as the CLI, without a ~3 s torch import per
case); a few go through `python -m turbotrain` to hold the real process to the contract
(test_cli_process_exit_2_one_error_line).
User code lives in tests/userpkg (tests/ on sys.path / PYTHONPATH: see tests/userpkg/__init__.py).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.faults.common import (
    BASE_TOML,
    checkpoint_steps,
    ckpt_dir,
    error_line,
    flip_bytes,
    lit,
    plant_payload,
    report,
    reseal,
    run_cli,
    train_argv,
)
from tests.helpers import TINY_GPT
from turbotrain.checkpoint import Checkpointer
from turbotrain.cli import main

BASE = str(BASE_TOML)
GPT = ["gpt2-124m", *TINY_GPT, 'run.device="cpu"', "train.log_every=1", "run.name=gpt"]
LLAMA = ["llama-1b", "model.args.n_layer=2", "model.args.n_embd=32", "model.args.n_head=4", "model.args.n_kv_head=2",
         "model.args.ffn_hidden=64", "model.args.vocab_size=64", "model.args.block_size=32", "data.args.seq_len=32",
         "data.args.vocab_size=64", "data.args.size=64", "data.batch_size=4", "precision.dtype=fp32",
         "compile.enabled=false", "kernels.fused_loss=false", 'run.device="cpu"', "train.steps=2"]


@pytest.fixture(scope="module")
def gpt_checkpoints(tmp_path_factory) -> Path:
    """A finished tiny-GPT run (4 steps, a checkpoint every 2): out_dir holding run dir `gpt`."""
    out = tmp_path_factory.mktemp("gptckpt")
    rc = main(["train", *GPT, f"run.out_dir={lit(out)}", "train.steps=4", "checkpoint.every=2"])
    assert rc == 0
    assert checkpoint_steps(out / "gpt") == [2, 4]
    return out


def run_main(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["train", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------- the table
# Each case: argv after `train` ({tmp} = tmp_path; BASE cases get run.out_dir={tmp}/runs), the substrings
# the error line must hold, and optionally a `prepare(tmp_path)` that builds files first.

MALFORMED = '[train]\nsteps = = 3\n[run\n'


def _malformed_toml(tmp: Path) -> None:
    (tmp / "broken.toml").write_text(MALFORMED)


def _run_folder(tmp):
    """A run's folder where checkpoint.resume wants one of its checkpoints (those are folders with meta.json)."""
    for step in (2, 4):
        (tmp / "run" / "checkpoints" / f"step-{step:08d}").mkdir(parents=True)


def _file_in_the_way(tmp: Path) -> None:
    (tmp / "afile").write_text("not a directory")


def _copy_gpt(tmp: Path, src: Path) -> Path:
    shutil.copytree(src / "gpt", tmp / "gpt")
    return tmp / "gpt"


def case(case_id: str, argv: list[str], expect: list[str], prepare=None, marks=()):
    return pytest.param(argv, expect, prepare, id=case_id, marks=marks)


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")

CASES = [
    # ------------------------------------------------ config files and KEY=VALUE overrides
    case("override-unknown-key", [BASE, "train.foo=1"], ["unknown key train.foo; valid keys in [train]: steps"]),
    case("override-unknown-section", [BASE, "nope.x=1"], ["unknown section [nope]"]),
    case("override-without-equals", [BASE, "train.steps"], ["train.steps", "expected SECTION.KEY=VALUE"]),
    case("override-bad-choice", [BASE, "precision.dtype=bf17"],
         ['precision.dtype = "bf17": expected one of "fp32", "tf32", "bf16", "fp16", "auto"']),
    case("override-not-an-integer", [BASE, 'train.steps="ten"'], ['train.steps = "ten": expected an integer']),
    case("override-not-a-number", [BASE, "train.lr=true"], ["train.lr = true: expected a number"]),
    case("config-file-missing", ["{tmp}/nope.toml"], ["nope.toml", "not found"]),
    case("config-file-malformed", ["{tmp}/broken.toml"], ["broken.toml", "malformed"], _malformed_toml),
    case("preset-unknown", ["no-such-preset"], ["no-such-preset", "mlp-seed"]),
    case("compile-scope-invalid", [BASE, "compile.scope=layer"], ["compile.scope"]),
    case("num-workers-negative", [BASE, "data.num_workers=-1"], ["data.num_workers = -1"]),
    case("gpt-heads-mismatch", ["gpt2-124m", "model.args.n_embd=32", "model.args.n_head=3", "data.args.size=64",
                                "data.args.seq_len=32", "model.args.block_size=32"], ["model.args.n_embd", "n_head"]),
    case("resnet-depth", ["resnet50-synthetic", "model.args.depth=18", "data.args.size=8", "data.batch_size=4",
                          "data.args.shape=[3,32,32]"], ["model.args.depth = 18", "50"]),
    case("ddp-without-torchrun", ["mlp-seed", "parallel.strategy=ddp", 'run.device="cpu"'], ["torchrun", "RANK"]),
    # a model larger than the host is refused from its arguments, before anything is allocated
    case("gpt-layers-huge", [*GPT, "model.args.n_layer=100000000"], ["model.args", "parameters", "GiB"]),
    case("gpt-width-huge", [*GPT, "model.args.n_embd=1000000", "model.args.n_head=1"], ["model.args", "GiB"]),
    case("llama-layers-huge", ["llama-shakespeare", "model.args.n_layer=100000000"], ["model.args", "parameters"]),
    # ------------------------------------------------ user code: model
    case("model-module-not-found", [BASE, 'model.name="userpkg.nosuchmodule:build"'],
         ["model.name", "userpkg.nosuchmodule", "PYTHONPATH"]),
    case("model-module-import-fails", [BASE, 'model.name="userpkg.broken:build"'],
         ["model.name", "cannot import", "userpkg_dependency_that_is_not_installed"]),
    case("model-package-not-found", [BASE, 'model.name="nosuchpkg_xyz.models:build"'], ["model.name", "nosuchpkg_xyz"]),
    case("model-factory-missing-attr", [BASE, 'model.name="userpkg.models:nope"'], ["model.name", "nope"]),
    case("model-factory-not-callable", [BASE, 'model.name="userpkg.models:CONSTANT"'], ["model.name", "not callable"]),
    case("model-spec-without-attr", [BASE, 'model.name="userpkg.models:"'], ["model.name", "pkg.module:name"]),
    case("model-factory-returns-int", [BASE, 'model.name="userpkg.models:returns_int"'],
         ["model.name", "int", "nn.Module"]),
    case("model-factory-unexpected-kwarg", [BASE, "model.args.bogus=1"], ["model.args", "bogus"]),
    case("model-factory-missing-kwarg", [BASE, 'model.name="userpkg.models:needs_width"'], ["model.args", "width"]),
    case("model-unknown-builtin", [BASE, 'model.name="transformer"'], ["model.name", "transformer"]),
    # ------------------------------------------------ user code: data and loss
    case("data-unknown-name", [BASE, 'data.name="nosuchdata"'], ["data.name", "nosuchdata"]),
    case("data-factory-returns-none", [BASE, 'data.name="userpkg.data:returns_none"'],
         ["data.name", "NoneType", "Dataset"]),
    case("data-factory-returns-iterable", [BASE, 'data.name="userpkg.data:iterable"'], ["data.name", "map-style"]),
    case("data-factory-unknown-kwarg", [BASE, "data.args.bogus=1"], ["data.args", "bogus"]),
    case("data-builtin-unknown-kwarg", [*GPT, "data.args.no_such_arg=1"], ["data.args", "no_such_arg"]),
    case("dataset-smaller-than-global-batch", [BASE, "data.args.n=4"],
         ["4 samples", "global batch of 8", "data.batch_size"]),
    case("dataset-smaller-than-accumulated-batch", [BASE, "data.args.n=12", "train.grad_accum=2"],
         ["12 samples", "global batch of 16", "grad_accum 2"]),
    case("dataset-empty", [BASE, "data.args.n=0"], ["0 samples"]),
    case("loss-function-missing", [BASE, 'train.loss="userpkg.models:nope_loss"'], ["train.loss", "nope_loss"]),
    case("loss-module-missing", [BASE, 'train.loss="userpkg.nolosses:l1"'], ["train.loss", "userpkg.nolosses"]),
    case("loss-not-callable", [BASE, 'train.loss="userpkg.models:CONSTANT"'], ["train.loss", "not callable"]),
    case("loss-unknown-name", [BASE, 'train.loss="hinge"'], ["train.loss", "hinge"]),
    # ------------------------------------------------ devices and techniques
    case("device-cuda-without-cuda", [BASE, 'run.device="cuda"'], ["run.device", "CUDA is not available"],
         marks=NO_CUDA),
    case("device-cuda7", [BASE, 'run.device="cuda:7"'], ["run.device", "cuda:7"],
         marks=pytest.mark.skipif(torch.cuda.device_count() > 7, reason="8 GPUs here")),
    case("device-unknown", [BASE, 'run.device="tpu"'], ["run.device", "tpu"]),  # bare run.device=tpu alike
    case("compile-mode-invalid", [BASE, 'compile.mode="fastest"'], ["compile.mode", "fastest", "max-autotune"]),
    case("precision-dtype-invalid", [BASE, 'precision.dtype="fp8"'], ["precision.dtype", "fp8"]),
    case("act-ckpt-without-blocks", [BASE, 'memory.activation_checkpointing="full"'],
         ["memory.activation_checkpointing", "blocks"]),
    case("act-ckpt-invalid", [BASE, 'memory.activation_checkpointing="half"'], ["memory.activation_checkpointing"]),
    case("strategy-invalid", [BASE, 'parallel.strategy="zero3"'], ["parallel.strategy", "zero3"]),
    # ------------------------------------------------ training numbers
    case("lr-negative", [BASE, "train.lr=-0.001"], ["train.lr", "-0.001"]),
    case("lr-zero", [BASE, "train.lr=0"], ["train.lr"]),
    case("steps-zero", [BASE, "train.steps=0"], ["train.steps", "0"]),
    case("steps-negative", [BASE, "train.steps=-5"], ["train.steps", "-5"]),
    case("log-every-zero", [BASE, "train.log_every=0"], ["train.log_every"]),
    case("grad-accum-zero", [BASE, "train.grad_accum=0"], ["train.grad_accum = 0: must be >= 1"]),
    case("max-bad-steps-zero", [BASE, "train.max_bad_steps=0"], ["train.max_bad_steps"]),
    case("batch-size-zero", [BASE, "data.batch_size=0"], ["data.batch_size = 0: must be >= 1"]),
    case("grad-clip-negative", [BASE, "train.grad_clip=-1.0"], ["train.grad_clip"]),
    case("nan-from-start", [BASE, 'model.name="userpkg.models:nan_from_start"'], ["NaN", "step 3"]),
    # ------------------------------------------------ run dir
    case("out-dir-under-a-file", [BASE, "run.out_dir={tmp}/afile/runs"], ["run.out_dir", "afile"], _file_in_the_way),
    case("run-name-with-slash", [BASE, 'run.name="a/b"'], ["run.name", "a/b"]),
    # ------------------------------------------------ checkpoint settings
    case("checkpoint-every-negative", [BASE, "checkpoint.every=-1"], ["checkpoint.every", "-1"]),
    case("checkpoint-every-float", [BASE, "checkpoint.every=2.5"], ["checkpoint.every", "integer"]),
    case("checkpoint-keep-zero", [BASE, "checkpoint.keep=0"], ["checkpoint.keep", "0"]),
    case("checkpoint-resume-not-a-string", [BASE, "checkpoint.resume=5"], ["checkpoint.resume", "string"]),
    case("checkpoint-resume-path-missing", [BASE, "checkpoint.resume={tmp}/nope/step-00000002"],
         ["checkpoint.resume", "no such folder", '"auto"']),
    case("checkpoint-resume-path-is-a-file", [BASE, "checkpoint.resume={tmp}/afile"],
         ["checkpoint.resume", "no such folder"], _file_in_the_way),
    case("checkpoint-resume-empty-folder", [BASE, "checkpoint.resume={tmp}"],
         ["checkpoint.resume", "not a checkpoint folder", "no meta.json"]),
    case("checkpoint-resume-a-run-folder", [BASE, "checkpoint.resume={tmp}/run"],
         ["not a checkpoint folder", "e.g. ", "run/checkpoints/step-00000004"], _run_folder),
    # ------------------------------------------------ fp8, fused loss, attention "auto", compile caches
    case("fp8-unknown-recipe", [BASE, 'precision.fp8="blockwise"'], ['precision.fp8 = "blockwise"', '"rowwise"']),
    case("fp8-not-a-string", [BASE, "precision.fp8=1"], ["precision.fp8 = 1", '"tensorwise"']),
    case("fp8-bool", [BASE, "precision.fp8=true"], ["precision.fp8 = true"]),
    case("fp8-without-gpu", [BASE, 'precision.fp8="rowwise"'], ["precision.fp8", "sm89", "'off'"], marks=NO_CUDA),
    case("fp8-with-fp16", [BASE, 'precision.fp8="tensorwise"', "precision.dtype=fp16"], ["precision.fp8"],
         marks=NO_CUDA),
    case("fp8-head-not-bool", [BASE, "precision.fp8_head=1"], ["precision.fp8_head = 1", "true or false"]),
    case("fp8-head-without-fp8", [BASE, "precision.fp8_head=true"],
         ["precision.fp8_head", 'precision.fp8="tensorwise"']),
    case("fp8-head-with-fused-loss", [*LLAMA, "precision.fp8_head=true", 'precision.fp8="tensorwise"',
                                      "kernels.fused_loss=true"], ["precision.fp8_head", "kernels.fused_loss=false"]),
    case("fused-loss-not-bool", [BASE, 'kernels.fused_loss="yes"'], ['kernels.fused_loss = "yes"', "true or false"]),
    case("fused-loss-user-model", [BASE, "kernels.fused_loss=true", 'train.loss="cross_entropy"'],
         ["kernels.fused_loss", "hidden", "kernels.fused_loss=false"]),
    case("fused-loss-mse", [*GPT, "kernels.fused_loss=true", 'train.loss="mse"'],
         ["kernels.fused_loss", 'train.loss = "mse"']),
    case("fused-loss-model-loss", [*LLAMA, "kernels.fused_loss=true", 'train.loss="model"'],
         ["kernels.fused_loss", 'train.loss = "model"']),
    case("fused-loss-hf-model", [BASE, 'model.name="hf:gpt2"', "kernels.fused_loss=true", 'train.loss="cross_entropy"'],
         ["kernels.fused_loss", "hidden"]),
    case("attention-unknown", [BASE, 'kernels.attention="fastest"'], ['kernels.attention = "fastest"', '"auto"']),
    case("attention-not-a-string", [BASE, "kernels.attention=3"], ["kernels.attention = 3"]),
    case("compile-cache-not-bool", [BASE, 'compile.cache="yes"'], ['compile.cache = "yes"', "true or false"]),
    case("compile-cache-dir-not-a-string", [BASE, "compile.cache_dir=5"], ["compile.cache_dir = 5", "string"]),
    case("compile-cache-dir-spaces", [BASE, 'compile.cache_dir="   "'], ["compile.cache_dir", "spaces"]),
    # ------------------------------------------------ pipeline, hsdp, meta init (one process)
    case("pp-microbatches-negative", [BASE, "parallel.pp_microbatches=-1"], ["parallel.pp_microbatches = -1"]),
    case("pp-microbatches-string", [BASE, 'parallel.pp_microbatches="four"'], ["parallel.pp_microbatches", "integer"]),
    case("pp-microbatches-float", [BASE, "parallel.pp_microbatches=2.5"], ["parallel.pp_microbatches", "integer"]),
    case("pp-microbatches-huge", [BASE, "parallel.pp_microbatches=99999999999999999999999"],
         ["parallel.pp_microbatches", "out of range"]),
    case("pp-schedule-unknown", [BASE, 'parallel.pp_schedule="interleaved"'], ["parallel.pp_schedule", '"1f1b"']),
    case("pipeline-without-torchrun", [*GPT, "parallel.strategy=pipeline"], ["pipeline", "torchrun"]),
    case("hsdp-without-torchrun", [BASE, "parallel.strategy=hsdp", "parallel.shard_size=3"], ["hsdp", "torchrun"]),
    case("shard-size-zero", [BASE, "parallel.shard_size=0"], ["parallel.shard_size = 0", ">= 1"]),
    case("shard-size-negative", [BASE, "parallel.shard_size=-2"], ["parallel.shard_size = -2"]),
    case("shard-size-string", [BASE, 'parallel.shard_size="two"'], ["parallel.shard_size", "two"]),
    case("shard-size-bool", [BASE, "parallel.shard_size=true"], ["parallel.shard_size"]),
    case("meta-init-string", [BASE, 'parallel.meta_init="yes"'], ["parallel.meta_init", '"auto"']),
    case("meta-init-int", [BASE, "parallel.meta_init=1"], ["parallel.meta_init = 1"]),
    case("meta-init-hf-model", [BASE, 'model.name="hf:gpt2"', "parallel.meta_init=true"],
         ["parallel.meta_init = true", "hf:gpt2", "parallel.meta_init = false"]),
    # ------------------------------------------------ llama arguments
    case("llama-kv-heads-not-dividing", [*LLAMA, "model.args.n_kv_head=3"], ["model.args.n_kv_head = 3", "n_head = 4"]),
    case("llama-embd-not-dividing", [*LLAMA, "model.args.n_embd=30"], ["model.args.n_embd = 30", "n_head = 4"]),
    case("llama-odd-head-dim", [*LLAMA, "model.args.n_embd=36", "model.args.n_kv_head=1"],
         ["model.args.n_embd = 36", "even"]),
    case("llama-kv-heads-zero", [*LLAMA, "model.args.n_kv_head=0"], ["model.args.n_kv_head = 0"]),
    case("llama-kv-heads-string", [*LLAMA, 'model.args.n_kv_head="two"'], ["model.args.n_kv_head", "two"]),
    case("llama-ffn-negative", [*LLAMA, "model.args.ffn_hidden=-1"], ["model.args.ffn_hidden = -1"]),
    case("llama-rope-theta-zero", [*LLAMA, "model.args.rope_theta=0"], ["model.args.rope_theta = 0"]),
    case("llama-rope-theta-nan", [*LLAMA, "model.args.rope_theta=nan"], ["model.args.rope_theta = nan"]),
    case("llama-norm-eps-negative", [*LLAMA, "model.args.norm_eps=-1"], ["model.args.norm_eps = -1"]),
    case("llama-tie-weights-string", [*LLAMA, 'model.args.tie_weights="no"'], ["model.args.tie_weights"]),
    case("llama-multiple-of-zero", [*LLAMA, "model.args.ffn_hidden=0", "model.args.multiple_of=0"],
         ["model.args.multiple_of = 0"]),
    case("llama-block-size-below-seq-len", [*LLAMA, "model.args.block_size=16"],
         ["model.args.block_size = 16", "32 tokens"]),
    case("llama-vocab-below-data", [*LLAMA, "model.args.vocab_size=10"], ["model.args.vocab_size = 10"]),
    case("llama-unknown-arg", [*LLAMA, "model.args.n_kv_heads=2"], ["model.args", "n_kv_heads", "n_kv_head"]),
    case("gpt-block-size-below-seq-len", [*GPT, "model.args.block_size=16"], ["model.args.block_size = 16"]),
]


def _fill(arg: str, tmp: Path) -> str:
    """{tmp} -> tmp_path: in a KEY=VALUE override as a TOML literal string, in a config path as is."""
    if "{tmp}" not in arg:
        return arg
    if "=" in arg:
        key, value = arg.split("=", 1)
        return f"{key}={lit(value.replace('{tmp}', str(tmp)))}"
    return arg.replace("{tmp}", str(tmp))


@pytest.mark.parametrize("argv, expect, prepare", CASES)
def test_bad_input_is_a_user_error(tmp_path, capsys, argv, expect, prepare):
    if prepare:
        prepare(tmp_path)
    argv = [_fill(a, tmp_path) for a in argv]
    if not any(a.startswith("run.out_dir=") for a in argv):
        argv.append(f"run.out_dir={lit(tmp_path / 'runs')}")
    rc, out, err = run_main(capsys, argv)
    assert rc == 2, f"rc={rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err}"
    line = error_line(err)
    for text in expect:
        assert text in line, f"{text!r} not in {line!r}"
    assert not list(tmp_path.rglob("summary.json"))  # nothing finished


def test_world_size_mismatch_is_a_user_error(tmp_path, capsys, monkeypatch):
    """parallel.strategy="none" in a process that torchrun (or someone) gave WORLD_SIZE=2."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    rc, out, err = run_main(capsys, [BASE, f"run.out_dir={lit(tmp_path)}", 'parallel.strategy="none"'])
    assert rc == 2, err
    line = error_line(err)
    assert "parallel.strategy" in line and "WORLD_SIZE=2" in line


# ---------------------------------------------------------------- NaN after some steps

def test_nan_midway_stops_with_exit_2_and_keeps_earlier_checkpoints(tmp_path, capsys):
    """A model that turns NaN after a few steps: exit 2 naming NaN; the checkpoints written while the loss
    was finite remain and verify."""
    rc, out, err = run_main(capsys, [BASE, f"run.out_dir={lit(tmp_path)}", 'model.name="userpkg.models:nan_after"',
                                     "model.args.after=6", "train.steps=20", "checkpoint.every=2",
                                     "checkpoint.keep=20"])
    assert rc == 2, err
    line = error_line(err)
    assert "NaN" in line
    run_dir = tmp_path / "fault"
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first_bad = min(r["step"] for r in rows if r["loss"] is None)  # a NaN is written as null
    assert first_bad > 2
    kept = checkpoint_steps(run_dir)
    before = [s for s in range(2, first_bad, 2)]
    assert set(before) <= set(kept), f"checkpoints before the first NaN step {first_bad}: {kept}"
    for s in before:
        assert Checkpointer.verify(ckpt_dir(run_dir, s)) is None
    assert not (run_dir / "summary.json").exists()


def test_nan_stop_leaves_no_poisoned_checkpoint(tmp_path, capsys):
    rc, out, err = run_main(capsys, [BASE, f"run.out_dir={lit(tmp_path)}", 'model.name="userpkg.models:nan_after"',
                                     "model.args.after=6", "train.steps=20", "checkpoint.every=2",
                                     "checkpoint.keep=20"])
    assert rc == 2
    run_dir = tmp_path / "fault"
    for s in checkpoint_steps(run_dir):
        state = torch.load(ckpt_dir(run_dir, s) / "state.pt", weights_only=True)
        bad = [k for k, v in state["model"].items() if not torch.isfinite(v).all()]
        assert not bad, f"checkpoint step {s} holds non-finite weights: {bad}"


# ---------------------------------------------------------------- resume against an incompatible run

def test_resume_with_other_model_shape(tmp_path, capsys, gpt_checkpoints):
    _copy_gpt(tmp_path, gpt_checkpoints)
    rc, out, err = run_main(capsys, [*GPT, f"run.out_dir={lit(tmp_path)}", "train.steps=6", "model.args.n_embd=48"])
    assert rc == 2, err
    line = error_line(err)
    assert "another model" in line and "step-00000004" in line and "resume" in line


def test_resume_with_other_global_batch(tmp_path, capsys, gpt_checkpoints):
    _copy_gpt(tmp_path, gpt_checkpoints)
    rc, out, err = run_main(capsys, [*GPT, f"run.out_dir={lit(tmp_path)}", "train.steps=6", "data.batch_size=8"])
    assert rc == 2, err
    line = error_line(err)
    assert "global batch 16" in line and "has 8" in line and "data.batch_size" in line


@pytest.mark.parametrize("change, expect", [
    ('train.optimizer="sgd"', ["adamw state", "train.optimizer", "resume"]),
    ("precision.dtype=fp16", ["precision fp32", "fp16", "scaler"]),
])
def test_resume_with_other_optimizer_or_loss_scaling(tmp_path, capsys, gpt_checkpoints, change, expect):
    """Optimizer or GradScaler state that cannot carry over: one error line, not a KeyError traceback."""
    _copy_gpt(tmp_path, gpt_checkpoints)
    rc, out, err = run_main(capsys, [*GPT, f"run.out_dir={lit(tmp_path)}", "train.steps=6", change])
    assert rc == 2, err
    line = error_line(err)
    assert all(e in line for e in expect), line


def test_resume_with_same_global_batch_other_split_is_accepted(tmp_path, capsys, gpt_checkpoints):
    """Control: micro 8 x accum 2 = the checkpoint's global batch 16, so resuming is fine."""
    _copy_gpt(tmp_path, gpt_checkpoints)
    rc, out, err = run_main(capsys, [*GPT, f"run.out_dir={lit(tmp_path)}", "train.steps=6", "data.batch_size=8",
                                     "train.grad_accum=2"])
    assert rc == 0, err
    assert "resumed from step 4" in out


def test_resume_explicit_corrupt_path(tmp_path, capsys, gpt_checkpoints):
    run_dir = _copy_gpt(tmp_path, gpt_checkpoints)
    flip_bytes(ckpt_dir(run_dir, 2) / "state.pt")
    rc, out, err = run_main(capsys, [*GPT, f"run.out_dir={lit(tmp_path)}", "train.steps=6",
                                     f"checkpoint.resume={lit(ckpt_dir(run_dir, 2))}"])
    assert rc == 2, err
    line = error_line(err)
    assert "checkpoint.resume" in line and "corrupt" in line and "state.pt" in line


def test_resume_checkpoint_beyond_train_steps(tmp_path, capsys, gpt_checkpoints):
    _copy_gpt(tmp_path, gpt_checkpoints)
    rc, out, err = run_main(capsys, [*GPT, f"run.out_dir={lit(tmp_path)}", "train.steps=3"])
    assert rc == 2, err
    line = error_line(err)
    assert "step 4" in line and "train.steps=3" in line


# ---------------------------------------------------------------- malicious checkpoints

def test_payload_is_live(tmp_path):
    """Control for the payload tests: unpickled WITHOUT weights_only, the payload does run."""
    marker = tmp_path / "ran"
    plant_payload(tmp_path / "x.pt", marker, "torch")
    torch.load(tmp_path / "x.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("target, fmt", [("state.pt", "pickle"), ("rng-rank0.pt", "torch")],
                         ids=["state-bare-pickle", "rng-torch-zip"])
def test_pickle_payload_in_checkpoint_does_not_run(tmp_path, capsys, gpt_checkpoints, target, fmt):
    run_dir = _copy_gpt(tmp_path, gpt_checkpoints)
    marker, ck = tmp_path / "PWNED", ckpt_dir(run_dir, 4)
    plant_payload(ck / target, marker, fmt)
    reseal(ck)
    assert Checkpointer.verify(ck) is None  # the manifest agrees: only weights_only stands in the way
    capsys.readouterr()
    try:
        rc = main(["train", *GPT, f"run.out_dir={lit(tmp_path)}", "train.steps=6"])
    except Exception:  # an unpickling error that main() does not turn into an exit code (exit 1 in the CLI)
        rc = 1
    assert not marker.exists(), "the checkpoint's pickled code RAN"
    assert rc != 0


def test_pickle_payload_in_checkpoint_does_not_run_cli(tmp_path, gpt_checkpoints):
    """The same through `python -m turbotrain`: torch.save's zip format as state.pt, manifest resealed."""
    run_dir = _copy_gpt(tmp_path, gpt_checkpoints)
    marker, ck = tmp_path / "PWNED", ckpt_dir(run_dir, 4)
    plant_payload(ck / "state.pt", marker, "torch")
    reseal(ck)
    assert Checkpointer.verify(ck) is None
    r = run_cli(train_argv(*GPT, f"run.out_dir={lit(tmp_path)}", "train.steps=6"), cwd=tmp_path)
    assert not marker.exists(), "the checkpoint's pickled code RAN\n" + report(r)
    assert r.returncode != 0, report(r)
    assert "resumed from" not in r.stdout


# ---------------------------------------------------------------- the real process

@pytest.mark.parametrize("argv, env, expect", [
    ([BASE, "train.foo=1"], {}, ["unknown key train.foo"]),
    ([BASE, 'model.name="userpkg.models:nan_from_start"'], {}, ["NaN"]),
    ([BASE, 'parallel.strategy="none"'], {"WORLD_SIZE": "2"}, ["parallel.strategy", "WORLD_SIZE=2"]),
    ([BASE, 'data.name="userpkg.data:returns_none"'], {}, ["data.name", "Dataset"]),
], ids=["unknown-key", "nan", "world-size-mismatch", "not-a-dataset"])
def test_cli_process_exit_2_one_error_line(tmp_path, argv, env, expect):
    r = run_cli(train_argv(*argv, f"run.out_dir={lit(tmp_path)}"), cwd=tmp_path, **env)
    assert r.returncode == 2, report(r)
    line = error_line(r.stderr)
    for text in expect:
        assert text in line, report(r)


def test_a_meta_built_model_whose_channels_do_not_fit_the_data_is_one_error_line(tmp_path, capsys):
    # parallel.meta_init skips the first forward until the model is materialised; the FLOP count on meta tensors
    # ran before it and died in torch's conv shape check with a traceback
    from turbotrain.cli import main

    code = main(["train", "resnet50-synthetic", "data.args.shape=[4, 32, 32]", "model.args.in_channels=3",
                 "parallel.meta_init=true", "model.args.base_width=4", "data.args.size=16", "data.batch_size=4",
                 "train.steps=1", f"run.out_dir={str(tmp_path)!r}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("error: ") and "4 channels" in err[-1] and "model.args.in_channels = 3" in err[-1]
