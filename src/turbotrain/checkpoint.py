"""Checkpoints: every N steps, atomic, checksummed, last K kept; exact auto-resume.

Layout of `{run_dir}/checkpoints/step-00000120/`:
  state.pt            model, optimizer, LR scheduler, GradScaler (single process / DDP; written by rank 0)
  dcp/                the same, sharded through torch.distributed.checkpoint (FSDP2; every rank writes)
  rng-rank{r}.pt      torch CPU/CUDA generator states of rank r (tensors)
  rng-rank{r}.json    python and numpy generator states of rank r
  meta.json           step, world size, global batch, strategy, parameter shapes, and the manifest:
                      a sha256 for every file above. A checkpoint whose files disagree with it is skipped.

A checkpoint is written into a temp folder, fsynced, then renamed into place: a crash mid-write leaves
no half checkpoint under a valid name. Loading uses `torch.load(weights_only=True)` (no pickled code
runs) and JSON for the rest. The data position needs no state: the sampler is indexed by step.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from turbotrain.accel.compile import WithLoss
from turbotrain.errors import UserError
from turbotrain.files import sha256
from turbotrain.monitor.log import say


@dataclass
class CheckpointConfig:
    every: int = 0  # steps between checkpoints; 0 = off
    keep: int = 3  # newest checkpoints kept
    resume: str = "auto"  # "auto" (latest good one in the run dir) | "never" | a checkpoint folder

    def __post_init__(self) -> None:
        if self.every < 0:
            raise UserError(f"checkpoint.every = {self.every}: must be >= 0 (0 = off)")
        if self.keep < 1:
            raise UserError(f"checkpoint.keep = {self.keep}: must be >= 1")


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


def param_shapes(model: nn.Module) -> dict[str, list[int]]:
    """Global (unsharded) shapes: a checkpoint from another model is refused by name and shape."""
    return {name: list(p.size()) for name, p in _unwrap(model).named_parameters()}  # DTensor: the global size


def _rng_state() -> tuple[dict, dict]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    np_state = np.random.get_state()
    py_state = random.getstate()
    plain = {"numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
             "python": [py_state[0], list(py_state[1]), py_state[2]]}
    return tensors, plain


def _set_rng_state(tensors: dict, plain: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("cuda")]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    n = plain["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = plain["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


class Checkpointer:
    """Saves and restores the training state of one run. All ranks call `save`/`load` together."""

    def __init__(self, cfg: CheckpointConfig, run_dir: Path, rank: int, world_size: int, sharded: bool):
        self.cfg, self.dir = cfg, run_dir / "checkpoints"
        self.rank, self.world_size, self.sharded = rank, world_size, sharded

    # -------------------------------------------------------------- save
    def save(self, step: int, model: nn.Module, opt, sched, scaler, meta: dict) -> Path:
        final = self.dir / f"step-{step:08d}"
        tmp = self.dir / f".tmp-step-{step:08d}"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self._barrier()
        if self.sharded:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict

            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / "dcp"))
        if self.rank == 0:
            state = {"sched": sched.state_dict(), "scaler": scaler.state_dict()}
            if not self.sharded:
                state.update(model=_unwrap(model).state_dict(), optim=opt.state_dict())
            torch.save(state, tmp / "state.pt")
        tensors, plain = _rng_state()
        torch.save(tensors, tmp / f"rng-rank{self.rank}.pt")
        (tmp / f"rng-rank{self.rank}.json").write_text(json.dumps(plain))
        self._barrier()
        if self.rank == 0:
            files = sorted(p for p in tmp.rglob("*") if p.is_file())
            manifest = {str(p.relative_to(tmp)): sha256(p) for p in files}
            meta = {**meta, "step": step, "world_size": self.world_size, "sharded": self.sharded, "manifest": manifest}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            _fsync_tree(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)  # the atomic step: the checkpoint exists whole or not at all
            self._prune()
        self._barrier()
        return final

    def set_aside_old(self) -> None:
        """Move an earlier run's checkpoints to checkpoints.old-N (kept, never deleted)."""
        if not self.list():
            return
        n = 1
        while (dest := self.dir.with_name(f"checkpoints.old-{n}")).exists():
            n += 1
        os.replace(self.dir, dest)
        say(f"checkpoint: starting fresh; the earlier checkpoints were moved to {dest}")

    def _prune(self) -> None:
        for old in self.list()[:-self.cfg.keep]:
            shutil.rmtree(old, ignore_errors=True)

    # -------------------------------------------------------------- find and verify
    def list(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        return sorted(p for p in self.dir.iterdir() if p.is_dir() and p.name.startswith("step-"))

    @staticmethod
    def verify(path: Path) -> str | None:
        """None if every file matches the manifest, else what is wrong."""
        try:
            meta = json.loads((path / "meta.json").read_text())
            manifest = meta["manifest"]
        except (OSError, ValueError, KeyError) as e:
            return f"meta.json unreadable ({type(e).__name__})"
        for rel, digest in manifest.items():
            f = path / rel
            if not f.is_file():
                return f"{rel} missing"
            if sha256(f) != digest:
                return f"checksum mismatch in {rel}"
        return None

    def find_resume(self) -> Path | None:
        """The checkpoint to resume from per `checkpoint.resume`, or None to start fresh."""
        if self.cfg.resume == "never":
            return None
        if self.cfg.resume != "auto":
            path = Path(self.cfg.resume)
            if not path.is_dir():
                raise UserError(f"checkpoint.resume = {self.cfg.resume!r}: no such checkpoint folder")
            problem = self.verify(path)
            if problem:
                raise UserError(f"checkpoint.resume = {self.cfg.resume!r}: corrupt checkpoint ({problem})")
            return path
        for path in reversed(self.list()):
            problem = self.verify(path)
            if problem is None:
                return path
            say(f"warning: checkpoint {path.name} is corrupt ({problem}); trying the previous one")
        return None

    # -------------------------------------------------------------- load
    def load(self, path: Path, model: nn.Module, opt, sched, scaler, expect: dict) -> int:
        meta = json.loads((path / "meta.json").read_text())
        self._check_compatible(path, meta, expect)
        try:
            state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError) as e:
            raise UserError(f"checkpoint {path}: state.pt holds more than tensors and plain data; refusing to "
                            f"unpickle it ({type(e).__name__})") from None
        if meta["sharded"]:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

            msd, osd = get_state_dict(model, opt)
            sd = {"model": msd, "optim": osd}
            dcp.load(sd, checkpoint_id=str(path / "dcp"))  # reshards to this run's world size
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        else:
            _unwrap(model).load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
        scaler.load_state_dict(state["scaler"])
        rank_file = path / f"rng-rank{self.rank}.pt"
        if rank_file.exists():
            try:
                tensors = torch.load(rank_file, weights_only=True)
            except (pickle.UnpicklingError, RuntimeError) as e:
                raise UserError(f"checkpoint {path}: {rank_file.name} is not a plain tensor file ({type(e).__name__})") from None
            _set_rng_state(tensors, json.loads((path / f"rng-rank{self.rank}.json").read_text()))
        return int(meta["step"])

    def _check_compatible(self, path: Path, meta: dict, expect: dict) -> None:
        if meta.get("param_shapes") != expect["param_shapes"]:
            mine, theirs = expect["param_shapes"], meta.get("param_shapes") or {}
            diff = sorted(set(mine) ^ set(theirs)) or [k for k in mine if mine[k] != theirs.get(k)]
            raise UserError(f"checkpoint {path} was written by another model (differs at {diff[0]}); "
                            f"use another run.name or checkpoint.resume=\"never\"")
        if meta.get("global_batch") != expect["global_batch"]:
            raise UserError(
                f"checkpoint {path} was written with global batch {meta.get('global_batch')} (world size "
                f"{meta.get('world_size')}); this run has {expect['global_batch']} (world size {self.world_size}): "
                f"set data.batch_size x train.grad_accum x world size to match, or checkpoint.resume=\"never\"")
        # optimizer and GradScaler state carry over only to the same optimizer and the same loss scaling
        if "optimizer" in meta and meta["optimizer"] != expect["optimizer"]:
            raise UserError(f"checkpoint {path} holds {meta['optimizer']} state; this run asks for train.optimizer = "
                            f"{expect['optimizer']!r}: use {meta['optimizer']!r}, another run.name, or checkpoint.resume=\"never\"")
        if "dtype" in meta and (meta["dtype"] == "fp16") != (expect["dtype"] == "fp16"):
            raise UserError(f"checkpoint {path} was written with precision {meta['dtype']}, this run uses "
                            f"{expect['dtype']}: fp16's loss-scaler state does not carry over to or from another "
                            f"precision; keep the precision, or checkpoint.resume=\"never\"")
        if meta.get("sharded") and not self.sharded:
            raise UserError(f"checkpoint {path} is an FSDP (sharded) checkpoint: resume it with parallel.strategy=\"fsdp\"")
        if not meta.get("sharded") and self.sharded:
            raise UserError(f"checkpoint {path} is not sharded: resume it with parallel.strategy=\"ddp\" or \"none\"")

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()


def _unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DDP and the loss wrapper: checkpoints are the same for every strategy."""
    model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return model.model if isinstance(model, WithLoss) else model
