"""Feeding the device: a step-indexed sampler, the DataLoader settings, device-resident data and an
asynchronous host→device prefetch. Data-wait time (host blocked waiting for a batch) is measured here.

Sampling is by global step, not by epoch position: step k consumes samples perm[k·G : (k+1)·G] of its
epoch's permutation (G = micro-batch × grad_accum × world size), dealt to micro-steps and ranks. So the
samples of step k are the same whatever the world size or micro-batch split, and resuming at step k
needs nothing but k.
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import multiprocessing.connection
import os
import signal
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal

import torch
from torch.utils.data import DataLoader, Dataset, default_collate
from torch.utils.data._utils import signal_handling

from turbotrain.checkpoint import rng_kept
from turbotrain.data.datasets import BUILTIN, TensorDataset, host_memory_bytes, map_dict_items
from turbotrain.errors import UserError
from turbotrain.log import say
from turbotrain.plugins import call_factory, is_import_spec, load_object, where

Auto = Literal["auto"]


MAX_WORKERS = 256  # DataLoader processes per rank
MAX_ITEMS = 2**32  # items of a dataset (the sampler's permutation of them is 32 GiB at this size)
MAX_PREFETCH = 256  # batches each worker loads ahead


@dataclass
class DataConfig:
    """The `[data]` section."""

    name: str = "shakespeare"
    """"shakespeare" | "fashion_mnist" | "synthetic" | "text" (your .txt/.jsonl files: args path, tokens) |
    "pkg.module:factory" (build(split, **args) -> Dataset of (inputs, targets), or of dicts:
    input_ids/pixel_values/inputs → inputs, labels/label/targets → targets)."""
    batch_size: int = 16
    """Samples per device per micro-step."""
    num_workers: int | Auto = "auto"
    """DataLoader worker processes ("auto": a core per worker, up to 8, one left to training)."""
    pin_memory: bool | Auto = "auto"
    """Page-locked host batches for asynchronous copies ("auto": on a GPU)."""
    prefetch_factor: int | Auto = "auto"
    """Batches each worker prepares ahead ("auto": 4)."""
    persistent_workers: bool | Auto = "auto"
    """Keep workers alive across epochs ("auto": when there are workers)."""
    device_resident: bool | Auto = "auto"
    """Keep an in-memory dataset on the device, no loader at all ("auto": built-in datasets up to 4 GiB)."""
    eval_batches: int = 20
    """Global batches in the validation pass (0 = no evaluation)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the data factory."""

    def __post_init__(self) -> None:
        if self.name not in BUILTIN and not is_import_spec(self.name):
            raise UserError(f"data.name = {self.name!r}: expected one of {', '.join(BUILTIN)} or 'pkg.module:factory'")
        if self.batch_size < 1:
            raise UserError(f"data.batch_size = {self.batch_size}: must be >= 1")
        # upper bounds too: a process per worker, and the loader queues workers x prefetch batches up front
        # (10^5 workers, or 10^11 batches, would hang the start instead of failing)
        if self.num_workers != "auto" and not 0 <= self.num_workers <= MAX_WORKERS:
            raise UserError(f"data.num_workers = {self.num_workers}: must be 0-{MAX_WORKERS} or \"auto\"")
        if self.prefetch_factor != "auto" and not 1 <= self.prefetch_factor <= MAX_PREFETCH:
            raise UserError(f"data.prefetch_factor = {self.prefetch_factor}: must be 1-{MAX_PREFETCH} or \"auto\"")
        if self.eval_batches < 0:
            raise UserError(f"data.eval_batches = {self.eval_batches}: must be >= 0")


def build_dataset(cfg: DataConfig, split: str) -> Dataset:
    """`build_dataset(cfg, "train")` through the built-in or user factory `build(split, **args)`; dict items
    are seen as (inputs, targets) through `map_dict_items`."""
    factory = load_object(cfg.name, "data.name") if is_import_spec(cfg.name) else BUILTIN[cfg.name]
    _check_takes_split(factory, cfg.name, cfg.args)
    ds = call_factory(factory, "data.args", split, **cfg.args)
    if isinstance(ds, type):  # `return MyDataset`, the call forgotten: its len() would fail as if it were the user's
        raise UserError(f"data.name = {cfg.name!r}: the factory returned the class {ds.__name__}, not a dataset; "
                        f"return an instance, {ds.__name__}(...)")
    if not hasattr(ds, "__getitem__") or not hasattr(ds, "__len__"):
        raise UserError(f"data.name = {cfg.name!r}: the factory returned {type(ds).__name__} for split {split!r}, "
                        f"not a map-style Dataset (an object with __getitem__ and __len__)")
    return map_dict_items(ds, f"data.name = {cfg.name!r}")


def _check_takes_split(factory: Any, name: str, args: dict) -> None:
    """A data factory is called as fn(split, **data.args): one without a split parameter would be reported as
    "too many positional arguments; it takes no data.args", or, its first parameter also a data.args key, as
    "got multiple values for argument 'n'", blaming data.args; or its first parameter, a size with a number for
    default, would get "train" and fail inside the user's code."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # no signature to read (some builtins): the call itself says what is wrong
        return
    first = next((p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)),
                 None)
    if first is None:
        why = "takes no positional argument"
    elif first.kind is first.VAR_POSITIONAL:
        return
    elif first.name == "split" and "split" in args:
        raise UserError("data.args.split: turbotrain passes the split itself (\"train\", then \"val\") as the "
                        "factory's first argument; remove data.args.split")
    elif first.name in args:
        why = f"has no split parameter: its first, {first.name!r}, is also set by data.args"
    elif first.default is not first.empty and first.default is not None and not isinstance(first.default, str):
        # `def dataset(n=2048, ...)`: "train" would go to n and fail deep in the user's code, or pass unseen
        why = f"has no split parameter: its first, {first.name!r} (default {first.default!r}), would receive it"
    else:
        return
    raise UserError(f"data.name = {name!r}: the factory {why}; it is called as fn(split, **data.args) with split "
                    f"\"train\" or \"val\": give it a first parameter for the split, e.g. "
                    f"def {getattr(factory, '__name__', 'build')}(split, ...)")


class StepSampler:
    """Yields this rank's micro-batches (lists of indices) for steps start, start+1, ... forever."""

    def __init__(self, n: int, micro: int, accum: int, rank: int = 0, world: int = 1, seed: int = 0,
                 start_step: int = 0, shuffle: bool = True):
        self.n, self.micro, self.accum, self.rank, self.world = n, micro, accum, rank, world
        self.seed, self.start_step, self.shuffle = seed, start_step, shuffle
        self.global_batch = micro * accum * world
        if n == 0:  # lowering the batch size cannot help
            raise UserError("data: the dataset is empty (0 samples: its len() is 0); check the data factory's "
                            "data.args and the files or split it reads")
        if n < self.global_batch:
            raise UserError(
                f"data: the dataset has {n} samples, fewer than one global batch of {self.global_batch} "
                f"(batch_size {micro} x grad_accum {accum} x world {world}); lower data.batch_size"
            )
        host = host_memory_bytes()
        # each epoch's order is a permutation of every index, 8 bytes each, held on the host beside the data and
        # the model: a __len__ that overstates (bytes for items, say) would end in the out-of-memory killer
        if n > MAX_ITEMS or (host is not None and 8 * n > host // 2):
            limit = MAX_ITEMS if host is None else min(MAX_ITEMS, host // 16)
            raise UserError(f"data: the dataset says it has {n:,} items (len()), more than the {limit:,} whose "
                            f"order an epoch can hold ({8 * n / 2**30:,.1f} GiB, at most half this host's memory); "
                            f"check its __len__")
        self.steps_per_epoch = n // self.global_batch
        self._perm: tuple[int, torch.Tensor] | None = None

    def permutation(self, epoch: int) -> torch.Tensor:
        if self._perm is None or self._perm[0] != epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._perm = (epoch, torch.randperm(self.n, generator=g))
            else:
                self._perm = (epoch, torch.arange(self.n))
        return self._perm[1]

    def step_slots(self, step: int) -> tuple[int, list[int]]:
        """(epoch, start offsets into that epoch's permutation) of this rank's micro-batches at `step`:
        micro-step m of rank r takes slot m·world + r of the step's global batch."""
        epoch, k = divmod(step, self.steps_per_epoch)
        base = k * self.global_batch
        return epoch, [base + (m * self.world + self.rank) * self.micro for m in range(self.accum)]

    def step_indices(self, step: int) -> list[torch.Tensor]:
        epoch, starts = self.step_slots(step)
        perm = self.permutation(epoch)
        return [perm[s:s + self.micro] for s in starts]

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        while True:
            for m, idx in enumerate(self.step_indices(step)):
                yield Micro(idx.tolist(), self.read_seed(step, m * self.world + self.rank))
            step += 1

    def read_seed(self, step: int, slot: int) -> int:
        """The seed a micro-batch's reads draw from: a function of the run's seed and the batch's place alone."""
        key = f"{self.seed}/{step}/{slot}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


class Micro(list):
    """A micro-batch's indices, and the seed its reads draw from (pickled with it to a loader worker)."""

    def __init__(self, indices: list[int], seed: int):
        super().__init__(indices)
        self.seed = seed


class SeededReads(Dataset):
    """The user's dataset, each micro-batch read under RNGs seeded by its place in the run. Random augmentation
    in __getitem__ draws from the global RNGs: read in the training process one batch ahead, it moved the
    stream that dropout draws from and that a checkpoint saves (a resume then drew the next batch's
    augmentation a second time); in workers, each worker's stream restarted on a resume. Seeded by place, the
    draws are the same with any data.num_workers, and a resumed run reads the batches the uninterrupted run read."""

    def __init__(self, ds: Dataset):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i):
        return self.ds[i]

    def __getitems__(self, indices: list[int]) -> list:
        with rng_kept(getattr(indices, "seed", None)):
            many = getattr(self.ds, "__getitems__", None)
            return many(list(indices)) if callable(many) else [self.ds[i] for i in indices]


def _batch_collate(batch):  # TensorDataset.__getitems__ already returns a collated batch
    return batch


def _worker_signals(worker_id: int) -> None:
    """A terminal's Ctrl-C, and a scheduler's SIGTERM (SLURM's scancel, systemd's stop), reach the whole process
    group: workers ignore both, so the training process alone handles the stop (finish the step, checkpoint,
    exit) instead of losing a worker mid-batch and ending in an error with the steps since the last checkpoint
    lost. They end with the loader (or by their watchdog once the training process is gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # torch's handlers print a line of their own to stderr for these; the training process names the death
    for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE):
        signal.signal(sig, signal.SIG_DFL)


class Batches:
    """Iterator of (inputs, targets) on the device. `wait_s` accumulates the host time spent waiting.

    Two paths: device-resident (the dataset lives on the device; a micro-batch is one gather launched
    from an index tensor, no copy) or a DataLoader whose pinned batches are copied with non_blocking on a
    side stream one batch ahead, so the copy overlaps the current step's compute.
    """

    def __init__(self, ds: Dataset, sampler: StepSampler, device: torch.device, resident: bool,
                 settings: dict | None = None, channels_last: bool = False, who: str = "the dataset",
                 first: tuple | None = None):
        self.device, self.channels_last, self.wait_s = device, channels_last, 0.0
        self.who, self.signature = who, None  # `first` batch's (shape[1:], dtype) of inputs and targets
        if first is not None:
            self.signature = tuple((tuple(t.shape[1:]), t.dtype) for t in first)
        self.resident, self.sampler = resident, sampler
        if resident:
            self.ds = ds.to(device)
            self._it = self._resident_indices()
        else:
            collate = _batch_collate if isinstance(ds, TensorDataset) else default_collate
            # its own generator: starting an iterator draws the workers' base seed, and drawn from the global RNG
            # (restored by a resume just before) it would shift dropout's stream off the uninterrupted run's
            # in-memory tensors draw nothing while read: only the user's dataset needs its reads seeded
            reads = ds if isinstance(ds, TensorDataset) else SeededReads(ds)
            with warnings.catch_warnings():  # torch's is many lines on stderr, where a failing run's one line goes
                warnings.filterwarnings("ignore", message="This DataLoader will create")
                self.loader = DataLoader(reads, batch_sampler=sampler, collate_fn=collate,
                                         worker_init_fn=_worker_signals,
                                         generator=torch.Generator().manual_seed(sampler.seed), **(settings or {}))
                self._it = iter(self.loader)
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            if self.loader.num_workers > cpus:
                say(f"warning: data.num_workers = {self.loader.num_workers} is more than the {cpus} CPU(s) this "
                    f"process may use: the workers share them, and may be slower than fewer")
            _no_async_worker_errors(self._it)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" and not resident else None
        self._next = None

    def _fetch(self):
        # data wait = host time spent producing the next batch (loader queue, index generation); the
        # device-side gather of resident data is enqueued like the forward and counts as compute
        t0 = time.perf_counter()
        batch = self._next_checked() if not self.resident else next(self._it)
        self.wait_s += time.perf_counter() - t0
        if self.resident:
            return self._move(self.ds.gather(batch))  # already on the device; only the layout may change
        if self.stream is None:
            return self._move(batch)
        with torch.cuda.stream(self.stream):  # async copy of pinned memory on the side stream
            return self._move(batch)

    def _next_checked(self):
        """The loader's next batch; the user's dataset failing (in __getitem__ or collation, in a worker or
        not), a worker dying, or items changing shape or dtype after the first batch is one UserError naming it."""
        try:
            return self._checked(self._read())
        except UserError:  # the run ends here, and torch's shutdown after a worker's error waits 5 s for each
            for w in getattr(self._it, "_workers", []):
                if w.is_alive():
                    w.kill()  # they ignore SIGTERM (see _worker_signals)
            raise

    def _read(self):
        try:
            with _worker_deaths_raised_here(self._it):
                batch = next(self._it)
        except UserError as e:  # raised in a worker, torch re-raises it with the worker's whole traceback inside
            if "Original Traceback" not in str(e):
                raise
            last = [ln for ln in str(e).splitlines() if ln.strip()][-1]
            raise UserError(last.split("UserError: ", 1)[-1].strip()) from None
        except (torch.OutOfMemoryError, MemoryError):
            raise
        except SystemExit as e:  # in __getitem__ with no workers: else the run would end early without a word
            raise UserError(f"{self.who}: reading a training batch called sys.exit({e.code!r}){where(e)}; the "
                            f"dataset must return or raise, not exit the process") from None
        except Exception as e:  # StopIteration too: the sampler never ends, so only the dataset can raise it
            raise UserError(self._failure(e)) from e
        return batch

    def _checked(self, batch):
        sig = tuple((tuple(t.shape[1:]), t.dtype) if isinstance(t, torch.Tensor) else type(t) for t in batch)
        if self.signature is None:
            self.signature = sig
        elif sig != self.signature:
            raise UserError(f"{self.who}: a batch of (inputs, targets) of per-item shape and dtype "
                            f"({_show_sig(sig)}) after a first batch of ({_show_sig(self.signature)}); "
                            f"every item's inputs, and its targets, need the same shape and dtype")
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in batch):  # as the first batch is held to
            raise UserError(f"{self.who}: a training batch's items require grad (they hang on an autograd graph); "
                            f"return detached tensors (tensor.detach()) from the dataset")
        return batch

    def _failure(self, e: Exception) -> str:
        workers = getattr(self._it, "_workers", [])
        if workers and "Original Traceback" not in str(e):  # not the dataset's error: a worker may be ending
            ended = multiprocessing.connection.wait([w.sentinel for w in workers], timeout=1.0)
            for w in workers:  # its pipes close a moment before its exit status can be read
                if w.sentinel in ended:
                    w.join(timeout=1.0)
        dead = [w.exitcode for w in workers if w.exitcode is not None]
        if dead:  # the worker's own error is lost with it: how it ended tells the likely cause
            code = dead[0]
            how = (f"exited with code {code} (sys.exit or os._exit in the dataset)" if code >= 0 else
                   "was killed by SIGKILL (most often the out-of-memory killer: lower data.num_workers or "
                   "data.prefetch_factor)" if code == -signal.SIGKILL else
                   f"was killed by signal {-code} (a crash in native code that the dataset calls)")
            return (f"{self.who}: a DataLoader worker process {how} while reading training batches; rerun with "
                    f"data.num_workers = 0 to see the dataset's own error")
        lines = [ln for ln in str(e).splitlines() if ln.strip()]  # a worker's error: its last line says it
        text = (lines[-1] if "Original Traceback" in str(e) else " ".join(lines)) if lines else type(e).__name__
        hint = ("a map-style dataset must return an item for every index below its __len__ (a next() on an "
                "exhausted iterator?)" if isinstance(e, StopIteration) or text.startswith("StopIteration") else
                f"its __len__ says {len(self.loader.dataset)} items: does __getitem__ serve every index below that?"
                if isinstance(e, IndexError) or text.startswith("IndexError") else
                "return detached tensors (tensor.detach()) from the dataset" if "requires grad" in text else
                "every item must be an (inputs, targets) pair of the same shapes and dtypes" if _in_collate(e) else
                "the dataset raised it while reading an item: fix or skip that item in the dataset's code")
        return (f"{self.who}: reading a training batch failed: {type(e).__name__}: {text.strip()[:200]}{where(e)}; "
                f"{hint}")

    def read_step(self, step: int) -> list:
        """The micro-batches of (0-based) `step` read again, as the run read them (the sampler's order, the seeds
        of SeededReads): a failure can be traced to a batch the loop has let go of. Not on the step's path."""
        if self.resident:
            return [self.ds.gather(idx.to(self.device)) for idx in self.sampler.step_indices(step)]
        reads, out = self.loader.dataset, []
        for m, idx in enumerate(self.sampler.step_indices(step)):
            micro = Micro(idx.tolist(), self.sampler.read_seed(step, m * self.sampler.world + self.sampler.rank))
            many = getattr(reads, "__getitems__", None)
            out.append(self.loader.collate_fn(many(micro) if callable(many) else [reads[i] for i in micro]))
        return out

    def _resident_indices(self) -> Iterator[torch.Tensor]:
        """Index tensors already on the device: the epoch's permutation is uploaded once per epoch and
        sliced per micro-batch, so no step copies from pageable host memory (such a copy would block
        the host until the GPU drains)."""
        step, epoch, perm = self.sampler.start_step, None, None
        while True:
            e, starts = self.sampler.step_slots(step)
            if e != epoch:  # pinned + non_blocking: the upload does not wait for the GPU to drain
                perm = self.sampler.permutation(e)
                perm = perm.pin_memory() if self.device.type == "cuda" else perm
                epoch, perm = e, perm.to(self.device, non_blocking=True)
            for s in starts:
                yield perm[s:s + self.sampler.micro]
            step += 1

    def _move(self, batch):
        def mv(t):
            if not isinstance(t, torch.Tensor):
                return t
            t = t.to(self.device, non_blocking=True)
            return t.contiguous(memory_format=torch.channels_last) if self.channels_last and t.dim() == 4 else t
        return tuple(mv(t) for t in batch) if isinstance(batch, (tuple, list)) else mv(batch)

    def __next__(self):
        if self._next is None:
            self._next = self._fetch()
        batch = self._next
        if self.stream is not None:  # the compute stream waits for the copy; tensors stay alive for it
            cur = torch.cuda.current_stream(self.device)
            cur.wait_stream(self.stream)
            for t in batch:
                if isinstance(t, torch.Tensor):
                    t.record_stream(cur)
        self._next = self._fetch()  # start the following batch while this one computes
        return batch

    def __iter__(self):
        return self


def _no_async_worker_errors(it) -> None:
    """torch's SIGCHLD handler raises a dead worker's RuntimeError in whatever the main process runs at that
    moment (the logger's set-up, a checkpoint write), past everything that would name the dataset: the workers
    are watched only while a batch is awaited (`_worker_deaths_raised_here`)."""
    if getattr(it, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(it))
        it._worker_pids_set = False


@contextlib.contextmanager
def _worker_deaths_raised_here(it):
    """A worker that died before the wait, or dies during it, raises its RuntimeError here at once (not at the
    loader's own status check, seconds later)."""
    workers = getattr(it, "_workers", None)
    if not workers:
        yield
        return
    signal_handling._set_worker_pids(id(it), tuple(w.pid for w in workers))
    try:
        signal_handling._error_if_any_worker_fails()
        yield
    finally:
        signal_handling._remove_worker_pids(id(it))


def _show_sig(sig: tuple) -> str:
    return ", ".join(f"{list(x[0])} {str(x[1])[6:]}" if isinstance(x, tuple) else x.__name__ for x in sig)


def eval_batches(ds: Dataset, micro: int, n_batches: int, rank: int, world: int) -> list[torch.Tensor]:
    """Fixed validation micro-batches (the first n_batches·micro samples), dealt across ranks, the same
    number to each (a rank with one more batch would wait forever in a collective of FSDP's forward)."""
    n = min(n_batches, len(ds) // micro)
    n -= n % world
    return [torch.arange(b * micro, (b + 1) * micro) for b in range(rank, n, world)]


def _in_collate(e: BaseException) -> bool:
    """Did batching the items fail (torch's collate: items of different shapes or kinds), rather than reading one?
    A worker's error carries its traceback as text; one raised here, as frames."""
    if "collate.py" in str(e):
        return True
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith("collate.py"):
            return True
        tb = tb.tb_next
    return False
