"""`turbotrain profile`: where a step's time goes, a verdict and ranked fixes.

The workload is built exactly as `turbotrain train` builds it, warmed up (compile happens there), then
`torch.profiler` records `wait + warmup + active` steps. Each step is timed on a drained device, and
each phase (data, forward, backward, optimizer) is a named range in the trace:

- on a GPU, a phase's time is the device time of the kernels its range launched (the trace links each
  kernel to the CPU op that launched it); communication kernels (NCCL) are split out, and only their
  part not overlapped by compute kernels counts as exposed; host→device copies are their own part;
- on a CPU, a phase's time is the host time of its range, but for forward and backward only the torch
  ops inside count: the range's own Python (a sleep or a loop in the model) is host overhead;
- data wait is host time blocked in the data range; whatever is left of the step's wall time is host
  overhead (GPU idle: Python, launches, syncs). The shares therefore sum to 1 by construction, and
  each part is measured, none estimated.

The verdict names the largest stall above its threshold (data wait, exposed communication, host overhead:
time the step waits), else the larger working part: the optimizer by name where it outweighs forward and
backward together, else compute, unless on a CPU that compute is mostly ops on tiny tensors (per-op overhead:
host-overhead-bound); where one layer holds most of forward's own time (measured apart, per module) a compute
verdict names it. Host reads of tensor values inside forward/backward (.item(), .tolist(), .numpy()) put their
removal first. Every
verdict but compute-bound comes with at least one fix; where no config key is left, the fix is a change to
the user's code or machine. Float64 ops in forward/backward (no precision.dtype reaches them) are advised against.
Where data wait is a stall, one step's batches are read again in this process, the items apart from their collation:
the larger part is the one advised against, and a data wait several times that whole read is the loader workers'
hand-over (data.num_workers=0), not the dataset.

The training loop's work outside the step is measured too: train.callbacks' on_step_end runs in each step as in
training (host overhead), and one evaluation, one checkpoint save and one call of the callbacks' on_log are timed
and spread over train.eval_every, checkpoint.every and train.log_every steps; where they take most of the run's
time the verdict is eval-, checkpoint- or log-bound.
What the hooks and the save write goes to a scratch folder removed after. `profile` refuses a run directory
that a training run holds and writes nothing through a symbolic link there.

Usage: `turbotrain profile gpt2-124m precision.dtype=bf16 compile.enabled=false`.
"""
from __future__ import annotations

import contextlib
import copy
import gzip
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from turbotrain.accel import precision
from turbotrain.accel.attention import attention_backend, model_ops
from turbotrain.accel.compile import compile_stats
from turbotrain.accel.optim import triton_blocker
from turbotrain.accel.triton_adamw import TritonAdamW
from turbotrain.bench import Interrupted, interrupts
from turbotrain.callbacks import Hooks, build_callbacks, eval_metric_fns
from turbotrain.config import Config
from turbotrain.data.datasets import TensorDataset
from turbotrain.data.loader import Micro
from turbotrain.distributed.env import shutdown
from turbotrain.distributed.fsdp import unit_groups
from turbotrain.errors import UserError
from turbotrain.files import make_dir
from turbotrain.log import Heartbeat, say
from turbotrain.models.structure import WithLoss
from turbotrain.monitor import phases
from turbotrain.prepare import Run, prepare, process_state_kept
from turbotrain.report import refuse_links
from turbotrain.rundir import RunDir, write_run_file
from turbotrain.step import evaluate, first_train_step, train_step
from turbotrain.workload import peak_mem_gib, resolve_device, sync

PARTS = ("data_wait", "h2d_copy", "forward", "backward", "optimizer", "exposed_comm", "host_overhead")


MATMUL_WORDS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "linear", "conv1d", "conv2d", "conv3d", "conv"}


def op_class(name: str) -> str:
    n = name.lower()
    if n.startswith("gloo:") or any(k in n for k in ("nccl", "allreduce", "all_reduce", "all_gather",
                                                     "reduce_scatter")):
        return "communication"
    if "memcpy" in n or "memset" in n or "copy_" in n or n.startswith("aten::to") or "cat" == n.split("::")[-1]:
        return "memory copy"
    words = set(re.split(r"[^a-z0-9]+", n))  # whole words: "mm" in aten::mm, not in GammaBetaBackward
    if words & MATMUL_WORDS or any(k in n for k in ("gemm", "matmul", "convolution", "attention", "flash", "sdpa",
                                                    "cutlass", "nvjet", "xmma", "cudnn", "wgmma")):
        return "matmul/conv/attention"
    return "elementwise/reduction/other"


def _intervals_union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(iv: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    total = 0.0
    for a, b in _intervals_union(iv):
        for c, d in cover:
            lo, hi = max(a, c), min(b, d)
            if hi > lo:
                total += hi - lo
    return total


def _phase_of(evt) -> str | None:
    p = evt
    while p is not None:
        if p.name.startswith(phases.PREFIX):
            return p.name[len(phases.PREFIX):]
        p = p.cpu_parent
    return None


def _is_annotation(e) -> bool:
    """Ranges (ours, the optimizer's `Optimizer.step#...`), not work."""
    return e.name.startswith(phases.PREFIX) or bool(getattr(e, "is_user_annotation", False)) \
        or e.name.startswith("Optimizer.")


def _op_time(evt) -> float:
    """Microseconds of torch ops inside a host range: its children's time, looking through nested ranges
    (the optimizer's `Optimizer.step#...`), whose own Python time is not op time either."""
    return sum(_op_time(c) if _is_annotation(c) else c.cpu_time_total for c in evt.cpu_children)


def _kernel_phases(events, device_evts, kernels) -> list[str | None]:
    """The phase of each device kernel, by when it was launched: the CUDA runtime call that launched it
    (same correlation id) falls inside one phase's host range — whatever thread launched it (backward
    runs on autograd's thread while the main thread sits in the backward range). Fallbacks: the GPU-side
    span of a phase range (gpu_user_annotation), then the phase of the op linked to the kernel."""
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    ranges = sorted((e.time_range.start, e.time_range.end, e.name[len(phases.PREFIX):])
                    for e in cpu if e.name.startswith(phases.PREFIX))
    launch = {e.id: e.time_range.start for e in cpu if e.name.startswith(("cuda", "cu")) and "Launch" in e.name}
    spans = [(e.time_range.start, e.time_range.end, e.name[len(phases.PREFIX):])
             for e in device_evts if e.name.startswith(phases.PREFIX)]
    linked = {e.id: _phase_of(e) for e in cpu}

    def inside(t: float | None, table) -> str | None:
        if t is None:
            return None
        return next((name for a, b, name in table if a <= t <= b), None)

    out = []
    for k in kernels:
        ph = inside(launch.get(k.id), ranges) or inside((k.time_range.start + k.time_range.end) / 2, spans)
        out.append(ph or linked.get(getattr(k, "linked_correlation_id", -1)))
    return out


def _calls(evt, skip: str = ""):
    """The torch ops called directly inside a host range, looking through nested ranges but those named `skip`."""
    for c in evt.cpu_children:
        if c.name != skip:
            yield from (_calls(c, skip) if _is_annotation(c) else (c,))


def _numel(evt) -> int:
    """The largest tensor an op (or an autograd node, through the ops it ran) reads or allocates, in 4-byte
    elements: its size of work (a scalar's gradient into a large parameter reads a scalar, writes the whole)."""
    shapes = [s for s in (getattr(evt, "input_shapes", None) or [])  # a tensor list's entry is a list of shapes
              if isinstance(s, list) and s and all(isinstance(d, int) for d in s)]
    own = max([math.prod(s) for s in shapes] + [abs(getattr(evt, "cpu_memory_usage", 0) or 0) // 4])
    return max([own, *(_numel(c) for c in evt.cpu_children)])


TINY_NUMEL = 4096  # an op on fewer elements does less arithmetic than its dispatch costs on a CPU core


def tiny_op_share(events) -> float:
    """On a CPU, the share of forward+backward op time spent in ops on tensors under TINY_NUMEL elements: per-op
    overhead (dispatch, autograd bookkeeping, allocation), not arithmetic. Such a step reads as compute in the
    breakdown, yet its levers are the host's: more samples per op, fewer (fused) ops."""
    calls = [c for e in events if e.name in (phases.PREFIX + "forward", phases.PREFIX + "backward")
             for c in _calls(e)]
    total = sum(c.cpu_time_total for c in calls)
    return sum(c.cpu_time_total for c in calls if _numel(c) < TINY_NUMEL) / total if total > 0 else 0.0


def _in_f64(evt) -> bool:
    """An op (or an autograd node, through the ops it ran) working on float64 tensors. A Python number in an op
    (`h * 0.5`) reaches it as a 0-dim float64 input: a scalar, no float64 work, so only inputs of 1+ dims count."""
    dtypes, shapes = getattr(evt, "input_dtypes", None) or [], getattr(evt, "input_shapes", None) or []
    return any(d == "double" and s for d, s in zip(dtypes, shapes)) or any(_in_f64(c) for c in evt.cpu_children)


def f64_share(events) -> float:
    """The share of forward+backward op time in float64 ops: no precision.dtype runs them (autocast leaves a
    `.double()` alone), and a GPU does float64 at a small fraction of its float32 rate, with no tensor cores."""
    calls = [c for e in events if e.name in (phases.PREFIX + "forward", phases.PREFIX + "backward")
             for c in _calls(e)]
    total = sum(c.cpu_time_total for c in calls)
    return sum(c.cpu_time_total for c in calls if _in_f64(c)) / total if total > 0 else 0.0


F64_SHARE = 0.05  # float64 work above this share of forward+backward is advised against under any verdict


def _f64_tip(share: float) -> dict:
    return _tip("compute the model and the loss in float32", f"{share:.0%} of forward+backward op time is in float64 "
                "ops (a `.double()` or a float64 tensor in the model or the loss): precision.dtype does not reach "
                "them; float64 is twice the bytes and, on a GPU, a small fraction of float32's speed; keep float32 "
                "(or sum in float32 with torch.float32 accumulation)", share)


SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
# ops that read tensor values on the host: a scalar read, or an output whose size depends on the values (boolean
# mask indexing and torch.where(cond) run nonzero): on a GPU each waits for the kernels queued before it, and on a
# CPU it is the only trace the read leaves (no wait is recorded there)
READS = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere",
         "aten::masked_select", "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
         "aten::unique_dim_consecutive"}


def host_reads(events, n_steps: int, where: tuple[str, ...] = ("forward", "backward")) -> float:
    """Reads of a tensor's value by the host per step inside forward and backward (`.item()`, `float(t)`,
    `if t:` all end in `_local_scalar_dense`; `t[mask]`, torch.nonzero, torch.unique size their output by the
    values; `.tolist()`, `.numpy()` export them): on a GPU each waits for every kernel queued before it. On a
    GPU the waits themselves are counted too (`.cpu()` copies to pageable memory and waits, without a read op),
    and the larger count is taken: each read is one such wait. `where`: the phases counted (("callbacks",):
    the reads of train.callbacks' on_step_end)."""
    inside = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and _phase_of(e) in where]
    reads = sum(1 for e in inside if (e.name in READS and not _read_inside_read(e)) or _is_export(e))
    waits = sum(1 for e in inside if e.name in SYNCS)
    return max(reads, waits) / max(1, n_steps)


# torch._assert_async (a bounds check, as the fused loss makes on its targets) reads its flag on a CPU, yet on a
# GPU it raises from the kernel without a host wait: no read the user could or should remove
ASYNC_ASSERTS = {"aten::_assert_async", "aten::_functional_assert_async"}


def _is_export(e) -> bool:
    """A tensor's values handed to Python or numpy (`.tolist()`, `.numpy()`, np.asarray(t), so `.cpu().numpy()`):
    no read op runs on a CPU, only the conjugate/negative-bit resolve they start with, called from Python itself
    (inside a torch op it is part of that op's work)."""
    return e.name == "aten::resolve_neg" and (e.cpu_parent is None or _is_annotation(e.cpu_parent))


def _read_inside_read(e) -> bool:
    """One read, however many read ops it runs (aten::item calls _local_scalar_dense, t[mask] calls nonzero); a
    read inside an asynchronous assert is none."""
    p = e.cpu_parent
    while p is not None:
        if p.name in READS or p.name in ASYNC_ASSERTS:
            return True
        p = p.cpu_parent
    return False


def analyze(events, step_wall_s: float, n_steps: int, on_gpu: bool) -> tuple[dict, list[dict]]:
    """Per-step seconds of each part, and the top ops by self time."""
    per = {k: 0.0 for k in PARTS}
    device_evts = [e for e in events if on_gpu and e.device_type == torch.autograd.DeviceType.CUDA]
    for e in events:  # host-side ranges
        if e.name == phases.PREFIX + "data":
            per["data_wait"] += e.cpu_time_total / 1e6
        elif not on_gpu and e.name.startswith(phases.PREFIX):
            name = e.name[len(phases.PREFIX):]
            # forward/backward: the range's own Python (a sleep, a loop in the model) is host overhead, not
            # compute; the optimizer's Python loop over its tensors is its own cost, which foreach/fused cut
            if name in ("forward", "backward"):
                per[name] += _op_time(e) / 1e6
            elif name in per:
                per[name] += e.cpu_time_total / 1e6
    if on_gpu:
        _device_parts(events, device_evts, per, n_steps)
    else:
        per["exposed_comm"] = _host_comm(events) / 1e6
    per = {k: v / n_steps for k, v in per.items()}
    measured = sum(v for k, v in per.items() if k != "host_overhead")
    per["host_overhead"] = max(0.0, step_wall_s - measured)

    # top ops by self time: device kernels on a GPU, host ops on a CPU
    agg: dict[str, float] = {}
    for e in (device_evts if on_gpu else events):
        if _is_annotation(e) or e.name.startswith("ProfilerStep"):
            continue
        t = (e.time_range.end - e.time_range.start) if on_gpu else e.self_cpu_time_total
        agg[e.name] = agg.get(e.name, 0.0) + t
    total = sum(agg.values()) or 1.0
    top = [{"name": k[:120], "class": op_class(k), "ms_per_step": v / 1e3 / n_steps, "share_of_op_time": v / total}
           for k, v in sorted(agg.items(), key=lambda kv: -kv[1])[:15]]
    return per, top


def _device_parts(events, device_evts, per: dict, n_steps: int) -> None:
    """On a GPU, each phase's kernel time added to `per` (seconds over all steps). Communication and host→device
    copies run beside compute on streams of their own: only their part that nothing else covers is the step's
    (the loader copies the next batch while this one computes, and the host waits in the data range meanwhile),
    else the parts would sum past the step's wall time and call an overlapped copy a data stall."""
    comm, copies, compute = [], [], []
    kernels = [e for e in device_evts if not _is_annotation(e)]
    unattributed = 0.0
    for e, ph in zip(kernels, _kernel_phases(events, device_evts, kernels)):
        span = (e.time_range.start, e.time_range.end)
        if op_class(e.name) == "communication":
            comm.append(span)
        elif "memcpy htod" in e.name.lower():
            copies.append(span)
        else:
            compute.append(span)
            if ph in ("forward", "backward", "optimizer"):
                per[ph] += (span[1] - span[0]) / 1e6
            # kernels launched outside a phase (e.g. the resident-data gather) count as data work
            elif ph == "data":
                per["h2d_copy"] += (span[1] - span[0]) / 1e6
            else:
                unattributed += (span[1] - span[0]) / 1e6
    waits = [(e.time_range.start, e.time_range.end) for e in events if e.name == phases.PREFIX + "data"]
    per["h2d_copy"] += _exposed(copies, compute + waits) / 1e6
    per["exposed_comm"] = _exposed(comm, compute + copies) / 1e6
    if unattributed > 0.05 * sum(per.values()):
        say(f"profile: {unattributed / n_steps * 1e3:.2f} ms/step of kernels could not be tied to a phase; "
            "they count as host overhead")


def _host_comm(events) -> float:
    """On a CPU, collectives run on the process group's threads (gloo:all_reduce), outside every phase: their time
    that no op of forward/backward and no optimizer or data range covers is the step waiting for them (DDP waits at
    backward's end), else read as host overhead ("Python outside torch ops")."""
    comm = [(e.time_range.start, e.time_range.end) for e in events
            if op_class(e.name) == "communication" and _phase_of(e) is None]
    if not comm:
        return 0.0
    cover = []
    for e in events:
        if e.name in (phases.PREFIX + "forward", phases.PREFIX + "backward"):
            cover += [(c.time_range.start, c.time_range.end) for c in _calls(e) if op_class(c.name) != "communication"]
        elif e.name in (phases.PREFIX + "optimizer", phases.PREFIX + "data"):
            cover.append((e.time_range.start, e.time_range.end))
    return _exposed(comm, cover)


def _exposed(spans: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """The time `spans` take that `cover` does not."""
    u = _intervals_union(spans)
    return sum(b - a for a, b in u) - _overlap(u, _intervals_union(cover))


def _rec(keys: str, why: str, share: float) -> dict:
    return {"set": keys, "why": why, "evidence_share": round(share, 4)}


def _tip(do: str, why: str, share: float) -> dict:
    """A fix no config key reaches (the user's code, the machine): `set` stays empty, `do` says what to change."""
    return {"set": "", "do": do, "why": why, "evidence_share": round(share, 4)}


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


HANDOFF = 3  # a data wait this many times a batch's read in this process is the workers' hand-over, not the read
SPLIT_AHEAD = 1000  # loader_split reads a step this far past the run's start: items no profiled step read


def _data_advice(run: Run, data: float, split: dict | None = None) -> list[dict]:
    """`split`: loader_split's measure of one step's batches read in this process, items apart from collation,
    with the step's measured data wait (`wait_ms`): a wait the workers' reading cannot explain is their hand-over."""
    loader = getattr(run.batches, "loader", None)  # None on the device-resident path
    workers, cpus, resident = (loader.num_workers if loader is not None else 0), _cpus(), run.batches.resident
    read_ms = split["items_ms"] + split["collate_ms"] if split else math.inf
    if workers and split and split.get("wait_ms", 0.0) >= HANDOFF * read_ms:  # the hand-over, not the reading
        return [_rec("data.num_workers=0", f"the step waits {split['wait_ms']:.2f} ms for its batches from {workers} "
                     f"loader worker(s), {split['wait_ms'] / max(read_ms, 1e-6):.0f}x the {read_ms:.2f} ms it takes "
                     "to read and collate them in the training process: the wait is the hand-over from a worker "
                     "process (pickling, shared memory, a queue), not the dataset; read them in this process", data),
                *([_rec("data.pin_memory=true", "pinned batches copy to the GPU asynchronously", data)]
                  if run.trainee.device.type == "cuda" else [])]
    recs = []
    if not resident and workers < max(1, cpus - 1):
        recs.append(_rec(f"data.num_workers={max(2, min(8, cpus - 1))}", f"the step waits for data {data:.0%} of the "
                         f"time with {workers} loader workers; workers prepare batches in parallel", data))
    if run.trainee.device.type == "cuda" and not resident:
        recs.append(_rec("data.pin_memory=true data.prefetch_factor=4", "pinned, prefetched batches copy "
                         "asynchronously", data))
    if loader is not None and isinstance(loader.dataset, TensorDataset):
        recs.append(_rec("data.device_resident=true", "the dataset is an in-memory tensor set: kept on the device it "
                         "needs no loader at all", data))
    if resident:  # no loader to speed up: only fewer, larger gathers
        return recs + _larger_batch(run, f"the step waits for its batch {data:.0%} of the time", "the per-step "
                                    "gather", data)
    # the levers left once the keys are used up live in the user's code and the machine: where the batch's
    # collation costs more than reading its items, the items' shape and dtype are the fix, not __getitem__
    if split and split["collate_ms"] > split["items_ms"]:
        recs.append(_collate_tip(split, data))
    else:
        recs.append(_tip("make the dataset's __getitem__ cheaper", f"the step waits for data {data:.0%} of the time: "
                         "decode, tokenize or augment once ahead of training and cache the result (pre-tokenized "
                         "arrays, memory-mapped files), or produce items as in-memory tensors (then "
                         "data.device_resident=true)", data))
    if workers >= max(1, cpus - 1):
        recs.append(_tip("more CPU cores for the loader", f"{workers} loader worker(s) and the step already share "
                         f"the {cpus} cores this process may run on: more workers would only split them finer", data))
    return recs


def _collate_tip(split: dict, data: float) -> dict:
    whole = split["items_ms"] + split["collate_ms"]
    return _tip("make the items cheaper to collate", f"the step waits for data {data:.0%} of the time, and "
                f"{split['collate_ms'] / whole:.0%} of reading a batch ({whole:.1f} ms in this process) is collating "
                f"its items into one batch, not reading them ({split['items_ms']:.1f} ms): each batch copies every "
                "item's tensors into new ones; return items in their smallest dtype (uint8 pixels, int16/int32 "
                "tokens) and scale or cast them in the model, return tensors rather than numpy arrays or Python "
                "lists, and no larger than the model reads (crop or resize once ahead of training)", data)


def loader_split(run: Run) -> dict | None:
    """One step's micro-batches read in this process as the loader reads them (the same indices and seeds), the
    items' reads (__getitem__) timed apart from their collation into a batch: ms per step. None on the
    device-resident path (no loader), or where the read fails here (the profiled steps read it; no report is lost
    to a second read)."""
    loader, batches = getattr(run.batches, "loader", None), run.batches
    if loader is None or isinstance(loader.dataset, TensorDataset):  # a tensor set is gathered whole: no items
        return None
    reads, sampler, best, start = loader.dataset, batches.sampler, [math.inf, math.inf], time.perf_counter()
    many = getattr(reads, "__getitems__", None)
    try:
        # a step far past the profiled ones: its items were not read by the workers moments ago (the OS page
        # cache would serve a re-read of theirs fast and hide a slow disk); the step after it first, its items'
        # time dropped, so the code's first calls are warm by the measured read
        ahead = sampler.start_step + SPLIT_AHEAD
        for step in (ahead + 1, *[ahead] * 3):  # a few reads, within half a second
            items = collate = 0.0
            for m, idx in enumerate(sampler.step_indices(step)):
                micro = Micro(idx.tolist(), sampler.read_seed(step, m * sampler.world + sampler.rank))
                t0 = time.perf_counter()
                got = many(micro) if callable(many) else [reads[i] for i in micro]
                t1 = time.perf_counter()
                loader.collate_fn(got)
                items, collate = items + t1 - t0, collate + time.perf_counter() - t1
            # the items' first read is the loader's (each index once an epoch: a cache the dataset keeps never
            # serves it), the collation's least is its own cost (a first one touches fresh memory)
            warm = step == ahead
            best = [items if warm and best[0] == math.inf else best[0], min(best[1], collate)]
            if warm and time.perf_counter() - start > 0.5:
                break
    except Exception:  # noqa: BLE001 - the user's dataset: its failure is the training read's to report
        return None
    return {"items_ms": best[0] * 1e3, "collate_ms": best[1] * 1e3}


def _loader_read(run: Run, shares: dict, wait_s: float) -> dict | None:
    """loader_split with the step's data wait beside it, where data is a stall: elsewhere nothing is read again
    (a slow dataset's read would be paid once more for advice that is not given)."""
    split = loader_split(run) if groups(shares)["data"] >= STALLS["data"] else None
    return split and {**split, "wait_ms": wait_s * 1e3}


def _comm_advice(run: Run, comm: float) -> list[dict]:
    cfg, strategy, recs = run.cfg, run.cfg.parallel.strategy, []
    grads_mb = sum(p.numel() * p.element_size() for p in run.trainee.model.parameters() if p.requires_grad) / 2**20
    if strategy == "ddp" and grads_mb > cfg.parallel.bucket_cap_mb:  # else one bucket holds them all already
        recs.append(_rec(f"parallel.bucket_cap_mb={cfg.parallel.bucket_cap_mb * 2}", f"{comm:.0%} of the step is "
                         "communication not hidden behind compute; larger buckets mean fewer, better-overlapped "
                         "all-reduces", comm))
    # FSDP2 only: on DDP the bf16 comm hook measured slower than native fp32 buckets (benchmarks/NOTES.md)
    if strategy == "fsdp" and cfg.parallel.grad_compression == "none":
        recs.append(_rec('parallel.grad_compression="bf16"', "gradients reduced in bf16 move half the bytes", comm))
    if (strategy == "fsdp" and cfg.parallel.reshard_after_forward
            and unit_groups(run.trainee.model, cfg.parallel.fsdp_units)):
        recs.append(_rec("parallel.reshard_after_forward=false", "keeping gathered parameters from forward to "
                         "backward saves one all-gather per step (more memory)", comm))
    recs.append(_rec(f"train.grad_accum={cfg.train.grad_accum * 2}", "accumulating more micro-batches reduces "
                     "gradients once per more compute", comm))
    return recs


def _host_advice(run: Run, host: float) -> list[dict]:
    c, recs = run.cfg.compile, []
    if run.trainee.device.type != "cuda":  # no device to idle: the time is Python between the step's phases
        recs += _larger_batch(run, f"{host:.0%} of the step is host work outside torch ops", "it", host)
        recs.append(_tip("move host work out of the step", f"{host:.0%} of the step is Python outside torch ops "
                         "(in the model's forward, the loss or between the phases): loops over samples, sleeps, "
                         "I/O or synchronous logging; vectorize it or do it once ahead of training", host))
        return recs
    # CUDA graphs only where they can hold: one process (the resolver turns them off under DDP/FSDP)
    if run.cfg.parallel.strategy == "none" and (not c.enabled or c.mode != "reduce-overhead"):
        recs.append(_rec("compile.enabled=true compile.mode=reduce-overhead", f"the GPU idles {host:.0%} of the step "
                         "waiting for the host; CUDA graphs replay the whole step in one launch", host))
    elif not c.enabled:
        recs.append(_rec("compile.enabled=true", f"the GPU idles {host:.0%} of the step waiting for the host; "
                         "compiled graphs launch fewer, fused kernels", host))
    return recs + _larger_batch(run, f"the GPU idles {host:.0%} of the step waiting for the host", "each launch",
                                host)


def _larger_batch(run: Run, why: str, what: str, share: float) -> list[dict]:
    """More samples per step to spread a per-step or per-op cost (`what`) over: first the micro-batches merged
    (the same global batch: the same math, more memory), then a doubled batch, which changes the math."""
    b, a, recs = run.cfg.data.batch_size, run.cfg.train.grad_accum, []
    if a > 1:
        recs.append(_rec(f"data.batch_size={b * a} train.grad_accum=1", f"{why}, paid per micro-batch: the same "
                         f"global batch in one micro-batch pays {what} once (the same math; more memory)", share))
    recs.append(_rec(f"data.batch_size={b * 2}", f"{why}: twice the samples pay {what} once (a larger global batch "
                     "changes the math: retune train.lr)", share))
    return recs


FUSED_KERNELS = (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)  # torch's `fused=` on CPU and CUDA


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 100_000 else f"{n:,}"


def optimizer_facts(opt: torch.optim.Optimizer) -> dict:
    """What the optimizer step works through: its class, kernel, parameters and state (bytes it reads and
    writes every step besides the parameters and gradients)."""
    d = opt.defaults
    # foreach=None is torch's own choice: foreach on CUDA, the per-tensor loop on a CPU; a TritonAdamW whose
    # kernels do not run steps with torch's foreach AdamW
    impl = ("foreach" if _triton_down(opt) else "triton") if isinstance(opt, TritonAdamW) else "fused" \
        if d.get("fused") else "foreach" if d.get("foreach") else "for" if d.get("foreach") is False \
        else "torch default"
    params = sum(p.numel() for g in opt.param_groups for p in g["params"])
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    return {"name": type(opt).__name__, "impl": impl, "params": params, "state_mib": round(state / 2**20, 1)}


def _triton_down(opt: TritonAdamW) -> str | None:
    """Why a TritonAdamW's kernels do not step it (its first build failed, or not on a GPU with triton), or None."""
    from turbotrain.accel import triton_adamw

    if opt._broken:
        return f"the kernels failed to build: {opt._broken}"
    p = next((p for g in opt.param_groups for p in g["params"]), None)
    return triton_adamw.triton_problem(p.device) if p is not None else None


def _torch_optimizer(opt: torch.optim.Optimizer) -> type | None:
    """The torch.optim class whose kernels step `opt`: its own, or the one under turbotrain's wrappers
    (FSDP2's ShardLocal*, TritonAdamW); None for the user's own optimizer class."""
    if type(opt) in FUSED_KERNELS:
        return type(opt)
    if type(opt).__module__.startswith("turbotrain."):
        return next((c for c in type(opt).__mro__ if c in FUSED_KERNELS), None)
    return None


def _optimizer_advice(run: Run, share: float) -> list[dict]:
    tr, spec, recs = run.trainee, run.cfg.train.optimizer, []
    f = optimizer_facts(tr.opt)
    size = (f"{f['name']} ({f['impl']}) updates {_count(f['params'])} parameters and "
            f"{f['state_mib']:g} MiB of optimizer state every step")
    base = _torch_optimizer(tr.opt)
    # AdamW's Triton kernel where it would step this model (not FSDP2's shards, not a kernel that failed here)
    triton = (type(tr.opt) is torch.optim.AdamW and f["impl"] != "triton"
              and not triton_blocker(spec, tr.model, tr.device))
    triton_why = (f"the optimizer is {share:.0%} of the step: {size}; the Triton kernel updates every parameter in "
                  "one launch, nearer the memory's copy rate than torch's fused kernel (the same math and state)")
    if base is not None and tr.device.type in ("cpu", "cuda") and f["impl"] not in ("fused", "triton"):
        down = _triton_down(tr.opt) if isinstance(tr.opt, TritonAdamW) else None
        why = (f"the optimizer is {share:.0%} of the step: {size}"
               + (f" (the Triton kernel does not run here: {down})" if down else "")
               + "; the fused kernel does each parameter's whole update in one pass instead of one pass per operation")
        recs.append(_tip(f"pass fused=True to torch.optim.{base.__name__} in {spec}", why, share) if ":" in spec
                    else _rec('train.optimizer_impl="triton"', triton_why, share) if triton
                    else _rec('train.optimizer_impl="fused"', why, share))
    elif triton and f["impl"] == "fused":
        recs.append(_rec('train.optimizer_impl="triton"', triton_why, share))
    elif f["impl"] == "for" and ":" not in spec:
        recs.append(_rec('train.optimizer_impl="foreach"', f"the optimizer is {share:.0%} of the step: {size} one "
                         "tensor at a time; foreach batches the tensors", share))
    elif not type(tr.opt).__module__.startswith(("torch.", "turbotrain.")):  # the user's own step: no key reaches it
        recs.append(_tip(f"make {f['name']}.step cheaper", f"the optimizer is {share:.0%} of the step and its step is "
                         f"the user's own ({spec}): Python run per parameter or per slice, or host bookkeeping, each "
                         "step; update all parameters at once with torch._foreach_* ops, or use a torch.optim "
                         "optimizer (train.optimizer=\"adamw\" takes its fused kernel)", share))
    # its cost is per step, not per sample (a larger global batch: retune train.lr)
    recs.append(_rec(f"data.batch_size={run.cfg.data.batch_size * 2}", f"the optimizer is {share:.0%} of the step "
                     "and costs the same whatever the batch: a larger batch spreads it over twice the samples "
                     "(retune train.lr)", share))
    recs.append(_tip("train fewer parameters", f"{size}; parameters the forward barely uses cost a full update all "
                     "the same: freeze them (requires_grad=False) or drop them", share))
    return recs


def _memory_advice(run: Run, mem_frac: float) -> list[dict]:
    b, a = run.cfg.data.batch_size, run.cfg.train.grad_accum
    return [_rec('memory.activation_checkpointing="selective"', f"peak memory is {mem_frac:.0%} of the device",
                 mem_frac),
            _rec(f"data.batch_size={max(1, b // 2)} train.grad_accum={a * 2}", "same global batch in half the "
                 "activation memory", mem_frac)]


def _compute_advice(run: Run, compute: float) -> list[dict]:
    """Levers on the compute itself. On a CPU only activation checkpointing's recompute is one (no tensor
    cores, no CUDA graphs)."""
    cfg, tr, recs = run.cfg, run.trainee, []
    if cfg.memory.activation_checkpointing != "none":
        recs.append(_rec('memory.activation_checkpointing="none"', f"forward+backward are {compute:.0%} of the step "
                         "and checkpointing runs the forward again inside backward; off, if memory allows", compute))
    if tr.device.type != "cuda":
        return recs
    if tr.dtype in ("fp32", "tf32"):
        recs.append(_rec("precision.dtype=bf16", f"compute is {compute:.0%} of the step in {tr.dtype}; bf16 tensor "
                         "cores are several times faster and halve activation memory", compute))
    if not cfg.compile.enabled:
        recs.append(_rec("compile.enabled=true", "eager mode runs each elementwise op as its own kernel; compile "
                         f"fuses them (forward+backward are {compute:.0%} of the step)", compute))
    if not cfg.memory.channels_last and any(isinstance(m, torch.nn.Conv2d) for m in tr.model.modules()):
        recs.append(_rec("memory.channels_last=true", "convolutions run faster on NHWC tensor cores", compute))
    return recs


# a stall (time the step waits, not works) above its share is the verdict whatever else the step does
STALLS = {"data": 0.2, "communication": 0.15, "host": 0.3}
OPTIMIZER_SECONDARY = 0.25  # an optimizer share above which its advice is given under any verdict
COMPUTE_SECONDARY = 0.25  # below this share of the step, forward+backward's own levers are not worth ranking


def groups(shares: dict) -> dict[str, float]:
    """The step's shares as the verdict weighs them: data wait and its copy are one stall."""
    return {"data": shares["data_wait"] + shares["h2d_copy"], "communication": shares["exposed_comm"],
            "host": shares["host_overhead"], "forward": shares["forward"], "backward": shares["backward"],
            "optimizer": shares["optimizer"]}


TINY_BOUND = 0.6  # a CPU step whose compute is mostly ops on tiny tensors is bound by per-op overhead


def bottleneck(shares: dict, tiny: float = 0.0) -> str:
    """The part the verdict names: the largest stall above its threshold, else the largest working part, where
    forward and backward are one (compute): an optimizer at 40% beside 60% of compute does not bound the step.
    Compute spent mostly in ops on tiny tensors (`tiny`, CPU only) is host overhead: per-op cost, not arithmetic."""
    g = groups(shares)
    stalls = [k for k, t in STALLS.items() if g[k] >= t]
    if stalls:
        return max(stalls, key=g.__getitem__)
    if g["optimizer"] > g["forward"] + g["backward"]:
        return "optimizer"
    return "host" if tiny >= TINY_BOUND else max(("forward", "backward"), key=g.__getitem__)


LABELS = {"data": "data wait", "communication": "exposed communication", "host": "host overhead"}


def describe(shares: dict, tiny: float = 0.0) -> str:
    """The numbers behind the verdict, its part first: "optimizer 81% of the step (backward 14%, ...)"."""
    g, part = groups(shares), bottleneck(shares, tiny)
    rest = ", ".join(f"{LABELS.get(k, k)} {v:.0%}" for k, v in sorted(g.items(), key=lambda kv: -kv[1])
                     if k != part and v >= 0.01)
    if part == "host" and g["host"] < STALLS["host"]:  # named through its tiny ops: say so, with their numbers
        return (f"per-op overhead: forward+backward {g['forward'] + g['backward']:.0%} of the step, {tiny:.0%} of "
                f"it in ops on tensors under {TINY_NUMEL:,} elements ({rest})")
    return f"{LABELS.get(part, part)} {g[part]:.0%} of the step" + (f" ({rest})" if rest else "")


def _with_breaks_tip(recs: list[dict], kind: str, shares: dict, stats: dict) -> list[dict]:
    """Graph breaks in a compiled model, named with their reasons: each splits the step into more graphs and
    more launches, with Python run between them; second under a host verdict (its own first lever), last else."""
    if not stats.get("graph_breaks"):
        return recs
    g = groups(shares)
    host = kind.startswith("host")
    reasons = "; ".join(_break_reason(r) for r in stats.get("graph_break_reasons") or [])
    tip = _tip("remove the graph breaks in the model's forward", f"torch.compile broke the model's graph "
               f"{stats['graph_breaks']} time(s) ({reasons or 'see TORCH_LOGS=graph_breaks'}): the pieces run as "
               "separate graphs with Python between them and nothing fused across; move prints, value-dependent "
               "`if`s and .item() out of forward (torch.where, torch.cond)", g["host"] if host else
               g["forward"] + g["backward"])
    return [*recs[:1], tip, *recs[1:]] if host else [*recs, tip]


def _break_reason(reason: str) -> str:
    """Dynamo's reason in one line: its `Explanation:` where it gives one."""
    lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
    why = next((ln[len("Explanation:"):].strip() for ln in lines if ln.startswith("Explanation:")), lines[0] if lines
               else reason)
    return why[:160]


def _with_callback_reads(recs: list[dict], kind: str, reads: float, share: float) -> list[dict]:
    """Reads of tensor values in train.callbacks' on_step_end: in training no other step reads one (the loop
    reads its figures at log steps), so on a GPU each makes every step wait for the device, which profile's
    drained steps do not show. Second under a host verdict (the host's own work), last else."""
    if reads < 1:
        return recs
    tip = _tip("move the host reads out of train.callbacks' on_step_end", f"the callbacks read {reads:.0f} tensor "
               "value(s) per step (.item(), float(t), .tolist(), .cpu()): on a GPU each waits for the whole step "
               "queued before it, every step, where training otherwise never waits; read them in on_log (every "
               "train.log_every steps) or keep them as tensors until then", share)
    return [*recs[:1], tip, *recs[1:]] if kind.startswith("host") else [*recs, tip]


def _reads_tip(reads: float, share: float) -> dict:
    # CUDA graphs cannot capture a read either: the capture fails on the sync, so that advice is dropped with it
    return _tip("remove the host reads from the model and the loss", f"forward and backward read {reads:.0f} tensor "
                "value(s) per step on the host (.item(), float(t), `if t:`, .tolist(), .cpu().numpy(), t[mask], "
                "torch.nonzero/unique): on a GPU "
                "each waits for every kernel queued before it, anywhere each is a Python round trip; keep such values "
                "as tensors (torch.where(mask, t, 0) for t[mask]), or read them every train.log_every steps in a "
                "callback", share)


LOOP_LOSS = 0.5  # a looping loss with this share of forward's op time is the first of the tiny ops to vectorize


def _loss_tip(run: Run, loop_loss: float, share: float) -> dict:
    return _tip("vectorize the loss", f"{loop_loss:.0%} of forward's torch ops are the loss's (train.loss = "
                f"{run.cfg.train.loss!r}), which runs {LOSS_LOOP_OPS} or more small ops a micro-batch: a Python loop "
                "(per sample, per position) is one op and its Python per iteration, at any batch size; compute it on "
                "the whole batch at once", share)


def _tiny_advice(run: Run, compute: float, loop_loss: float = 0.0) -> list[dict]:
    c = run.cfg.compile
    why = (f"forward+backward are {compute:.0%} of the step, mostly ops on tensors too small for their arithmetic "
           "to outweigh their per-op cost")
    # a per-sample loop costs the same per sample at any batch size: it goes first
    recs = [_loss_tip(run, loop_loss, compute)] if loop_loss >= LOOP_LOSS else []
    recs += _larger_batch(run, why, "each op's cost", compute)
    if not c.enabled:
        recs.append(_rec("compile.enabled=true", f"{why}: compiled, the elementwise ops fuse into fewer", compute))
    recs.append(_tip("vectorize the model's small ops", f"{why}: a Python loop of small tensor ops (per sample, "
                     "per position, per element) is one op per iteration; batch it into one tensor op", compute))
    return recs


def verdict(shares: dict, run: Run, memory: dict, tiny: float = 0.0, reads: float = 0.0,
            f64: float = 0.0, loop_loss: float = 0.0, split: dict | None = None) -> tuple[str, list[dict]]:
    """The bottleneck and ranked recommendations, the verdict's own first: every verdict but compute-bound
    comes with at least one. Each config recommendation can be pasted as it is on this machine: none names a
    device it does not have. `tiny`: tiny_op_share of a CPU step; `reads`: host_reads per step; `f64`:
    f64_share of forward+backward; `split`: loader_split."""
    on_gpu = run.trainee.device.type == "cuda"
    g = groups(shares)
    compute = g["forward"] + g["backward"]
    mem_frac = memory.get("peak_allocated_gib", 0) / memory["device_total_gib"] if memory.get("device_total_gib") else 0
    advice = {"data": lambda r, share: _data_advice(r, share, split), "communication": _comm_advice,
              "host": _host_advice, "optimizer": _optimizer_advice}
    part = bottleneck(shares, 0.0 if on_gpu else tiny)
    if part == "host" and g["host"] < STALLS["host"]:
        kind, recs = "host-overhead-bound", _tiny_advice(run, compute, loop_loss)
    elif part in STALLS or part == "optimizer":
        kind = {"data": "data-bound", "communication": "communication-bound", "optimizer": "optimizer-bound",
                "host": "host/launch-bound" if on_gpu else "host-overhead-bound"}[part]
        recs = advice[part](run, g[part])
    elif mem_frac > 0.9:
        kind, recs = "memory-bound", _memory_advice(run, mem_frac)
    else:
        kind, recs = "compute-bound", []
    if kind.startswith("host") and loop_loss >= LOOP_LOSS:  # the loss's loop is the host's work: no key reaches it
        recs = [_loss_tip(run, loop_loss, recs[0]["evidence_share"]), *recs]
    if kind.startswith("host") and reads >= 1:  # the host waits on itself: no config key removes a read
        recs = [_reads_tip(reads, recs[0]["evidence_share"]), *recs]
    # then the other parts large enough to matter, largest first; compute-side advice last, whatever the verdict
    limits = {**STALLS, "optimizer": OPTIMIZER_SECONDARY}
    for other in sorted(limits, key=lambda k: -g[k]):
        if other != part and g[other] >= limits[other]:
            recs += advice[other](run, g[other])
    if reads >= 1:  # whatever bounds this step, each read is a sync on a GPU, and CUDA graphs cannot capture one
        recs = [r for r in recs if "reduce-overhead" not in r["set"]]
        if not kind.startswith("host"):
            recs.append(_reads_tip(reads, g["host"]))
    if f64 >= F64_SHARE:  # first among the compute levers: no config key turns float64 off
        recs.append(_f64_tip(f64))
    if loop_loss >= LOOP_LOSS:  # under any verdict: a per-sample loop costs as much per sample at any batch size
        recs.append(_loss_tip(run, loop_loss, compute))
    # under any verdict, compute in tiny ops has the host's levers: where compute is a part worth a lever
    if not on_gpu and tiny >= TINY_BOUND and compute >= COMPUTE_SECONDARY:
        recs += _tiny_advice(run, compute, loop_loss)
    recs += _compute_advice(run, compute)
    ranked, seen = [], set()
    for r in recs:  # one fix named by two parts is given once, at its first (higher) rank
        if (key := r["set"] or r["do"]) not in seen:
            seen.add(key)
            ranked.append(r)
    return kind, ranked


MAX_ACTIVE = 200  # the profiler holds every event of the profiled steps in memory until the report
MIN_STEADY = 3  # fewer profiled steps get a note: too few for a median to stand against one slow step


def run_profile(cfg: Config, active: int = 5, warmup: int = 2, wait: int = 1) -> dict:
    """Profile `cfg`'s workload; writes {run_dir}/profile/{trace.json.gz, report.json, report.md}. On SIGTERM or
    Ctrl-C: the scratch folder and half-written files are removed, one `error:` line, exit 128 + the signal
    (SIGTERM's default would end the process with them left in the run's folder and nothing said)."""
    with interrupts():
        try:
            return _run_profile(cfg, active, warmup, wait)
        except Interrupted as e:
            print(f"error: {e} during profile; no report was written (an earlier one is left as it was); rerun "
                  "the same command", file=sys.stderr, flush=True)
            raise SystemExit(128 + e.signum) from None


def _run_profile(cfg: Config, active: int, warmup: int, wait: int) -> dict:
    if isinstance(active, bool) or not isinstance(active, int) or not 1 <= active <= MAX_ACTIVE:
        raise UserError(f"--active must be an integer from 1 to {MAX_ACTIVE} (profiled steps), not {active!r}")
    n_warm = 3 if cfg.compile.enabled else 1
    total = n_warm + wait + warmup + active
    periods = {"eval": cfg.train.eval_every, "checkpoint": cfg.checkpoint.every,  # the user's, before the probe's
               "log": cfg.train.log_every}
    cfg = replace(cfg, train=replace(cfg.train, steps=max(total, cfg.train.steps)),
                  checkpoint=replace(cfg.checkpoint, every=0, resume="never"))
    run_dir = RunDir(cfg.run, is_main=False).path
    _refuse_live_run(run_dir)  # before the build: nothing is done for a profile that cannot be written
    _refuse_links(run_dir / "profile")
    try:  # the caller's RNG, TF32 and environment are theirs again after it, as after train()
        with process_state_kept(), attention_backend(cfg.kernels.attention, resolve_device(cfg.run.device)):
            run = prepare(cfg, probe=True)
            with model_ops(run.cfg.kernels):  # resolved by prepare, as train holds them
                return _profile(run, n_warm, wait, warmup, active, periods)
    finally:
        phases.enable(False)
        shutdown()


def _refuse_live_run(run_dir: Path) -> None:
    """profile takes no lock (it builds with probe=True): a run training in `run_dir` now would share the
    machine with the profiled steps and see a folder written beside its own."""
    held = RunDir.lock_held(run_dir)
    if held is None:
        say(f"profile: cannot tell whether a run holds {run_dir} (its lock is unreadable); profiling anyway")
    if held:
        raise UserError(f"{run_dir} is training now{RunDir.lock_holder(run_dir)}: profile under another run.name")


def _refuse_links(out: Path, suffix: str = "") -> None:
    """Nothing is written through a symbolic link in a run directory: not the profile folder, not its files."""
    refuse_links([out / n for n in (f"trace{suffix}.json.gz", "report.json", "report.md",
                                    f"memory_snapshot{suffix}.pickle")], folders=[out])


@contextlib.contextmanager
def _written_whole(path: Path):
    """A temporary file beside `path`, renamed over it once written: no half file on a failure, and no write
    through whatever sits at `path`."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as e:
        raise UserError(f"cannot write {path} ({e.strerror or e}); check run.out_dir and free space") from None
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:  # a full disk
        raise UserError(f"cannot write {path} ({e.strerror or e}); free space under run.out_dir") from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def _one_step(run: Run, first: bool = False, hooks: Hooks | None = None) -> tuple[float, torch.Tensor]:
    """One train step timed on a drained device, with the data fetch as its own phase, then the callbacks'
    on_step_end where training calls it (host time outside the phases: host overhead); (seconds, loss)."""
    t0, tr = time.perf_counter(), run.trainee
    with phases.phase("data"):
        micro = [next(run.batches) for _ in range(run.cfg.train.grad_accum)]
    if first:  # compile happens here (a compiler error falls back to eager), shapes fail here, as in train
        loss, _ = first_train_step(tr, micro, run.cfg.train.grad_clip)
    else:
        loss, _ = train_step(tr, micro, run.cfg.train.grad_clip, want_norm=False)
    if hooks is not None:
        t1 = time.perf_counter()
        with phases.phase("callbacks"):  # a range of its own: the reads its hooks make are counted apart
            hooks.call("on_step_end", 0)
        hooks.spent += time.perf_counter() - t1
    sync(tr.device)
    return time.perf_counter() - t0, loss


def _loss_split(tr) -> torch.nn.Module | None:
    """The user's model where a separate train.loss follows it in eager forward: its calls are ranged so that
    forward's ops outside them are the loss's (compiled, one graph holds both; model/fused losses are inside)."""
    wl = getattr(tr.step_module, "module", tr.step_module)  # DDP wraps WithLoss
    if tr.compiled or not isinstance(wl, WithLoss) or wl.loss_fn is None or wl.fused_loss is not None:
        return None
    return wl.model


LOSS_LOOP_OPS = 32  # torch ops a forward's loss calls past which it is a Python loop (a built-in loss is 1 or 2)


def loop_loss_share(events) -> float:
    """The share of forward's torch ops called by the loss (outside the model's ranges, phases.MODEL), where it
    calls LOSS_LOOP_OPS or more a forward (a per-sample loop); else 0. Counts, not times: in a tiny model a
    built-in loss can take most of forward's time too, and a loaded machine moves times, never counts."""
    fwd = [e for e in events if e.name == phases.PREFIX + "forward"]
    model = sum(1 for e in fwd for m in _ranges(e, phases.MODEL) for _ in _calls(m))
    loss = sum(1 for e in fwd for _ in _calls(e, skip=phases.MODEL))
    return loss / (loss + model) if model and loss / len(fwd) >= LOSS_LOOP_OPS else 0.0


def _ranges(evt, name: str):
    """The outermost ranges called `name` under `evt`."""
    for c in evt.cpu_children:
        yield from ((c,) if c.name == name else _ranges(c, name))


def _record(run: Run, wait: int, warmup: int, active: int, hooks: Hooks | None = None
            ) -> tuple[profile, list[float], list[torch.Tensor]]:
    on_gpu = run.trainee.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    phases.enable(True)
    times, losses = [], []
    with phases.model_range(_loss_split(run.trainee)), \
            profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active),
                    record_shapes=True, profile_memory=True, with_stack=False) as prof:
        for i in range(wait + warmup + active):
            if hooks is not None and i == wait + warmup:  # the callbacks' time in the profiled steps alone
                hooks.spent = 0.0
            t, loss = _one_step(run, hooks=hooks)
            times.append(t)
            losses.append(loss)  # read after the timed steps: reading one now would add a sync to each
            prof.step()
    phases.enable(False)
    return prof, times[-active:], losses[-active:]


def _memory(run: Run, out: Path, suffix: str) -> dict:
    device = run.trainee.device
    memory = {"peak_allocated_gib": round(peak_mem_gib(device), 3)}
    if device.type == "cuda":
        memory["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved(device) / 2**30, 3)
        memory["device_total_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
        # one more step with allocation history on, after the timed ones (recording slows the host)
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        _one_step(run)
        with _written_whole(out / f"memory_snapshot{suffix}.pickle") as tmp:
            torch.cuda.memory._dump_snapshot(tmp)
        torch.cuda.memory._record_memory_history(enabled=None)
        memory["snapshot"] = f"memory_snapshot{suffix}.pickle (open at https://pytorch.org/memory_viz)"
    return memory


def _profile(run: Run, n_warm: int, wait: int, warmup: int, active: int, periods: dict) -> dict:
    out, tr = run.rundir.path / "profile", run.trainee
    suffix = "" if run.env.is_main else f"-rank{run.env.rank}"  # torchrun: one trace per rank, one report
    _refuse_links(out, suffix)
    make_dir(out)
    on_gpu = tr.device.type == "cuda"
    tr.model.train()
    say(f"profile: {n_warm} warm-up step(s) (compile, allocator), then wait {wait} / warmup {warmup} / active {active}")
    with _scratch(out, suffix) as scratch:  # whatever the user's hooks and the timed save write goes with it
        hooks = _hooks(run, scratch)
        _warm_up(run, n_warm, hooks)
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(tr.device)
        with Heartbeat("profile: recording the profiled steps"):
            prof, times, losses = _record(run, wait, warmup, active, hooks)
        memory = _memory(run, out, suffix)
        with Heartbeat("profile: timing the loop's evaluation and checkpoint save"):
            loop = _loop_work(run, scratch, periods, hooks, active, statistics.fmean(times), losses[-1])
        layers = layer_times(run)
    # the parts are per-step means: so is the whole they share
    per, top = analyze(prof.events(), statistics.fmean(times), active, on_gpu)
    total = sum(per.values()) or 1.0
    shares = {k: v / total for k, v in per.items()}
    split = _loader_read(run, shares, per["data_wait"])
    tiny, reads, cb_reads = (0.0 if on_gpu else tiny_op_share(prof.events()), host_reads(prof.events(), active),
                             host_reads(prof.events(), active, ("callbacks",)))
    f64, loop_loss = f64_share(prof.events()), loop_loss_share(prof.events())
    kind, recs = verdict(shares, run, memory, tiny, reads, f64, loop_loss, split)
    recs = _with_breaks_tip(_with_callback_reads(recs, kind, cb_reads, loop["callbacks_ms_per_step"] / 1e3 / total),
                            kind, shares, compile_stats() if tr.compiled else {})
    kind, recs, part, detail = _loop_verdict(loop, total, shares, kind, recs, bottleneck(shares, tiny),
                                             _layer_detail(layers, kind, describe(shares, tiny)))
    notes = _notes(run, bad := sum(not math.isfinite(float(loss)) for loss in losses), len(losses))
    _write_trace(prof, out, suffix)
    report = {
        "workload": run.cfg.run.name, "device": run.info["device_name"], "dtype": tr.dtype, "torch": torch.__version__,
        "compile": run.info["compile"] and {**run.info["compile"], **compile_stats(), "fell_back": not tr.compiled},
        "strategy": run.cfg.parallel.strategy, "global_batch": run.cost.global_batch,
        "step_ms_median": statistics.median(times) * 1e3, "step_ms_mean": statistics.fmean(times) * 1e3,
        "steps_profiled": active,
        "step_ms_profiled": [t * 1e3 for t in times], "breakdown_ms": {k: v * 1e3 for k, v in per.items()},
        "breakdown_share": shares,
        "gpu_busy_share": 1 - shares["host_overhead"] - shares["data_wait"] if on_gpu else None,
        "verdict": kind, "bottleneck": part, "verdict_detail": detail,
        "tiny_op_share": None if on_gpu else round(tiny, 4), "host_reads_per_step": reads,
        "callback_reads_per_step": cb_reads,
        "float64_op_share": round(f64, 4), "loop_loss_share": round(loop_loss, 4), "loader_split_ms": split,
        "recommendations": recs, "optimizer": optimizer_facts(tr.opt), "loss_finite": not bad, "notes": notes,
        "loop": loop, "layers": layers, "top_ops": top, "memory": memory,
        "method": "phases from torch.profiler ranges (device time of the kernels each launched on GPU, host time of "
                  "the ops inside on CPU); step wall time on a drained device; host_overhead = wall - measured parts",
        "trace": "trace.json.gz (Perfetto: ui.perfetto.dev; TensorBoard profiler)",
    }
    if run.env.is_main:  # the report is rank 0's view; every rank keeps its own trace
        markdown = format_report(report)
        write_run_file(out / "report.json", json.dumps(report, indent=2))
        write_run_file(out / "report.md", markdown + "\n")
        print(markdown)
        say(f"profile: wrote {out}")
    return report


LAYER_BOUND = 0.5  # one layer with this share of forward's time is where compute's cost is, and is named


def layer_times(run: Run, passes: int = 5) -> list[dict]:
    """Each module's own forward time (its children's taken out), largest first: the least of up to `passes`
    forwards of one batch (two at least, more within a second: on a shared machine a pass can lose a time slice
    inside any one layer, and a second may too), outside the profiled steps (the hooks' Python would read as host
    overhead there), without gradients. Eager, one process only: hooks do not fire inside a compiled graph, and a
    rank's extra forward would make DDP/FSDP/pipeline ranks wait on each other. [] where not measured."""
    tr = run.trainee
    if tr.compiled or run.env.world_size > 1 or not isinstance(tr.step_module, WithLoss):
        return []
    named = dict(tr.step_module.model.named_modules())
    spent: dict[str, list[float]] = {n: [] for n in named}
    stack: list[list] = []  # [name, start, children's time]

    def enter(name):
        def hook(m, args):
            sync(tr.device)
            stack.append([name, time.perf_counter(), 0.0])
        return hook

    def leave(m, args, out):
        sync(tr.device)
        name, t0, inner = stack.pop()
        whole = time.perf_counter() - t0
        if stack:
            stack[-1][2] += whole
        spent[name].append(whole - inner)

    handles = [h for n, m in named.items() for h in (m.register_forward_pre_hook(enter(n)),
                                                      m.register_forward_hook(leave))]
    try:
        x, y = next(run.batches)
        best: dict[str, float] = {}
        with torch.no_grad():
            start = time.perf_counter()
            for i in range(passes):  # a module called k times a forward (a shared block) costs k calls a pass
                if i >= 2 and time.perf_counter() - start > 1.0:
                    break
                for v in spent.values():
                    v.clear()
                stack.clear()
                with precision.autocast(tr.dtype, tr.device):
                    tr.step_module(x, y)
                best = {n: min(sum(v), best.get(n, math.inf)) for n, v in spent.items() if v}
    except Exception as e:  # a forward that needs gradients, a hook the model refuses: the report goes on without
        say(f"warning: profile could not time the model's layers ({type(e).__name__}: {str(e)[:120]}); the report "
            "has no per-layer times")
        return []
    finally:
        for h in handles:
            h.remove()
    own = best
    total = sum(own.values()) or 1.0
    return [{"module": n or "(the model's own forward)", "type": _layer_type(named[n]), "ms": t * 1e3,
             "share_of_forward": t / total} for n, t in sorted(own.items(), key=lambda kv: -kv[1])[:8]]


def _layer_type(m: torch.nn.Module) -> str:
    """A leaf layer as torch prints it (its shapes: `Conv2d(16, 64, kernel_size=(5, 5), ...)`), else its class."""
    return repr(m)[:100] if not any(True for _ in m.children()) else type(m).__name__


def _layer_detail(layers: list[dict], kind: str, detail: str) -> str:
    """Under a compute verdict, the one layer that holds most of forward's own time is named: the cost is its
    shapes'. No fix is made up for it: the config's compute levers are ranked already, and the layer's size is
    the model's design, not a setting."""
    if kind != "compute-bound" or not layers or layers[0]["share_of_forward"] < LAYER_BOUND:
        return detail
    top = layers[0]
    return f"{detail}; {top['share_of_forward']:.0%} of forward is `{top['module']}` ({top['type']})"


def _warm_up(run: Run, n_warm: int, hooks: Hooks | None) -> None:
    with Heartbeat("profile: warming up (compile happens in the first step)"):
        for i in range(n_warm):
            _one_step(run, first=i == 0, hooks=hooks)


def _write_trace(prof: profile, out: Path, suffix: str) -> None:
    with _written_whole(out / f"trace{suffix}.json.gz") as gz:
        fd, raw = tempfile.mkstemp(dir=out, prefix=f".trace{suffix}.", suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(raw)
            with open(raw, "rb") as f, gzip.open(gz, "wb") as g:
                shutil.copyfileobj(f, g)
        finally:
            Path(raw).unlink(missing_ok=True)


@contextlib.contextmanager
def _scratch(out: Path, suffix: str):
    """A folder inside profile/ for the run's own writers (callbacks' run_dir, the timed checkpoint), gone after:
    profiling leaves the run's folder alone. One per rank: no rank removes another's."""
    path = out / f".scratch{suffix}"
    if path.is_symlink():
        raise UserError(f"{path} is a symbolic link; profile writes nothing through one: remove it")
    shutil.rmtree(path, ignore_errors=True)
    make_dir(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _hooks(run: Run, scratch: Path) -> Hooks | None:
    """train.callbacks, built as training builds them, with the scratch folder as their run_dir."""
    if not run.cfg.train.callbacks:
        return None
    hooks = Hooks(build_callbacks(run.cfg.train.callbacks), run.cfg.train.steps, run.trainee.model, scratch)
    hooks.call("on_train_start", 0)  # what on_step_end may rely on (a file opened, a client made) is set up here
    hooks.spent = 0.0
    return hooks


def _loop_work(run: Run, scratch: Path, periods: dict, hooks: Hooks | None, active: int, step_s: float,
               loss: torch.Tensor) -> dict:
    """The training loop's work outside the step, measured once each here and spread over the steps between
    them: an evaluation every train.eval_every steps (the one at a run's end is no per-step cost), a checkpoint
    every checkpoint.every, the callbacks' on_log every train.log_every, and the callbacks' on_step_end in each
    step (part of the step's host overhead)."""
    tr, d, t = run.trainee, run.cfg.data, run.cfg.train
    loop = {"callbacks_ms_per_step": (hooks.spent / active * 1e3) if hooks is not None else 0.0,
            **_log_work(run, hooks, periods["log"], step_s, loss)}
    if periods["eval"] and run.val_ds is not None and d.eval_batches:
        for _ in range(2 if tr.compiled else 1):  # the first compiles eval's graphs: a cost once a run, not each
            sync(tr.device)
            t0 = time.perf_counter()
            evaluate(tr, run.val_ds, d.batch_size, d.eval_batches, t.grad_accum, run.env, eval_metric_fns(t))
            sync(tr.device)
        loop["eval"] = _periodic(time.perf_counter() - t0, periods["eval"])
    if periods["checkpoint"] and run.env.world_size == 1:  # ranks save into one folder: not a scratch per rank
        ckpt = copy.copy(run.ckpt)
        ckpt.dir = scratch / "checkpoints"
        t0 = time.perf_counter()
        replace(run, ckpt=ckpt).save_checkpoint(1, wait=True)
        loop["checkpoint"] = _periodic(time.perf_counter() - t0, periods["checkpoint"])
    return loop


def _log_work(run: Run, hooks: Hooks | None, every: int, step_s: float, loss: torch.Tensor) -> dict:
    """The callbacks' on_log, timed on a row shaped as training's (this profile's figures): a callback that
    cannot take it is said, not fatal (its training rows carry what this one lacks)."""
    if hooks is None or not hooks.reads_rows():
        return {}
    tr, b = run.trainee, run.cost.global_batch
    row = {"step": every, "loss": float(loss), "lr": float(tr.opt.param_groups[0]["lr"]),
           "grad_norm": 0.0, "samples_per_s": b / step_s if step_s > 0 else 0.0, "step_ms": step_s * 1e3,
           "data_wait_pct": 0.0, "mfu": None, "peak_mem_gib": peak_mem_gib(tr.device)}
    t0 = time.perf_counter()
    try:
        hooks.log(row)
    except UserError as e:
        say(f"warning: profile could not time the callbacks' on_log ({e}); its time is not in this report")
        return {}
    return {"log": _periodic(time.perf_counter() - t0, every)}


def _periodic(seconds: float, every: int) -> dict:
    return {"ms_each": seconds * 1e3, "every": every, "ms_per_step": seconds * 1e3 / every}


LOOP_WORK = ("eval", "checkpoint", "log")  # the loop's periodic work, each with its own period key
LOOP_KEYS = {"eval": "train.eval_every", "checkpoint": "checkpoint.every", "log": "train.log_every"}
LOOP_NAMES = {"log": "callbacks' on_log"}
LOOP_BOUND = 0.3  # eval or checkpoint work above this share of the run's time bounds it, as a stall would
LOOP_SECONDARY = 0.1  # above this share its advice is given under any verdict


def _loop_verdict(loop: dict, step_s: float, shares: dict, kind: str, recs: list[dict], part: str,
                  detail: str) -> tuple[str, list[dict], str, str]:
    """Eval and checkpoint work spread over the steps weighed against the step itself: where it takes most of
    the run's time, it is the verdict and its fix comes first (the step's own verdict follows in the detail)."""
    per_step = {k: loop[k]["ms_per_step"] / 1e3 for k in LOOP_WORK if k in loop}
    whole = step_s + sum(per_step.values())
    found = sorted((k for k in per_step if per_step[k] / whole >= LOOP_SECONDARY), key=lambda k: -per_step[k])
    own = [_loop_rec(k, loop[k], step_s, per_step[k] / whole) for k in found]
    cb = loop["callbacks_ms_per_step"] / 1e3 / step_s if step_s > 0 else 0.0
    if cb >= LOOP_SECONDARY and part == "host":  # the host overhead is the callbacks' own
        recs = [_tip("make train.callbacks' on_step_end cheaper", f"the callbacks' on_step_end takes {cb:.0%} of "
                     "the step (in the host overhead): do its work every train.log_every steps in on_log, or in a "
                     "background thread", cb), *recs]
    if found and sum(per_step.values()) / whole >= LOOP_BOUND:
        top = found[0]
        return (f"{top}-bound", [*own, *recs], top,
                f"{top} {per_step[top] / whole:.0%} of the run's time: {loop[top]['ms_each']:.1f} ms every "
                f"{loop[top]['every']} step(s) beside a {step_s * 1e3:.1f} ms step (the step itself: {kind}, {detail})")
    return kind, [*recs, *own], part, detail


def _loop_rec(what: str, work: dict, step_s: float, share: float) -> dict:
    """The period at which this work costs about 5% of the step."""
    every = max(work["every"] + 1, math.ceil(work["ms_each"] / 1e3 / (0.05 * step_s)))
    key, what = LOOP_KEYS[what], "log step's on_log (train.callbacks)" if what == "log" else what
    return _rec(f"{key}={every}", f"one {what} takes {work['ms_each']:.1f} ms, {work['ms_each'] / 1e3 / step_s:.1f}x "
                f"a step, every {work['every']} step(s): {share:.0%} of the run's time; every {every} steps it is "
                "about 5% of it", share)


def _notes(run: Run, bad: int, steps: int) -> list[str]:
    """What the breakdown does not show, each also said as a warning."""
    notes = []
    if steps < MIN_STEADY:  # a single step's time moves with the machine's load, and a verdict with it
        notes.append(f"only {steps} profiled step(s): a step's time varies with the machine's load (another process, "
                     f"a collector pause), and the verdict can change with it; profile {MIN_STEADY + 2} or more "
                     f"(--active {MIN_STEADY + 2})")
    if bad:  # a diverged model's timings are real but not the ones the healthy model will have
        notes.append(f"the loss was non-finite in the profiled steps: these are timings of a diverged model ({bad} "
                     f"of {steps} steps; NaN/inf values can take other kernel paths); fix the divergence first")
    if run.cfg.train.callbacks:  # on_step_end runs in each profiled step; the hooks of log steps do not
        notes.append(f"train.callbacks ({', '.join(run.cfg.train.callbacks)}): on_step_end ran in each profiled "
                     "step (its time is host overhead) and on_log once, spread over train.log_every steps; their "
                     "hooks of eval and checkpoint steps do not run in profile: whatever time those take in training "
                     "is not in this breakdown")
    for note in notes:
        say(f"warning: {note}")
    return notes


def _loop_lines(loop: dict) -> list[str]:
    """The loop's work outside the step: not in the table's parts, which sum to the step."""
    parts = [f"{LOOP_NAMES.get(k, k)} {w['ms_each']:.1f} ms every {w['every']} step(s) ({w['ms_per_step']:.2f} ms/step)"
             for k in LOOP_WORK if (w := loop.get(k))]
    if loop.get("callbacks_ms_per_step"):
        parts.append(f"callbacks' on_step_end {loop['callbacks_ms_per_step']:.2f} ms/step (inside host overhead)")
    return ["", "Outside the step: " + "; ".join(parts) + "."] if parts else []


def format_report(r: dict) -> str:
    c = r["compile"]
    how = (f"compile {c['mode']}/{c['scope']}, {c['graph_breaks']} graph breaks, {c['recompiles']} recompiles"
           + (", fell back to eager" if c["fell_back"] else "")) if c else "eager"
    lines = [f"# Profile: {r['workload']} on {r['device']} ({r['dtype']}, {how}, strategy {r['strategy']})", "",
             f"Median step {r['step_ms_median']:.2f} ms over {r['steps_profiled']} profiled steps "
             f"(global batch {r['global_batch']}); the parts below are per-step means, summing to the mean step "
             f"{sum(r['breakdown_ms'].values()):.2f} ms.", ""]
    lines += [f"**Warning:** {n}." for n in r.get("notes", [])] + ([""] if r.get("notes") else [])
    lines += [f"**Verdict: {r['verdict']}** — {r['verdict_detail']}", "", "| part | ms/step | share |", "|---|---|---|"]
    for k in PARTS:
        lines.append(f"| {k.replace('_', ' ')} | {r['breakdown_ms'][k]:.2f} | {r['breakdown_share'][k]:.1%} |")
    lines += _loop_lines(r.get("loop") or {})
    if r.get("layers"):  # measured apart from the profiled steps: each module's own forward, children taken out
        lines += ["", "Forward by layer (own time, measured apart): " + ", ".join(
            f"`{la['module']}` {la['share_of_forward']:.0%}" for la in r["layers"][:5]) + "."]
    o = r["optimizer"]
    lines += ["", f"Optimizer: {o['name']} ({o['impl']}), {_count(o['params'])} parameters, "
              f"{o['state_mib']} MiB of state.", "", "## Recommendations (ranked)", ""]
    if not r["recommendations"]:  # verdict() gives every other verdict at least one fix
        lines.append("None: the step is spent in compute with no obvious lever left." if r["verdict"] == "compute-bound"
                     else f"None found for a {r['verdict']} step.")
    for i, rec in enumerate(r["recommendations"], 1):
        what = f"`{rec['set']}`" if rec["set"] else rec["do"]
        lines.append(f"{i}. {what} — {rec['why']} (evidence share {rec['evidence_share']:.0%})")
    lines += ["", "## Top ops by self time", "", "| op | class | ms/step | share |", "|---|---|---|---|"]
    for op in r["top_ops"][:10]:
        lines.append(f"| `{op['name'][:70]}` | {op['class']} | {op['ms_per_step']:.3f} | "
                     f"{op['share_of_op_time']:.1%} |")
    m = r["memory"]
    lines += ["", f"Memory: peak allocated {m['peak_allocated_gib']} GiB"
              + (f", reserved {m['peak_reserved_gib']} GiB of {m['device_total_gib']} GiB; snapshot {m['snapshot']}"
                 if "peak_reserved_gib" in m else " (process peak RSS on CPU)"),
              f"Trace: {r['trace']}"]
    return "\n".join(lines)
