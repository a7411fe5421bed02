"""Compile caches in turbotrain's folder: where they point, and a damaged file never stops a run."""
import os

import torch

from turbotrain.accel.compile import CompileConfig
from turbotrain.accel.compile_cache import (
    MAGIC,
    CompileCache,
    cache_folder,
    device_key,
    graph_digest,
    open_compile_cache,
    save_compile_cache,
)
from turbotrain.config import load_config

CPU = torch.device("cpu")
ON = CompileConfig(enabled=True)


def test_caches_point_into_the_folder_keyed_by_torch_and_device(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path))
    cache = open_compile_cache(ON, CPU, "abc")
    folder = tmp_path / "compile" / device_key(CPU)
    assert cache.folder == folder == cache_folder(ON, CPU) and cache.artifacts == folder / "abc.bin"
    assert device_key(CPU) == f"torch-{torch.__version__}-cpu"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(folder / "triton")
    assert cache.loaded == 0 and "compile: cold start" in capsys.readouterr().out
    mine = CompileConfig(enabled=True, cache_dir=str(tmp_path / "mine"))
    assert open_compile_cache(mine, CPU, "abc").folder == tmp_path / "mine" / device_key(CPU)
    assert open_compile_cache(CompileConfig(enabled=True, cache=False), CPU, "abc") is None
    assert open_compile_cache(CompileConfig(enabled=False), CPU, "abc") is None


def test_a_users_own_inductor_cache_dir_is_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))
    open_compile_cache(CompileConfig(enabled=True, cache_dir=str(tmp_path)), CPU, "abc")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "users")
    assert "keeping TORCHINDUCTOR_CACHE_DIR" in capsys.readouterr().out


def test_a_damaged_artifacts_file_is_ignored_with_one_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    comp = CompileConfig(enabled=True, cache_dir=str(tmp_path))
    folder = tmp_path / device_key(CPU)
    folder.mkdir(parents=True)
    for i, junk in enumerate([b"\x00garbage", MAGIC + b"0" * 64 + b"\npayload", MAGIC[:5]]):
        (folder / f"d{i}.bin").write_bytes(junk)
        cache = open_compile_cache(comp, CPU, f"d{i}")
        assert cache.loaded == 0
        assert capsys.readouterr().out.count("is damaged (checksum or format); ignored, compiling cold") == 1


def test_nothing_compiled_writes_nothing(tmp_path):
    from torch.compiler._cache import CacheArtifactManager

    cache = CompileCache(tmp_path, tmp_path / "x.bin")
    torch.compiler.reset()
    CacheArtifactManager.clear()  # a process that compiled nothing (earlier tests in this one did)
    save_compile_cache(cache)
    save_compile_cache(cache, is_main=False)
    assert not list(tmp_path.iterdir())


def test_the_digest_follows_the_graph_not_the_run_length():
    base = load_config("gpt2-124m")
    assert graph_digest(base) == graph_digest(load_config("gpt2-124m", ["train.steps=7", "train.lr=1e-3",
                                                                        "compile.cache_dir='/x'"]))
    assert graph_digest(base) != graph_digest(load_config("gpt2-124m", ["model.args.n_layer=2"]))
    assert graph_digest(base) != graph_digest(load_config("gpt2-124m", ["data.batch_size=8"]))


def test_a_graph_with_the_weight_copies_is_kept_by_aot_autograds_cache(tmp_path, monkeypatch):
    """The weight copies' bias cast is a custom autograd.Function; torch's AOT-autograd cache bypasses such a graph
    unless told it may keep it, and a warm start would then re-trace forward and backward."""
    from torch._dynamo.utils import counters

    from turbotrain.accel import weight_copies as wc
    from turbotrain.models.gpt import build

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    import torch._functorch.config as config

    from turbotrain.accel import compile_cache as cc

    assert open_compile_cache(CompileConfig(enabled=True, cache_dir=str(tmp_path)), CPU, "wc") is not None
    assert config.autograd_cache_allow_custom_autograd_functions
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = build(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32)
    assert wc.apply_weight_copies(model, True) > 0
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.compile(model)(torch.randint(0, 64, (2, 16))).float().square().mean().backward()
        got = dict(counters["aot_autograd"])
    finally:
        torch._dynamo.reset()
        assert open_compile_cache(CompileConfig(enabled=False), CPU, "wc") is None  # puts the flag back
    assert got.get("autograd_cache_bypass", 0) == 0 and got.get("autograd_cache_saved", 0) == 1, got
    assert config.autograd_cache_allow_custom_autograd_functions == cc._flags[cc._AOT_FLAG]  # as the process had it
