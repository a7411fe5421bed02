"""Compile caches kept in turbotrain's cache folder, so a second run — or a fresh node handed a copy of the
folder — compiles warm.

    <cache>/compile/<torch + device>/inductor/   inductor's on-disk caches (FX graphs, AOT autograd, autotuning)
                                    /triton/     Triton's compiled kernels
                                    /<digest>.bin  torch's portable "mega-cache" of one graph-shaping config

The folder is keyed by torch version and device only, not by the config: inductor keys its own entries by
graph, so every config on one (torch, GPU) shares it, and a different torch or GPU never reads foreign
kernels. The .bin (`torch.compiler.save_cache_artifacts`, torch >= 2.7) is saved after the compiling step
and loaded before anything compiles; it is what makes a copied folder enough even where inductor's own
layout would not be found (its entries are re-populated into this machine's inductor folder). Files are
written atomically and checksummed: a damaged .bin is ignored with one warning, and the run compiles cold.

Usage: `cache = open_compile_cache(cfg.compile, device, graph_digest(cfg))` before the model is compiled,
`save_compile_cache(cache)` after the first (compiling) step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from turbotrain.accel.compile import CompileConfig
from turbotrain.files import cache_root, path_arg
from turbotrain.log import say

MAGIC = b"turbotrain-compile-cache 1\n"  # then the payload's sha256 (hex) and a newline, then the payload
# sections whose values change the compiled graphs; the rest (steps, lr, logging, paths) does not
GRAPH_SECTIONS = ("model", "compile", "precision", "memory", "parallel", "kernels")
_ours: set[str] = set()  # env values this process set, told apart from a user's own TORCHINDUCTOR_CACHE_DIR
_AOT_FLAG = "autograd_cache_allow_custom_autograd_functions"
_flags: dict[str, bool] = {}  # torch config flags as this process found them
_before: dict[str, str | None] = {}  # each variable's value before this process first pointed it: put back when a
# later run in the process (the Python API) has the cache off or unusable, which would else keep writing to ours


@dataclass
class CompileCache:
    """Where this run's compile caches live and what the start found there."""

    folder: Path  # <cache>/compile/<key>
    artifacts: Path  # <folder>/<digest>.bin
    loaded: int = 0  # mega-cache artifacts loaded at start (0: a cold start)

    def info(self) -> dict:
        return {"dir": str(self.folder), "artifacts_file": self.artifacts.name, "warm_artifacts": self.loaded}


def device_key(device: torch.device) -> str:
    """torch version + GPU name and compute capability ("cpu" on a CPU), safe as a folder name."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        where = f"{torch.cuda.get_device_name(device)}-sm{major}{minor}"
    else:
        where = device.type
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", f"torch-{torch.__version__}-{where}")


def graph_digest(cfg) -> str:
    """A short digest of the config sections that shape the compiled graphs, plus the micro-batch and the
    loss: it picks which .bin a run loads (a wrong pick only costs a cold compile, never a wrong kernel)."""
    parts = {s: dataclasses.asdict(getattr(cfg, s)) for s in GRAPH_SECTIONS}
    parts["compile"] = {k: v for k, v in parts["compile"].items() if k not in ("cache", "cache_dir")}
    parts["batch"] = {"micro": cfg.data.batch_size, "loss": cfg.train.loss, "data": cfg.data.name}
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_folder(comp: CompileConfig, device: torch.device) -> Path | None:
    """<cache>/compile/<torch + device>, or None when compile.cache is off."""
    if not comp.cache:
        return None
    # absolute: inductor reads the variable at each use, and code that changes folder must not move the cache
    base = path_arg("compile.cache_dir", comp.cache_dir).absolute() if comp.cache_dir else cache_root() / "compile"
    return base / device_key(device)


def open_compile_cache(comp: CompileConfig, device: torch.device, digest: str) -> CompileCache | None:
    """Point inductor's and Triton's caches into the cache folder and load the .bin of this config, if
    any. Call before anything compiles. None when compile or its cache is off (torch's defaults stay)."""
    folder = cache_folder(comp, device)
    if folder is None or not comp.enabled or comp.backend != "inductor":
        _unpoint()
        return None
    problem = _unwritable(folder)
    if problem:
        say(f"warning: compile cache {problem[0]} cannot be made ({problem[1]}); torch's default caches instead (set "
            f"compile.cache_dir to a writable folder)")
        _unpoint()
        return None
    _point_env("TORCHINDUCTOR_CACHE_DIR", folder / "inductor")
    _point_env("TRITON_CACHE_DIR", folder / "triton")
    _allow_autograd_functions(True)
    cache = CompileCache(folder, folder / f"{digest}.bin")
    cache.loaded = _load(cache.artifacts)
    if not cache.loaded:
        say(f"compile: cold start; caches in {folder}")
    return cache


def _unwritable(folder: Path) -> tuple[Path, str] | None:
    """(the folder, why) where inductor or Triton could not write their caches in `folder` (a file where a folder
    goes, a read-only filesystem), or None: inductor creates its folder at each use, and a compile failing on it
    would fall back to eager for the sake of a cache."""
    import tempfile

    for sub in (folder, folder / "inductor", folder / "triton"):
        try:
            sub.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=sub):
                pass
        except OSError as e:
            return sub, str(e.strerror or e)
    return None


def _allow_autograd_functions(on: bool) -> None:
    """AOT autograd's cache takes graphs holding a custom autograd.Function (torch's flag, off by default). Its
    forward and backward are traced into the graph, so the cache key holds their ops; without it a graph with one
    (the weight copies' bias cast, models/structure.py) bypasses that cache, and a warm start re-traces forward and
    backward. `on=False` puts back the value this process found."""
    import torch._functorch.config as config

    if not hasattr(config, _AOT_FLAG):  # an older torch
        return
    _flags.setdefault(_AOT_FLAG, getattr(config, _AOT_FLAG))
    setattr(config, _AOT_FLAG, True if on else _flags[_AOT_FLAG])


def _unpoint() -> None:
    """Put back the variables this process pointed at a compile cache, where they still point there."""
    _allow_autograd_functions(False)
    for var, value in _before.items():
        if os.environ.get(var) in _ours:
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _point_env(var: str, path: Path) -> None:
    """Read by torch and Triton at each use, and handed to inductor's compile workers at each job, so
    setting it before the first compile is enough. A user's own setting wins."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    now = os.environ.get(var)
    if now is not None and now not in _ours and now != default_cache_dir():
        say(f"compile: keeping {var}={now} (set in the environment)")
        return
    _before.setdefault(var, now)
    os.environ[var] = str(path)
    _ours.add(str(path))


def _load(path: Path) -> int:
    """Artifacts loaded from the .bin (0 when there is none, or it is damaged: compiled cold then)."""
    if not path.is_file():
        return 0
    try:
        payload = _verified(path.read_bytes())
        with _quiet_torch_cache_log():  # torch logs a traceback for an unreadable payload; ours is one line
            info = torch.compiler.load_cache_artifacts(payload) if payload is not None else None
    except Exception as e:  # torch's loader on a file from another torch: a cold compile, never a crash
        say(f"warning: compile cache {path} could not be loaded ({type(e).__name__}: {e}); compiling cold")
        return 0
    if info is None:
        say(f"warning: compile cache {path} is damaged (checksum or format); ignored, compiling cold")
        return 0
    n = sum(len(v) for v in info.artifacts.values())
    say(f"compile: warm start from {path} ({n} artifacts)")
    return n


@contextlib.contextmanager
def _quiet_torch_cache_log():
    logger = logging.getLogger("torch.compiler._cache")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _verified(data: bytes) -> bytes | None:
    if not data.startswith(MAGIC):
        return None
    head, sep, payload = data[len(MAGIC):].partition(b"\n")
    if not sep or hashlib.sha256(payload).hexdigest().encode() != head:
        return None
    return payload


def save_compile_cache(cache: CompileCache | None, is_main: bool = True) -> float:
    """Write this process's compile artifacts into the .bin (atomically; only when they changed). Returns
    the seconds it took, to keep out of the step timings. One writer: the main rank (all ranks compile
    the same graphs)."""
    if cache is None or not is_main:
        return 0.0
    t0 = time.perf_counter()
    try:
        got = torch.compiler.save_cache_artifacts()
    except Exception as e:  # a serialisation problem costs the next run its warm start, not this run
        say(f"warning: compile cache not saved ({type(e).__name__}: {e})")
        return time.perf_counter() - t0
    if got is None or not got[0]:
        return time.perf_counter() - t0
    payload = got[0]
    data = MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    tmp = cache.artifacts.with_name(f".{cache.artifacts.name}.{os.getpid()}.tmp")
    try:
        if cache.artifacts.is_file() and cache.artifacts.read_bytes() == data:
            return time.perf_counter() - t0
        tmp.write_bytes(data)
        os.replace(tmp, cache.artifacts)  # readers see the old file or the new one, never half of one
    except OSError as e:
        say(f"warning: compile cache {cache.artifacts} not written ({e.strerror})")
    finally:  # a full disk or a Ctrl-C mid-write leaves no half-written file behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return time.perf_counter() - t0

