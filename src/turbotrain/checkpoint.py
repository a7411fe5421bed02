"""Checkpoints: every N steps, atomic, checksummed, last K kept; exact auto-resume.

Layout of `{run_dir}/checkpoints/step-00000120/`:
  state.pt            model, optimizer, LR scheduler, GradScaler (single process / DDP; written by rank 0)
  dcp/                the same, sharded through torch.distributed.checkpoint (FSDP2; every rank writes)
  rng-rank{r}.pt      torch CPU/CUDA generator states of rank r (tensors)
  rng-rank{r}.json    python and numpy generator states of rank r
  meta.json           step, world size, global batch, strategy, parameter shapes, the manifest (a sha256
                      for every file above; every file must be listed) and `meta_sha256`, a digest of
                      meta.json's own content (all but the manifest, which the files check). A checkpoint
                      that disagrees with it is skipped.

A checkpoint is written into a temp folder, fsynced, then renamed into place: a crash mid-write leaves
no half checkpoint under a valid name; a failed write (disk full) removes the temp folder and is one
user error. With `checkpoint.async_save` (sharded checkpoints) the DCP shards are staged to host memory
and written by a background thread; the small files are written at once, and the checkpoint is sealed
(manifest, rename) only once every rank's write has finished: at the next save (one save in flight at a
time), at the end of the run, or on a stop. A kill before then leaves only the temp folder.
Checkpoints are written only inside the run dir (no symlink out of it is followed).

Loading never runs pickled code: `torch.load(weights_only=True)` for state.pt, the RNG files and DCP's
byte items, a restricted unpickler (an allow-list of DCP's metadata classes) for `dcp/.metadata`, JSON for
the rest. Everything is read and validated (keys, shapes, types) before anything is applied, so a damaged
checkpoint leaves the model and optimizer untouched: under auto-resume it is skipped with a warning and
the previous good one is loaded; with an explicit `checkpoint.resume=PATH` it is one user error. A
checkpoint holding more than tensors and plain data (pickled code) is always a user error, never a
fallback. The data position needs no state: the sampler is indexed by step.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import pickle
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from turbotrain.accel.optim import keeping_kernel, load_optimizer_state
from turbotrain.errors import UserError
from turbotrain.files import path_arg, room_left, sha256
from turbotrain.log import say
from turbotrain.models.structure import unwrap
from turbotrain.rundir import moving_aside, write_fix


@dataclass
class CheckpointConfig:
    every: int = 0
    """Steps between checkpoints (0 = off)."""
    keep: int = 3
    """Newest checkpoints kept."""
    resume: str = "auto"
    """"auto" (the latest good one in the run directory) | "never" | a checkpoint folder."""
    final: bool = True
    """Write the trained model to final/ (safetensors + config) at the end, checkpoints or not."""
    async_save: bool = False
    """Sharded checkpoints (fsdp/hsdp/pipeline): copy the state to host memory and write it in a background
    thread while training goes on; sealed (manifest, renamed into place) at the next save, end or stop."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise UserError(f"checkpoint.every = {self.every}: must be >= 0 (0 = off)")
        if self.keep < 1:
            raise UserError(f"checkpoint.keep = {self.keep}: must be >= 1")
        if not self.resume.strip():  # Path("") is the current folder: the error would name "."
            raise UserError(f"checkpoint.resume = {self.resume!r}: expected \"auto\" (the run's latest), \"never\" "
                            "or a checkpoint folder (RUN/checkpoints/step-00001000)")
        if self.resume not in ("auto", "never"):
            self.resume = str(path_arg("checkpoint.resume", self.resume))  # "~/runs/..." as a shell reads it


class CorruptCheckpoint(Exception):
    """A damaged checkpoint (truncated, flipped, incomplete, inconsistent): skipped by auto-resume."""


class CodeInCheckpoint(Exception):
    """A checkpoint file holding more than tensors and plain data (pickled code): refused, never run."""


_STEP_DIR = re.compile(r"step-\d{8}")


def _fsync_tree(folder: Path) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def meta_digest(meta: dict) -> str:
    """sha256 of meta.json's content but the manifest (checked by the files themselves) and the digest."""
    body = {k: v for k, v in meta.items() if k not in ("manifest", "meta_sha256")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# the run facts `save` writes into meta.json (prepare.Run.save_checkpoint) and the kinds they have
_META_KINDS = {"global_batch": int, "optimizer": str, "dtype": str, "strategy": str, "config": str, "data": dict,
               "seed": int, "model_class": (str, type(None))}


def meta_problem(meta: dict) -> str | None:
    """What is wrong with meta.json's run facts, or None. The digest vouches only that meta.json is as written: a
    field of another kind (a hand edit resealed, another tool's file) would otherwise reach the resume's checks as
    a traceback, or as a config error naming run.seed for the checkpoint's seed."""
    shapes = meta.get("param_shapes", {})
    if not isinstance(shapes, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(type(n) is int and n >= 0 for n in v)
            for k, v in shapes.items()):
        return "meta.json: param_shapes is not a table of parameter names to shapes"
    for key, kind in _META_KINDS.items():
        if key in meta and (not isinstance(meta[key], kind) or isinstance(meta[key], bool)):
            shown = json.dumps(meta[key])[:40]
            return f"meta.json: {key} is {type(meta[key]).__name__} {shown}, not what a save writes"
    if "seed" in meta and not 0 <= meta["seed"] < 2**32:
        return f"meta.json: seed {meta['seed']} is out of the seed range (0 .. 2**32-1)"
    if type(meta.get("global_batch")) is int and meta["global_batch"] < 1:
        return f"meta.json: global_batch {meta['global_batch']} is not a batch size"
    return None


def param_shapes(model: nn.Module) -> dict[str, list[int]]:
    """Global (unsharded) shapes: a checkpoint from another model is refused by name and shape."""
    return {name: list(p.size()) for name, p in unwrap(model).named_parameters()}  # DTensor: the global size


def _rng_state() -> tuple[dict, dict]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    np_state = np.random.get_state()
    py_state = random.getstate()
    plain = {"numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
             "python": [py_state[0], list(py_state[1]), py_state[2]]}
    return tensors, plain


def _fsize_limited(inner: BaseException | None) -> bool:
    """A write that torch.save reports in its own words (`basic_ios::clear`, `unexpected pos`) under a finite
    file-size limit (`ulimit -f`): the limit is the likely cause, said as such."""
    import resource

    if inner is None or isinstance(inner, OSError):
        return False
    return resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY


@contextlib.contextmanager
def rng_kept(seed: int | None = None):
    """Code run inside draws from the global RNGs (torch's CPU and current CUDA device's, numpy's, Python's)
    without moving them: the training stream, which a checkpoint saves and a resume restores, is as if the block
    never ran. With `seed`, the CPU generators start from it inside (a data read's draws then depend on which
    batch it is, not on what ran before it)."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None
    t, np_state, py_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        if seed is not None:
            torch.default_generator.manual_seed(seed)
            np.random.seed(seed % 2**32)
            random.seed(seed)
        yield
    finally:
        torch.set_rng_state(t)
        np.random.set_state(np_state)
        random.setstate(py_state)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)


def _rng_tuples(tensors: dict, plain: dict) -> tuple:
    """Validated generator states (CorruptCheckpoint if not), checked on throwaway generators first."""
    try:
        t = tensors["torch"]
        if not (isinstance(t, torch.Tensor) and t.dtype == torch.uint8):
            raise TypeError("torch state is not a uint8 tensor")
        torch.Generator().set_state(t)
        n, p = plain["numpy"], plain["python"]
        np_state = (n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4])
        np.random.RandomState().set_state(np_state)
        py_state = (p[0], tuple(p[1]), p[2])
        random.Random().setstate(py_state)
        cuda = [tensors[k] for k in sorted(tensors) if k.startswith("cuda")]
        if not all(isinstance(c, torch.Tensor) and c.dtype == torch.uint8 for c in cuda):
            raise TypeError("cuda state is not a uint8 tensor")
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise CorruptCheckpoint(f"bad RNG state ({type(e).__name__}: {str(e)[:80]})") from None
    return t, cuda, np_state, py_state


def _set_rng_state(t, cuda, np_state, py_state) -> None:
    torch.set_rng_state(t)
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    np.random.set_state(np_state)
    random.setstate(py_state)


# ------------------------------------------------------------------ reading files without running code

_CODE_MARKERS = ("Unsupported global", "is blocked", "Can only create new object", "Unsupported class")


def _safe_torch_load(source, what: str):
    """torch.load(weights_only=True); a refused global is CodeInCheckpoint, any other failure (truncated,
    flipped, not a zip) is CorruptCheckpoint."""
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if any(m in str(e) for m in _CODE_MARKERS):
            raise CodeInCheckpoint(f"{what} holds more than tensors and plain data; refusing to unpickle it") from None
        raise CorruptCheckpoint(f"{what} is damaged (UnpicklingError)") from None
    except OSError as e:
        raise CorruptCheckpoint(f"{what} unreadable ({e.strerror or type(e).__name__})") from None
    except Exception as e:  # RuntimeError (zip: no central directory, CRC), EOFError, ValueError, ...
        return _raise_corrupt(what, e)


def _raise_corrupt(what: str, e: BaseException):
    first = (str(e).splitlines() or [""])[0][:80]
    detail = f"{type(e).__name__}: {first}" if first else type(e).__name__
    raise CorruptCheckpoint(f"{what} is truncated or damaged ({detail})") from None


def _dcp_metadata_globals() -> dict[tuple[str, str], Any]:
    """Every class a DCP `.metadata` pickle of a state dict holds (found by saving a real FSDP2 checkpoint)."""
    import builtins
    import collections
    import pathlib

    import torch.distributed.checkpoint.filesystem as fs
    import torch.distributed.checkpoint.metadata as md
    import torch.serialization

    allowed: dict[tuple[str, str], Any] = {}
    for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                 "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"):
        if hasattr(md, name):
            allowed[(md.__name__, name)] = getattr(md, name)
    allowed[(fs.__name__, "_StorageInfo")] = fs._StorageInfo
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    for cls in (pathlib.PosixPath, pathlib.PurePosixPath):
        allowed[("pathlib", cls.__name__)] = cls
        allowed[(cls.__module__, cls.__name__)] = cls
    allowed[("builtins", "set")], allowed[("builtins", "frozenset")] = builtins.set, builtins.frozenset
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata: only the allow-listed classes and torch dtypes; anything else is refused."""

    _allowed: dict | None = None

    def find_class(self, module: str, name: str):
        if _MetadataUnpickler._allowed is None:
            _MetadataUnpickler._allowed = _dcp_metadata_globals()
        if (module, name) in self._allowed:
            return self._allowed[(module, name)]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CodeInCheckpoint(f"dcp/.metadata names {module}.{name}, which is not checkpoint metadata; "
                               f"refusing to unpickle it")

    def persistent_load(self, pid):
        raise CodeInCheckpoint("dcp/.metadata holds a persistent id; refusing to unpickle it")


def load_dcp_metadata(stream) -> Any:
    """`dcp/.metadata` through the restricted unpickler, then checked: a Metadata whose storage entries name
    plain files of the dcp folder. CodeInCheckpoint or CorruptCheckpoint otherwise."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _MetadataUnpickler(stream).load()
    except CodeInCheckpoint:
        raise
    except Exception as e:  # EOFError, UnpicklingError (truncated), TypeError from a mangled REDUCE, ...
        _raise_corrupt("dcp/.metadata", e)
    if not isinstance(metadata, Metadata) or not isinstance(getattr(metadata, "storage_data", None), dict) \
            or not isinstance(getattr(metadata, "state_dict_metadata", None), dict):
        raise CorruptCheckpoint("dcp/.metadata is not DCP metadata")
    for info in metadata.storage_data.values():
        if not (isinstance(info, _StorageInfo) and isinstance(info.relative_path, str)
                and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", info.relative_path)
                and type(info.offset) is int and type(info.length) is int and info.offset >= 0 and info.length >= 0
                and not info.transform_descriptors):
            raise CorruptCheckpoint("dcp/.metadata has a bad storage entry")
    return metadata


def _safe_reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        """DCP's reader with `read_metadata` through the restricted unpickler (DCP's own uses pickle.load)."""

        refused: CodeInCheckpoint | None = None  # DCP re-wraps read_metadata's errors: kept here too

        def read_metadata(self, *args: Any, **kwargs: Any):
            with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
                try:
                    metadata = load_dcp_metadata(f)
                except CodeInCheckpoint as e:
                    self.refused = e
                    raise
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(str(path))


def _safe_planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        """DCP's planner loads byte items with torch.load(weights_only=False); here weights_only=True, and
        only the plain result (re-serialized by us) reaches the default code."""

        refused: CodeInCheckpoint | None = None

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            try:
                obj = _safe_torch_load(value, f"dcp item {read_item.dest_index.fqn}")
            except CodeInCheckpoint as e:
                self.refused = e
                raise
            clean = io.BytesIO()
            torch.save(obj, clean)
            clean.seek(0)
            super().load_bytes(read_item, clean)

    return SafeLoadPlanner()


# ------------------------------------------------------------------ validating state before it is applied

def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_like(template, got, where: str) -> None:
    """`got` has `template`'s structure: the same keys, tensors of the same shapes, plain values of the
    same kinds. CorruptCheckpoint naming the first difference."""
    if isinstance(template, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise CorruptCheckpoint(f"{where} is {type(got).__name__}, not a tensor")
        if tuple(got.shape) != tuple(template.shape):
            raise CorruptCheckpoint(f"{where} has shape {list(got.shape)}, the model needs {list(template.shape)}")
    elif isinstance(template, dict):
        if not isinstance(got, dict):
            raise CorruptCheckpoint(f"{where} is {type(got).__name__}, not a dict")
        missing, extra = set(template) - set(got), set(got) - set(template)
        if missing or extra:
            what = (f"lacks {sorted(map(str, missing))[0]}" if missing
                    else f"has an unexpected {sorted(map(str, extra))[0]}")
            raise CorruptCheckpoint(f"{where} {what}")
        for k in template:
            _check_like(template[k], got[k], f"{where}.{k}")
    elif isinstance(template, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(template):
            raise CorruptCheckpoint(f"{where} does not match (length or type)")
        for i, (a, b) in enumerate(zip(template, got)):
            _check_like(a, b, f"{where}[{i}]")
    elif _is_number(template):
        if not _is_number(got):
            raise CorruptCheckpoint(f"{where} is {type(got).__name__}, not a number")
    elif template is not None and got is not None and type(got) is not type(template):
        raise CorruptCheckpoint(f"{where} is {type(got).__name__}, not {type(template).__name__}")


def _check_optim(opt, got, where: str = "state.pt optim") -> None:
    """A torch optimizer state dict for this optimizer: same groups and parameter counts, state tensors
    of the parameters' shapes (scalars such as `step` aside)."""
    ref = opt.state_dict()
    if not isinstance(got, dict) or not isinstance(got.get("state"), dict) \
            or not isinstance(got.get("param_groups"), list):
        raise CorruptCheckpoint(f"{where} is not an optimizer state (state / param_groups)")
    if len(got["param_groups"]) != len(ref["param_groups"]):
        raise CorruptCheckpoint(f"{where} has {len(got['param_groups'])} parameter groups, the optimizer "
                                f"{len(ref['param_groups'])}")
    shape_of, needs = {}, {}
    for g_ref, g_got, g_live in zip(ref["param_groups"], got["param_groups"], opt.param_groups):
        if not isinstance(g_got, dict) or not isinstance(g_got.get("params"), list) \
                or len(g_got["params"]) != len(g_ref["params"]):
            raise CorruptCheckpoint(f"{where} parameter groups do not match the optimizer's")
        missing = set(g_ref) - set(g_got)
        if missing:
            raise CorruptCheckpoint(f"{where} parameter group lacks {sorted(missing)[0]}")
        for k in g_ref:
            if k != "params":
                _check_like(g_ref[k], g_got[k], f"{where} param_groups.{k}")
        for pid, p in zip(g_got["params"], g_live["params"]):
            shape_of[pid] = tuple(p.shape)
            needs[pid] = _adam_state_keys(opt, g_got)  # the saved group: torch loads its hyperparameters
    for pid, st in got["state"].items():
        if pid not in shape_of or not isinstance(st, dict):
            raise CorruptCheckpoint(f"{where} holds state for an unknown parameter {pid!r}")
        if st and needs[pid]:  # an empty state is a fresh one
            _check_adam_state(st, needs[pid], shape_of[pid], f"{where} state {pid}")
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0 and tuple(v.shape) != shape_of[pid]:
                raise CorruptCheckpoint(f"{where} state {pid}.{k} has shape {list(v.shape)}, the parameter "
                                        f"{list(shape_of[pid])}")
            if not isinstance(v, (torch.Tensor, int, float, bool)) and v is not None:
                raise CorruptCheckpoint(f"{where} state {pid}.{k} is {type(v).__name__}")


def _adam_state_keys(opt, group: dict) -> tuple[str, ...]:
    """The state entries torch's Adam/AdamW step reads from a parameter's non-empty state (TritonAdamW's too) under
    `group`'s hyperparameters; other optimizers (SGD: an absent momentum buffer is a fresh one; the user's) are not
    known here."""
    if not isinstance(opt, torch.optim.Adam | torch.optim.AdamW):
        return ()
    return ("step", "exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group.get("amsgrad") else ())


def _check_adam_state(st: dict, keys: tuple[str, ...], shape: tuple, where: str) -> None:
    """What torch's Adam step reads: a partial state stops it with a KeyError, a step count below 0 divides by a
    zero bias correction, a negative second moment's square root is NaN: the resumed weights would be NaN."""
    for k in keys:
        v = st.get(k)
        if k == "step":
            n = v.float().reshape(-1) if isinstance(v, torch.Tensor) else torch.tensor([v]) \
                if isinstance(v, int | float) and not isinstance(v, bool) else None
            if n is None or n.numel() != 1 or not bool(torch.isfinite(n).all()) or float(n) < 0:
                raise CorruptCheckpoint(f"{where}.step is not a step count (a finite number >= 0)")
        elif not isinstance(v, torch.Tensor) or tuple(v.shape) != shape:
            raise CorruptCheckpoint(f"{where} lacks {k} as a tensor of the parameter's shape {list(shape)}")
        elif k != "exp_avg" and v.numel() and float((torch.view_as_real(v) if v.is_complex() else v).min()) < 0:
            # squares' averages (a complex parameter's: of its real view); min allocates no mask
            raise CorruptCheckpoint(f"{where}.{k} holds negative values (a mean of squares)")


def _clone_tree(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone_tree(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_clone_tree(v) for v in obj)
    return obj


def _dcp_failure(e: BaseException) -> Exception:
    """The CodeInCheckpoint / CorruptCheckpoint inside DCP's CheckpointException (one per failing rank)."""
    failures = getattr(e, "failures", None)
    excs = []
    if isinstance(failures, dict):
        for v in failures.values():
            excs.append(v[0] if isinstance(v, tuple) else v)
    else:
        excs.append(e)
    for x in excs:
        if isinstance(x, CodeInCheckpoint):
            return x
        if isinstance(x, pickle.UnpicklingError) and any(m in str(x) for m in _CODE_MARKERS):  # a tensor item
            return CodeInCheckpoint("a dcp/*.distcp tensor item holds more than tensors; refusing to unpickle it")
    for x in excs:
        if isinstance(x, CorruptCheckpoint):
            return x
    x = excs[0] if excs else e
    first = (str(x).splitlines() or [""])[0][:100]
    return CorruptCheckpoint(f"dcp/ does not load ({type(x).__name__}{': ' + first if first else ''})")


# ------------------------------------------------------------------ the checkpointer

class Checkpointer:
    """Saves and restores the training state of one run. All ranks call `save`/`load` together."""

    def __init__(self, cfg: CheckpointConfig, run_dir: Path, rank: int, world_size: int, sharded: bool,
                 flat_optim: bool = False):
        """flat_optim: the optimizer's param groups keyed by parameter name in DCP (pipeline stages hold
        different parameters, so one shared param-groups entry would fit only one stage)."""
        self.cfg, self.dir = cfg, run_dir / "checkpoints"
        self.rank, self.world_size, self.sharded = rank, world_size, sharded
        self.flat_optim = flat_optim
        self.loaded: Path | None = None  # the checkpoint `load` restored (an older one after a fallback)
        self.loaded_meta: dict = {}  # its meta.json (the run facts `save` was given: seed, batch, optimizer, ...)
        self._pending: tuple | None = None  # the async save in flight: (step, final, tmp, meta, future)
        self._async_group = None  # the background write's own gloo group: its collectives never meet training's

    # -------------------------------------------------------------- save
    def save(self, step: int, model: nn.Module, opt, sched, scaler, meta: dict, wait: bool = True) -> Path:
        """Every rank writes its part into a temp folder; rank 0 seals it (manifest, fsync) and renames it
        into place. A write failure on any rank: the temp folder goes, earlier checkpoints stay, one error.
        wait=False with checkpoint.async_save (sharded): the shards are staged to host memory and written in the
        background; `finish` (the next save, the end of the run) seals them. A save in flight is sealed first."""
        self.finish()
        final = self.dir / f"step-{step:08d}"
        tmp = self.dir / f".tmp-step-{step:08d}"
        self._check_inside(final, tmp)
        failure: BaseException | None = None
        if self.rank == 0:
            try:
                self._clear_stale()  # a kill mid-write left them: their space is this save's
                tmp.mkdir(parents=True)
            except OSError as e:
                failure = e
        self._fail_together(failure, tmp)
        background = self.cfg.async_save and self.sharded and not wait
        written = self._write(tmp, model, opt, sched, scaler, background)
        failure = written if isinstance(written, BaseException) else None
        if background and not self._agree(1 if failure else 0):  # every rank's write is under way
            self._pending = (step, final, tmp, meta, written)
            return final
        if background and failure is None:  # another rank failed: this rank's write ends before the folder goes
            _failed_future(written, None)
        self._fail_together(failure, tmp)  # also the barrier: all written
        self._seal_together(tmp, final, step, meta)
        return final

    @property
    def in_flight(self) -> bool:
        """An async save is being written and is not sealed yet."""
        return self._pending is not None

    def finish(self) -> tuple[int, Path] | None:
        """Seal the save in flight, if any (all ranks together): wait for this rank's background write, agree
        that every rank's succeeded, then seal it as a synchronous save does; a failure removes the temp folder
        and is one UserError. Returns the sealed checkpoint's (step, folder)."""
        if self._pending is None:
            return None
        step, final, tmp, meta, future = self._pending
        self._pending = None
        failure: BaseException | None = None
        try:
            future.result()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # DCP's CheckpointException (a BaseException) wraps a rank's write error
            failure = e
        self._fail_together(failure, tmp)
        self._seal_together(tmp, final, step, meta)
        say(f"checkpoint: {final.name} written in the background; sealed")
        return step, final

    def _seal_together(self, tmp: Path, final: Path, step: int, meta: dict) -> None:
        failure = self._seal(tmp, final, step, meta) if self.rank == 0 else None
        self._fail_together(failure, tmp)
        if self.rank == 0:
            self._prune()
        self._barrier()

    def _write(self, tmp: Path, model: nn.Module, opt, sched, scaler, background: bool = False):
        """This rank's files (DCP shards, rank 0's state.pt, its RNG state); the failure, if any. background:
        the shards are staged to host memory here and written by a thread: returns the write's future."""
        future = None
        try:
            if self.sharded:
                import torch.distributed.checkpoint as dcp
                from torch.distributed.checkpoint.state_dict import get_state_dict

                msd, osd = get_state_dict(model, opt, options=self._sd_options())
                if background:
                    future = self._start_async_write({"model": msd, "optim": osd}, tmp / "dcp")
                else:
                    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / "dcp"))
            if self.rank == 0:
                state = {"sched": sched.state_dict(), "scaler": scaler.state_dict()}
                if not self.sharded:
                    state.update(model=unwrap(model).state_dict(), optim=opt.state_dict())
                torch.save(state, tmp / "state.pt")
            tensors, plain = _rng_state()
            torch.save(tensors, tmp / f"rng-rank{self.rank}.pt")
            (tmp / f"rng-rank{self.rank}.json").write_text(json.dumps(plain))
        except (OSError, RuntimeError) as e:
            return _failed_future(future, e) if future is not None else e
        except BaseException as e:  # DCP's CheckpointException (a BaseException) wraps a rank's write error
            if type(e).__name__ != "CheckpointException":
                raise
            return _failed_future(future, e) if future is not None else e
        return future

    def _start_async_write(self, state: dict, folder: Path):
        """`dcp.async_save`: the state is copied to host memory before it returns (training may then change
        the parameters), and written by a background thread whose collectives run on a gloo group of their own
        (async save needs a CPU backend; sharing training's group would interleave two threads' collectives)."""
        import torch.distributed.checkpoint as dcp

        if self._async_group is None and dist.is_initialized():
            self._async_group = dist.new_group(backend="gloo")
        response = dcp.async_save(state, checkpoint_id=str(folder), process_group=self._async_group)
        staged = getattr(response, "staging_completion", None)  # newer torch with an asynchronous stager
        if staged is not None:
            staged.result()
        return getattr(response, "upload_completion", response)

    def _seal(self, tmp: Path, final: Path, step: int, meta: dict) -> OSError | None:
        """Rank 0: manifest and meta digest, fsync, then the atomic rename (an earlier checkpoint of the same
        step is moved aside first and put back if the rename fails)."""
        old = self.dir / f".old-step-{step:08d}"
        try:
            files = sorted(p for p in tmp.rglob("*") if p.is_file())
            manifest = {p.relative_to(tmp).as_posix(): sha256(p) for p in files}
            meta = {**meta, "step": step, "world_size": self.world_size, "sharded": self.sharded}
            meta["meta_sha256"] = meta_digest(meta)
            meta["manifest"] = manifest
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            _fsync_tree(tmp)
            moved = False
            if final.exists():  # an earlier checkpoint of this step (a rerun after a fallback)
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
                moved = True
            os.replace(tmp, final)  # the atomic step: the checkpoint exists whole or not at all
            if moved:
                shutil.rmtree(old, ignore_errors=True)
        except OSError as e:
            if old.is_dir() and not final.exists():  # put the earlier checkpoint of this step back
                try:
                    os.replace(old, final)
                except OSError:
                    pass
            return e
        return None

    def _fail_together(self, failure: BaseException | None, tmp: Path) -> None:
        """All ranks learn whether any rank failed to write; then the temp folder goes and every rank raises."""
        if not self._agree(1 if failure is not None else 0):
            return
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(self._write_error(failure, tmp)) from None

    def _write_error(self, failure: BaseException | None, tmp: Path) -> str:
        if failure is None:
            reason = "another rank failed to write its part"
        else:
            inner = _dcp_inner(failure)
            if isinstance(inner, OSError) and inner.strerror:
                reason = inner.strerror + (f" [{errno.errorcode.get(inner.errno, inner.errno)}]" if inner.errno else "")
            else:
                reason = f"{type(inner).__name__}: {(str(inner).splitlines() or [''])[0][:120]}"
        inner = _dcp_inner(failure) if failure is not None else None
        # a per-process limit or a folder this run may not write (read-only mount, permissions): free space would
        # not help
        limit = isinstance(inner, OSError) and inner.errno in (errno.EFBIG, errno.EMFILE, errno.ENFILE, errno.EACCES,
                                                               errno.EPERM, errno.EROFS)
        if limit or _fsize_limited(inner):
            why = write_fix(inner) if limit else write_fix(OSError(errno.EFBIG, "File too large"))
            return f"checkpoint: cannot write {tmp} ({reason}); the earlier checkpoints are kept; {why}"
        free = room_left(self.dir)
        return (f"checkpoint: cannot write {tmp} ({reason}{free}); the earlier checkpoints are kept: free "
                f"{'files' if 'inodes' in free else 'space'} on that disk, set run.out_dir to another disk, or lower "
                "checkpoint.keep")

    def _check_inside(self, *step_dirs: Path) -> None:
        """Checkpoints are written only inside the run dir: a `checkpoints` folder or step folder that is a
        symlink to elsewhere is refused, not followed."""
        run = self.dir.parent.resolve()
        for p in (self.dir, *step_dirs):
            if p.is_symlink():
                target = p.resolve()
                if not target.is_relative_to(run):
                    raise UserError(f"checkpoint: {p} is a symlink to {target}, outside the run dir {run}; "
                                    f"checkpoints are written only inside the run dir: remove the link, or set "
                                    f"run.out_dir to the disk you want them on")
        if self.dir.exists() and not self.dir.resolve().is_relative_to(run):
            raise UserError(f"checkpoint: {self.dir} leads outside the run dir {run}; remove the link")

    def set_aside_old(self) -> None:
        """Move an earlier run's checkpoints to checkpoints.old-N (kept, never deleted)."""
        if not self.list():
            return
        dest = self._old_dir()
        with moving_aside("the earlier checkpoints", dest):
            os.replace(self.dir, dest)
        say(f"checkpoint: starting fresh; the earlier checkpoints were moved to {dest}")

    def _old_dir(self) -> Path:
        n = 1  # a free N: neither the folder nor its metrics beside it (see _set_aside_later) is there
        while any(os.path.lexists(self.dir.with_name(f"checkpoints.old-{n}{end}")) for end in ("", ".metrics.jsonl")):
            n += 1
        return self.dir.with_name(f"checkpoints.old-{n}")

    def _set_aside_later(self, step: int) -> None:
        """The checkpoints past the one resumed from — damaged ones fallen back past, or another timeline's (a
        resume from an earlier step, or from another run's checkpoint) — moved to checkpoints.old-N: kept, but
        never resumed by "auto" nor counted by checkpoint.keep, which would delete the new ones in their favour."""
        later = [p for p in self.list() if int(p.name.removeprefix("step-")) > step]
        if not later:
            return
        dest = self._old_dir()
        with moving_aside(f"the checkpoints past step {step}", dest):
            dest.mkdir()
            for p in later:
                os.replace(p, dest / p.name)
            # the resume trims metrics.jsonl's rows past `step`: the curve of the timeline left is kept beside its
            # checkpoints (outside their folder, which holds checkpoints only)
            metrics, kept = self.dir.parent / "metrics.jsonl", dest.with_name(f"{dest.name}.metrics.jsonl")
            if metrics.is_file() and not metrics.is_symlink():
                shutil.copyfile(metrics, kept)
        say(f"checkpoint: resuming from step {step}; the {len(later)} later checkpoint(s) ({later[0].name} ...) were "
            f"moved to {dest}" + (f", that timeline's metrics to {kept.name}" if kept.is_file() else ""))

    @property
    def from_elsewhere(self) -> bool:
        """The run resumed from a checkpoint of another run directory (checkpoint.resume=PATH)."""
        return self.loaded is not None and not self.loaded.resolve().is_relative_to(self.dir.resolve())

    def _prune(self) -> None:
        # only whole checkpoints count (a stray empty step folder is not one, and must not push a good one out)
        for old in [p for p in self.list() if (p / "meta.json").is_file()][:-self.cfg.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def _clear_stale(self) -> None:
        """Temp folders of saves a kill cut short: never a checkpoint, only space (none is in flight here: `save`
        sealed the last one first)."""
        for stale in self.dir.glob(".tmp-step-*"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)

    # -------------------------------------------------------------- find and verify
    def list(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        return sorted(p for p in self.dir.iterdir()
                      if _STEP_DIR.fullmatch(p.name) and p.is_dir() and not p.is_symlink())

    @staticmethod
    def verify(path: Path) -> str | None:
        """None if meta.json is intact and every file matches the manifest (which lists every file and
        every file a checkpoint must have), else what is wrong."""
        try:
            meta = json.loads((path / "meta.json").read_text())
            manifest = meta["manifest"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"meta.json unreadable ({type(e).__name__})"
        if not isinstance(manifest, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in manifest.items()):
            return "meta.json: the manifest is not a file -> sha256 table"
        if "meta_sha256" not in meta:
            return "meta.json has no meta_sha256 (damaged, or written by an older turbotrain)"
        if meta["meta_sha256"] != meta_digest(meta):
            return "meta.json does not match its meta_sha256 (damaged)"
        step, world, sharded = meta.get("step"), meta.get("world_size"), meta.get("sharded")
        if type(step) is not int or step < 0 or type(world) is not int or world < 1 or type(sharded) is not bool:
            return "meta.json: bad step, world_size or sharded"
        if _STEP_DIR.fullmatch(path.name) and path.name != f"step-{step:08d}":
            return f"meta.json says step {step}, the folder is {path.name}"
        if problem := meta_problem(meta):
            return problem
        for rel in manifest:
            parts = Path(rel).parts
            if not parts or Path(rel).is_absolute() or ".." in parts or rel == "meta.json":
                return f"meta.json: bad manifest entry {rel!r}"
        required = {"state.pt", *(f"rng-rank{r}.{ext}" for r in range(world) for ext in ("pt", "json"))}
        if sharded:
            required.add("dcp/.metadata")
            if not any(rel.startswith("dcp/") and rel.endswith(".distcp") for rel in manifest):
                return "the manifest lists no dcp/*.distcp file"
        for rel in sorted(required - set(manifest)):
            return f"the manifest does not list {rel}"
        for f in sorted(path.rglob("*")):
            rel = f.relative_to(path).as_posix()
            if f.is_symlink():
                return f"{rel} is a symlink"
            if f.is_file() and rel != "meta.json" and rel not in manifest:
                return f"{rel} is not in the manifest"
        for rel, digest in manifest.items():
            f = path / rel
            if not f.is_file():
                return f"{rel} missing"
            if sha256(f) != digest:
                return f"checksum mismatch in {rel}"
        return None

    def find_resume(self) -> Path | None:
        """The checkpoint to resume from per `checkpoint.resume`, or None to start fresh."""
        if self.cfg.every:
            self._check_inside()
        if self.cfg.resume == "never":
            return None
        if self.cfg.resume != "auto":
            path, key = Path(self.cfg.resume), f"checkpoint.resume = {self.cfg.resume!r}"
            if not path.is_dir() or not (path / "meta.json").exists():  # a run's folder, say, or a typo
                raise UserError(f"{key}: {_not_a_checkpoint(path)}, or \"auto\" (the run's latest)")
            problem = self.verify(path)
            if problem:
                raise UserError(f"{key}: corrupt checkpoint ({problem}); name another checkpoint folder, or \"auto\"")
            return path
        for path in reversed(self.list()):
            problem = self.verify(path)
            if problem is None:
                return path
            say(f"warning: checkpoint {path.name} is corrupt ({problem}); trying the previous one")
        return None

    # -------------------------------------------------------------- load
    def load(self, path: Path, model: nn.Module, opt, sched, scaler, expect: dict) -> int:
        """Restore `path` and return its step. A damaged checkpoint changes nothing: under auto-resume the
        previous good one is loaded instead (see `self.loaded`), and when none is left the run starts fresh
        (step 0, the checkpoints set aside); with checkpoint.resume=PATH it is a UserError."""
        path = Path(path)
        explicit = self.cfg.resume not in ("auto", "never")
        older = [] if explicit else [p for p in reversed(self.list()) if p.name < path.name]
        for i, candidate in enumerate([path, *older]):
            if i > 0:
                problem = self.verify(candidate)
                if self._agree(1 if problem else 0):
                    say(f"warning: checkpoint {candidate.name} is corrupt ({problem or 'on another rank'}); "
                        f"trying the previous one")
                    continue
            try:
                meta = self._load_one(candidate, model, opt, sched, scaler, expect)
            except CorruptCheckpoint as e:
                if explicit:
                    raise UserError(f"checkpoint.resume = {self.cfg.resume!r}: corrupt checkpoint ({e}); pick "
                                    f"another checkpoint, or checkpoint.resume=\"never\"") from None
                say(f"warning: checkpoint {candidate.name} is corrupt ({e}); trying the previous one")
                continue
            self.loaded, self.loaded_meta = candidate, meta
            if self.rank == 0 and not self.from_elsewhere:  # from elsewhere, the whole earlier run is set aside
                self._set_aside_later(int(meta["step"]))
            self._barrier()
            return int(meta["step"])
        say("warning: no good checkpoint left to resume from; starting fresh")
        if self.rank == 0:
            self.set_aside_old()
        self._barrier()
        self.loaded = None
        return 0

    def _load_one(self, path: Path, model: nn.Module, opt, sched, scaler, expect: dict) -> dict:
        """Read and validate everything, agree over ranks, then apply; the checkpoint's meta.
        CorruptCheckpoint / UserError."""
        rng = None
        with self._together(path):
            meta = self._read_meta(path)
            self._check_compatible(path, meta, expect)
            state = self._read_torch(path, "state.pt")
            if not isinstance(state, dict):
                raise CorruptCheckpoint("state.pt is not a dict")
            need = ["sched", "scaler"] + ([] if meta["sharded"] else ["model", "optim"])
            for key in need:
                if key not in state:
                    raise CorruptCheckpoint(f"state.pt lacks {key!r}")
            if not meta["sharded"]:
                _check_like(unwrap(model).state_dict(), state["model"], "state.pt model")
                _check_optim(opt, state["optim"])
            _check_like(sched.state_dict(), state["sched"], "state.pt sched")
            _check_like(scaler.state_dict(), state["scaler"], "state.pt scaler")
            if (path / f"rng-rank{self.rank}.pt").exists() or meta["world_size"] == self.world_size:
                tensors = self._read_torch(path, f"rng-rank{self.rank}.pt")
                try:
                    plain = json.loads((path / f"rng-rank{self.rank}.json").read_text())
                except (OSError, ValueError) as e:
                    raise CorruptCheckpoint(f"rng-rank{self.rank}.json unreadable ({type(e).__name__})") from None
                if not isinstance(tensors, dict) or not isinstance(plain, dict):
                    raise CorruptCheckpoint(f"rng-rank{self.rank} files hold no generator states")
                rng = _rng_tuples(tensors, plain)
        if meta["sharded"]:
            sd = self._load_dcp(path, model, opt)
        # ---- everything is read and valid on every rank: apply (nothing above touched the model)
        if meta["sharded"]:
            from torch.distributed.checkpoint.state_dict import set_state_dict

            with keeping_kernel(opt):  # as load_optimizer_state: the saved groups' kernel flags are not this run's
                set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"],
                               options=self._sd_options())
        else:
            unwrap(model).load_state_dict(state["model"])
            load_optimizer_state(opt, state["optim"])
        sched.load_state_dict(state["sched"])
        scaler.load_state_dict(state["scaler"])
        if rng is not None:
            _set_rng_state(*rng)
        return meta

    def _sd_options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(flatten_optimizer_state_dict=self.flat_optim)

    def _load_dcp(self, path: Path, model: nn.Module, opt) -> dict:
        """The sharded state read into copies (resharded to this run's world size) and checked against
        the live state's structure; the model and optimizer are not touched here."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        with self._together(path):
            msd, osd = get_state_dict(model, opt, options=self._sd_options())
            template = {"model": msd, "optim": osd}
            sd = _clone_tree(template)  # the live state dicts share storage with the parameters
            reader, planner = _safe_reader(path / "dcp"), _safe_planner()
            try:
                dcp.load(sd, storage_reader=reader, planner=planner)
            except (CodeInCheckpoint, CorruptCheckpoint):
                raise
            except BaseException as e:  # CheckpointException (BaseException): one wrapped error per rank
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                raise (reader.refused or planner.refused or _dcp_failure(e)) from None
            _check_like(template, sd, "dcp")
        return sd

    def _together(self, path: Path):
        """A block whose CorruptCheckpoint / CodeInCheckpoint / UserError every rank learns of (max over
        ranks), so that no rank goes on into a collective alone; each rank raises."""
        ckpt = self

        class _Block:
            def __enter__(self):
                return self

            def __exit__(self, typ, exc, tb):
                if exc is not None and not isinstance(exc, (CorruptCheckpoint, CodeInCheckpoint, UserError)):
                    return False  # a bug: let it through as it is
                code = 0 if exc is None else 1 if isinstance(exc, CorruptCheckpoint) else 2
                code = ckpt._agree(code)
                if code == 0:
                    return False
                if code == 2:
                    if isinstance(exc, CodeInCheckpoint):
                        raise UserError(f"checkpoint {path}: {exc} (pickled code is never run; delete this "
                                        f"checkpoint or set checkpoint.resume=\"never\")") from None
                    if isinstance(exc, UserError):
                        return False
                    raise UserError(f"checkpoint {path}: refused on another rank (see its error line)") from None
                if isinstance(exc, CorruptCheckpoint):
                    return False
                raise CorruptCheckpoint("damaged on another rank")

        return _Block()

    def _read_meta(self, path: Path) -> dict:
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError) as e:
            raise CorruptCheckpoint(f"meta.json unreadable ({type(e).__name__})") from None
        if not isinstance(meta, dict) or meta.get("meta_sha256") != meta_digest(meta) \
                or type(meta.get("step")) is not int or type(meta.get("sharded")) is not bool:
            raise CorruptCheckpoint("meta.json does not match its meta_sha256 (damaged)")
        if problem := meta_problem(meta):
            raise CorruptCheckpoint(problem)
        return meta

    def _read_torch(self, path: Path, name: str):
        f = path / name
        if not f.is_file():
            raise CorruptCheckpoint(f"{name} missing")
        return _safe_torch_load(f, name)

    def _check_compatible(self, path: Path, meta: dict, expect: dict) -> None:
        if meta.get("param_shapes") != expect["param_shapes"]:
            mine, theirs = expect["param_shapes"], meta.get("param_shapes") or {}
            diff = sorted(set(mine) ^ set(theirs)) or [k for k in mine if mine[k] != theirs.get(k)]
            raise UserError(f"checkpoint {path} was written by another model (differs at {diff[0]}); "
                            f"use another run.name or checkpoint.resume=\"never\"")
        if "model" in expect and (change := _model_change(meta.get("config"), expect["model"])):
            raise UserError(f"checkpoint {path} was written with {change}: its weights are read under the model they "
                            f"were trained as; keep the checkpoint's value, use another run.name, or "
                            f"checkpoint.resume=\"never\"")
        if meta.get("global_batch") != expect["global_batch"]:
            raise UserError(
                f"checkpoint {path} was written with global batch {meta.get('global_batch')} (world size "
                f"{meta.get('world_size')}); this run has {expect['global_batch']} (world size {self.world_size}): "
                f"set data.batch_size x train.grad_accum x world size to match, or checkpoint.resume=\"never\"")
        # optimizer and GradScaler state carry over only to the same optimizer and the same loss scaling
        if "optimizer" in meta and meta["optimizer"] != expect["optimizer"]:
            raise UserError(f"checkpoint {path} holds {meta['optimizer']} state; this run asks for train.optimizer = "
                            f"{expect['optimizer']!r}: use {meta['optimizer']!r}, another run.name, "
                            "or checkpoint.resume=\"never\"")
        if "dtype" in meta and (meta["dtype"] == "fp16") != (expect["dtype"] == "fp16"):
            raise UserError(f"checkpoint {path} was written with precision {meta['dtype']}, this run uses "
                            f"{expect['dtype']}: fp16's loss-scaler state does not carry over to or from another "
                            f"precision; keep the precision, or checkpoint.resume=\"never\"")
        # three layouts: whole (none/ddp), FSDP2 shards (fsdp/hsdp), pipeline stages (DCP with the optimizer
        # state keyed by parameter name); each loads only into its own, at any world size
        theirs, mine = _layout(meta.get("sharded"), meta.get("strategy")), _layout(self.sharded, expect.get("strategy"))
        if theirs != mine:
            raise UserError(f"checkpoint {path} holds {LAYOUTS[theirs][0]}; this run is {LAYOUTS[mine][0]}: resume it "
                            f"with {LAYOUTS[theirs][1]} (at any world size), or checkpoint.resume=\"never\"")

    def _agree(self, code: int) -> int:
        return agree(code)

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()


def _model_change(config: Any, model: dict) -> str | None:
    """The first model.name / model.args setting of the checkpoint's config (TOML) that this run's `model`
    ({"name", "args"}) changes, said as "model.args.n_head = 2; this run has 4", else None. Shapes alone miss a
    change that keeps them (heads, RoPE base, norm epsilon, an activation): the weights would be read under another
    model. Dropout may change (it is no part of the weights' meaning); a config that does not parse says nothing."""
    import tomllib

    try:
        old = tomllib.loads(config).get("model", {}) if isinstance(config, str) else None
    except tomllib.TOMLDecodeError:
        old = None
    if not isinstance(old, dict):
        return None
    if old.get("name") != model["name"]:
        return f"model.name = {old.get('name')!r}; this run has {model['name']!r}"
    was, now = old.get("args") or {}, json.loads(json.dumps(model["args"] or {}, default=str))  # as TOML holds them
    if not isinstance(was, dict):  # `args = [...]`: no model was built from that
        return f"model.args = {was!r:.60}; this run has {now!r:.60}"
    for k in sorted(set(was) | set(now), key=str):
        if "dropout" not in str(k) and was.get(k) != now.get(k):
            return (f"model.args.{k} = {was.get(k, 'unset')!r}; this run has {now.get(k, 'unset')!r}")
    return None


def _not_a_checkpoint(path: Path) -> str:
    """What `path` (not a checkpoint folder) is, and the checkpoint folder the user likely meant: the run's, the
    checkpoints folder's or the final/ folder's run's latest, or the checkpoint a file named lies in."""
    if path.is_file() and (path.parent / "meta.json").is_file():
        return f"a file inside a checkpoint; name its folder: {path.parent}"
    final = path.is_dir() and (path / "final.json").is_file()
    near = [path, path / "checkpoints", path.parent, path.parent / "checkpoints"]
    steps = [p for d in near for p in sorted(d.glob("step-*")) if _STEP_DIR.fullmatch(p.name) and p.is_dir()]
    what = ("a final/ model folder (weights only: no optimizer, LR schedule or step to resume)" if final else
            "not a checkpoint folder (no meta.json)" if path.is_dir() else
            "no such folder (a file is there)" if path.exists() else "no such folder")
    return f"{what}; name a checkpoint folder, e.g. {steps[-1] if steps else 'RUN/checkpoints/step-00001000'}"


def agree(code: int) -> int:
    """The largest `code` over all ranks (a collective; the identity in one process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return code
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    t = torch.tensor([code], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _failed_future(future, e: BaseException):
    """A later file of an async save failed: wait out the background write (its folder is about to be removed),
    then report `e`."""
    try:
        future.result()
    except BaseException as inner:  # the write's own failure does not matter any more
        if isinstance(inner, (KeyboardInterrupt, SystemExit)):
            raise
    return e


LAYOUTS = {  # a checkpoint layout: (what it holds, the strategies that load it)
    "whole": ("the whole model (parallel.strategy \"none\"/\"ddp\")", 'parallel.strategy="ddp" or "none"'),
    "fsdp": ("FSDP2 shards (parallel.strategy \"fsdp\"/\"hsdp\")", 'parallel.strategy="fsdp" or "hsdp"'),
    "pipeline": ("pipeline stages (parallel.strategy \"pipeline\")", 'parallel.strategy="pipeline"'),
}


def _layout(sharded, strategy) -> str:
    """A checkpoint's (or a run's) layout; a strategy missing from older metadata counts by `sharded` alone."""
    if strategy == "pipeline":
        return "pipeline"
    return "fsdp" if sharded else "whole"


def _dcp_inner(e: BaseException) -> BaseException:
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        v = next(iter(failures.values()))
        return v[0] if isinstance(v, tuple) else v
    return e
