"""Faults against the compile cache and the pipeline's checkpoints: a damaged, misplaced or unwritable cache
is one warning and never a crash, a save interrupted or out of disk space leaves the old artifacts file whole
and no half-written one; a checkpoint of another layout (pipeline stages / FSDP2 shards / the whole model) is
refused with one `error:` line on every rank and stays where it is (the bad-config cases of these features are
in test_bad_inputs.py's table)."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from tests.distributed.test_pipeline_parallel import TINY, two_ranks
from tests.faults.common import checkpoint_steps, ckpt_dir, error_line, loss_rows, subprocess_env
from tests.helpers import run_bounded
from turbotrain.accel.attention import _read_verdict
from turbotrain.accel.compile import CompileConfig
from turbotrain.accel.compile_cache import MAGIC, device_key, open_compile_cache, save_compile_cache
from turbotrain.accel.fused_loss import fused_linear_cross_entropy
from turbotrain.checkpoint import CheckpointConfig, Checkpointer
from turbotrain.config import load_config
from turbotrain.distributed.parallel import hsdp_shape
from turbotrain.errors import UserError
from turbotrain.resolve import Facts, resolve

CPU = torch.device("cpu")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    return open_compile_cache(CompileConfig(enabled=True, cache_dir=str(tmp_path / "c")), CPU, "abc")


def _sealed(payload: bytes) -> bytes:
    return MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def test_cache_dir_that_is_a_file_is_a_warning(tmp_path, capsys):
    (tmp_path / "afile").write_text("not a folder")
    got = open_compile_cache(CompileConfig(enabled=True, cache_dir=str(tmp_path / "afile")), CPU, "abc")
    assert got is None
    out, err = capsys.readouterr()
    assert "warning: compile cache" in out and "cannot be made" in out and not err


def test_artifacts_from_another_torch_are_one_warning_not_a_traceback(cache, capsys):
    """A sealed (checksum-valid) payload that torch cannot read, as from another torch build: one warning line
    of ours, and no traceback that torch's own logger would print to stderr."""
    cache.artifacts.write_bytes(_sealed(b"not torch's serialisation"))
    capsys.readouterr()
    again = open_compile_cache(CompileConfig(enabled=True, cache_dir=str(cache.folder.parent)), CPU, "abc")
    assert again.loaded == 0
    out, err = capsys.readouterr()
    assert out.count("warning: compile cache") == 1 and "Traceback" not in out + err and not err.strip()


def test_artifacts_path_that_is_a_folder(cache, monkeypatch, capsys):
    cache.artifacts.mkdir()
    again = open_compile_cache(CompileConfig(enabled=True, cache_dir=str(cache.folder.parent)), CPU, "abc")
    assert again.loaded == 0
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"payload", None))
    save_compile_cache(again)
    assert "warning: compile cache" in capsys.readouterr().out and cache.artifacts.is_dir()


def test_interrupted_save_keeps_the_old_artifacts_and_leaves_no_partial_file(cache, monkeypatch):
    """Ctrl-C (or SIGTERM turned into an exception) between writing and renaming: the previous .bin is intact
    and no temporary file is left in the folder."""
    old = _sealed(b"old")
    cache.artifacts.write_bytes(old)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"new", None))

    def interrupted(*a):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_compile_cache(cache)
    assert cache.artifacts.read_bytes() == old
    assert sorted(p.name for p in cache.folder.iterdir() if p.is_file()) == ["abc.bin"]


def _tmpfs(disk, options: str) -> None:
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(disk)],
                                           capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")


def test_read_only_cache_dir_is_a_warning(tmp_path, capsys):
    """A read-only file system (root ignores permission bits, so a mode-0o555 folder would not test this)."""
    disk = tmp_path / "ro"
    _tmpfs(disk, "ro,size=64k")
    try:
        assert open_compile_cache(CompileConfig(enabled=True, cache_dir=str(disk)), CPU, "abc") is None
        assert "cannot be made (Read-only file system)" in capsys.readouterr().out
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_full_disk_during_save_is_a_warning(tmp_path, monkeypatch, capsys):
    """The cache folder on a 64 KiB tmpfs, a 1 MiB payload: ENOSPC is one warning, nothing half-written."""
    disk = tmp_path / "disk"
    _tmpfs(disk, "size=64k")
    try:
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
        full = open_compile_cache(CompileConfig(enabled=True, cache_dir=str(disk)), CPU, "abc")
        monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (os.urandom(1 << 20), None))
        save_compile_cache(full)
        assert "not written (No space left on device)" in capsys.readouterr().out
        assert [p.name for p in (disk / device_key(CPU)).iterdir() if p.is_file()] == []
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# ---------------------------------------------------------------- the kept attention verdict (kernels.attention="auto")

@pytest.mark.parametrize("text", [
    '{"timings_ms": ["cudnn", "flash", "efficient"]}',  # the names without timings: once an AttributeError
    '{"timings_ms": {"cudnn": NaN, "flash": 1.0, "efficient": null}}',
    '{"timings_ms": {"cudnn": -1.0, "flash": 1.0, "efficient": null}}',
    '{"timings_ms": {"cudnn": true, "flash": 1.0, "efficient": null}}',
    '[1]', '', '{"timings_ms": {"cudnn": 1.0}}',
], ids=["list", "nan", "negative", "bool", "not-a-dict", "empty", "missing-backends"])
def test_a_damaged_attention_verdict_is_measured_again(tmp_path, capsys, text):
    path = tmp_path / "attention-x.json"
    path.write_text(text)
    assert _read_verdict(path) is None
    assert "is damaged; measuring again" in capsys.readouterr().out


def test_a_sound_attention_verdict_is_kept(tmp_path):
    path = tmp_path / "attention-x.json"
    path.write_text('{"timings_ms": {"cudnn": 0.5, "flash": 1, "efficient": null}}')
    assert _read_verdict(path) == {"cudnn": 0.5, "flash": 1, "efficient": None}


# ---------------------------------------------------------------- fused loss targets

@pytest.mark.parametrize("bad", [10, -5], ids=["vocab-size", "negative"])
def test_fused_loss_target_outside_the_vocabulary_is_refused_not_read(bad):
    """Ignored targets (-100) are fine; any other id outside [0, V) stops with the op's message (the GPU kernel
    would otherwise read another row's logit)."""
    h, w = torch.randn(6, 8), torch.randn(10, 8)
    ok = torch.tensor([1, -100, 3, -100, 9, 0])
    ref = torch.nn.functional.cross_entropy(h @ w.t(), ok)
    assert fused_linear_cross_entropy(h, w, ok).item() == pytest.approx(ref.item(), abs=1e-5)
    with pytest.raises(RuntimeError, match="outside"):
        fused_linear_cross_entropy(h, w, torch.tensor([1, -100, 3, bad, 9, 0]))


# ---------------------------------------------------------------- hsdp mesh and pipeline checkpoints

@pytest.mark.parametrize("world, shard, local, says", [
    (2, 3, 2, "parallel.shard_size = 3: WORLD_SIZE=2 must be a multiple of it"),
    (6, 4, 4, "parallel.shard_size = 4: WORLD_SIZE=6 must be a multiple of it; set parallel.shard_size to a "
              "divisor of 6"),
    (6, None, 4, "parallel.shard_size = 4 (the local world size): WORLD_SIZE=6"),
])
def test_hsdp_shard_size_that_does_not_divide_the_world(world, shard, local, says):
    with pytest.raises(UserError, match=re.escape(says)):
        hsdp_shape(world, shard, local)


PP = [*TINY, "data.batch_size=8", "parallel.pp_microbatches=4", "train.schedule=constant", "checkpoint.every=2",
      "checkpoint.keep=5", "train.eval_every=0", "run.name=pp"]


def torchrun(out, nproc: int, *args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
           "turbotrain", "train", "gpt-shakespeare", *PP, *args, f"run.out_dir={str(out)!r}"]
    r = run_bounded(cmd, 240, "pipeline run", env=subprocess_env())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    """A 2-stage pipeline run of 4 steps with checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("pp")
    torchrun(out, 2, "parallel.strategy=pipeline", "train.steps=4")
    return out


@pytest.mark.timeout(300)
def test_a_pipeline_checkpoint_resumes_at_another_stage_count_on_the_same_curve(pipeline_run, tmp_path):
    """Stopped at step 2 with 2 stages, resumed with 3 (the checkpoint resharded by parameter name): steps 3 and
    4 have the losses of the straight 2-stage run."""
    shutil.copytree(pipeline_run / "pp", tmp_path / "pp")
    shutil.rmtree(ckpt_dir(tmp_path / "pp", 4))
    r = torchrun(tmp_path, 3, "parallel.strategy=pipeline", "train.steps=4")
    assert "resumed from step 2" in r.stdout + r.stderr and "3 stages of 1/1/1 blocks" in r.stdout + r.stderr
    resumed, straight = loss_rows(tmp_path / "pp"), loss_rows(pipeline_run / "pp")
    assert [s for s, _ in resumed] == [1, 2, 3, 4]
    assert [v for _, v in resumed] == pytest.approx([v for _, v in straight], abs=1e-6, rel=0)


@pytest.mark.timeout(300)
def test_a_pipeline_checkpoint_under_fsdp_is_refused_and_kept(pipeline_run, tmp_path):
    """It once failed DCP's load, was taken for damaged, moved aside, and the run started fresh (under ddp the
    line named fsdp as the fix). The same check (checkpoint.py, _check_compatible) serves every pair of layouts."""
    shutil.copytree(pipeline_run / "pp", tmp_path / "pp")
    for rank, r in enumerate(two_ranks(tmp_path, "gpt-shakespeare", *PP, "parallel.strategy=fsdp",
                                       "data.batch_size=4", "train.steps=6")):
        assert r.returncode == 2, f"rank {rank}: rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        line = error_line(r.stderr)
        assert "pipeline stages" in line and 'parallel.strategy="pipeline"' in line, line
    assert checkpoint_steps(tmp_path / "pp") == [2, 4] and not (tmp_path / "pp" / "checkpoints.old-1").exists()


@pytest.mark.parametrize("theirs, mine, says", [
    ((True, "pipeline"), (False, "ddp"), 'holds pipeline stages (parallel.strategy "pipeline"); this run is the whole'),
    ((True, "pipeline"), (True, "hsdp"), 'resume it with parallel.strategy="pipeline"'),
    ((True, "fsdp"), (True, "pipeline"), 'resume it with parallel.strategy="fsdp" or "hsdp"'),
    ((False, "none"), (True, "pipeline"), 'resume it with parallel.strategy="ddp" or "none"'),
    ((True, None), (False, "ddp"), "holds FSDP2 shards"),  # metadata without a strategy: by `sharded`
], ids=["pipeline-under-ddp", "pipeline-under-hsdp", "fsdp-under-pipeline", "whole-under-pipeline", "no-strategy"])
def test_each_checkpoint_layout_loads_only_into_its_own(tmp_path, theirs, mine, says):
    shapes = {"w": [2, 2]}
    meta = {"param_shapes": shapes, "global_batch": 8, "sharded": theirs[0]}
    if theirs[1]:
        meta["strategy"] = theirs[1]
    ck = Checkpointer(CheckpointConfig(), tmp_path, 0, 2, sharded=mine[0], flat_optim=mine[1] == "pipeline")
    expect = {"param_shapes": shapes, "global_batch": 8, "optimizer": "adamw", "dtype": "fp32", "strategy": mine[1]}
    with pytest.raises(UserError, match=re.escape(says)):
        ck._check_compatible(tmp_path, meta, expect)
    ck._check_compatible(tmp_path, {**meta, "sharded": mine[0], "strategy": mine[1]}, expect)  # its own: loads


@pytest.mark.parametrize("strategy", ["none", "ddp", "fsdp"])
def test_hsdp_and_pipeline_keys_under_another_strategy_are_said_not_ignored(capsys, strategy):
    """parallel.shard_size / pp_microbatches set under another strategy (meant for hsdp / pipeline): one line
    each says they do not apply, and config.toml holds what ran."""
    cfg = load_config("gpt-shakespeare", [f'parallel.strategy="{strategy}"', "parallel.shard_size=2",
                                          "parallel.pp_microbatches=4"])
    out = resolve(cfg, Facts(device=CPU, world_size=1 if strategy == "none" else 2))
    assert out.parallel.shard_size is None and out.parallel.pp_microbatches == 0
    said = capsys.readouterr().out
    assert "parallel.shard_size: 2 → None (shard groups are hsdp's" in said
    assert "parallel.pp_microbatches: 4 → 0 (pipeline chunks" in said
