"""Faults against the compile cache and the pipeline's checkpoints: a damaged, misplaced or unwritable cache
is one warning and never a crash, a save interrupted or out of disk space leaves the old artifacts file whole
and no half-written one; a checkpoint of another layout (pipeline stages / FSDP2 shards / the whole model) is
refused with one `error:` line on every rank and stays where it is (the bad-config cases of these features are
in test_bad_inputs.py's table)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
import torch

from tests.distributed.test_pipeline_parallel import TINY, two_ranks
from tests.faults.common import checkpoint_steps, error_line, subprocess_env
from tests.helpers import run_bounded
from turbotrain.accel.attention import _read_verdict
from turbotrain.accel.compile import CompileConfig
from turbotrain.accel.compile_cache import MAGIC, device_key, open_compile_cache, save_compile_cache

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


def test_full_disk_during_save_is_a_warning(tmp_path, monkeypatch, capsys):
    """The cache folder on a 64 KiB tmpfs, a 1 MiB payload: ENOSPC is one warning, nothing half-written."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                                           capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
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


# ---------------------------------------------------------------- pipeline checkpoints under other layouts

PP = [*TINY, "data.batch_size=8", "train.schedule=constant", "checkpoint.every=2", "train.eval_every=0",
      "run.name=pp"]


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    """A 2-stage pipeline run stopped at step 2 with its checkpoint."""
    out = tmp_path_factory.mktemp("pp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "turbotrain",
           "train", "gpt-shakespeare", *PP, "parallel.strategy=pipeline", "train.steps=2",
           f"run.out_dir={str(out)!r}"]
    r = run_bounded(cmd, 240, "pipeline run", env=subprocess_env())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_pipeline_checkpoint_under_another_strategy_is_refused_and_kept(pipeline_run, strategy):
    """Under fsdp it once failed DCP's load, was taken for damaged, moved aside, and the run started fresh."""
    run_dir = pipeline_run / "pp"
    for rank, r in enumerate(two_ranks(pipeline_run, "gpt-shakespeare", *PP, f"parallel.strategy={strategy}",
                                       "data.batch_size=4", "train.steps=4")):
        assert r.returncode == 2, f"rank {rank}: rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        line = error_line(r.stderr)
        assert "pipeline stages" in line and 'parallel.strategy="pipeline"' in line, line
    assert checkpoint_steps(run_dir) == [2] and not (run_dir / "checkpoints.old-1").exists()
