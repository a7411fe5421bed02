"""Neutral helpers that the trainer, `profile` and the peer comparator share: the device, seeding, the
first batch, what a dataset tells the model factory, peak memory and device syncs."""
from __future__ import annotations

import numbers
import random
import resource
import sys

import numpy as np
import torch
from torch.utils.data import Dataset

from turbotrain.errors import UserError


def resolve_device(name: str) -> torch.device:
    """`run.device` → a torch device ("auto": the GPU when there is one)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"run.device = {name!r}: CUDA is not available here; use run.device=\"cpu\" or \"auto\"")
    device = torch.device(name)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"run.device = {name!r}: only {torch.cuda.device_count()} GPU(s) visible")
    return device


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def data_meta(ds: Dataset) -> dict:
    """What a dataset tells the model factory (used only for args the config leaves out)."""
    keys = ("vocab_size", "block_size", "num_classes", "in_channels", "in_features")
    meta = {k: getattr(ds, k) for k in keys if getattr(ds, k, None) is not None}
    for k, v in meta.items():  # a size: else the model factory fails on it, and the message would blame the model
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 1 <= v <= 2**40:
            raise UserError(f"the dataset's attribute {k} = {v!r:.60} (turbotrain passes it to the model factory "
                            f"as model.args.{k} when the config leaves that out) must be a positive integer; fix "
                            f"the dataset, or set model.args.{k}")
    return {k: int(v) for k, v in meta.items()}


def peak_mem_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB; the process's peak RSS
    return kib / 2**20 if sys.platform != "darwin" else kib / 2**30


def sync(device: torch.device) -> None:
    """Wait for the device: before reading a clock or a value."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
