"""DDP: gradients all-reduced in buckets that overlap backward; no_sync skips it on accumulation steps."""
from __future__ import annotations

import contextlib
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from turbotrain.distributed.parallel import ParallelConfig
from turbotrain.errors import UserError
from turbotrain.log import say


def apply_ddp(model: nn.Module, device: torch.device, cfg: ParallelConfig) -> DDP:
    """`apply_ddp(model, device, cfg)` → the wrapped model. Buckets are views of the gradients
    (gradient_as_bucket_view: no copy in or out of the buckets)."""
    if cfg.sync_batchnorm and has_batchnorm(model):
        if device.type != "cuda":
            raise UserError("parallel.sync_batchnorm = true on the CPU: torch's SyncBatchNorm runs on GPUs only; "
                            "set parallel.sync_batchnorm=false (each rank then normalises by its own micro-batch)")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        say("ddp: BatchNorm layers synchronized across ranks (SyncBatchNorm)")
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
              bucket_cap_mb=cfg.bucket_cap_mb, gradient_as_bucket_view=True, static_graph=cfg.static_graph)
    if cfg.grad_compression == "bf16":
        ddp.register_comm_hook(None, bf16_allreduce_hook)
    _LIVE.add(ddp)
    return ddp


def bf16_allreduce_hook(state: object, bucket):  # -> Future[Tensor]; DDP rejects string annotations
    """Each gradient bucket (a dist.GradBucket) crosses the wire in bf16, half the bytes, and lands back
    in fp32 for the optimizer. torch ships the same idea (`bf16_compress_hook`) for NCCL only; this one
    runs on gloo too."""
    buf = bucket.buffer()
    half = buf.to(torch.bfloat16).div_(dist.get_world_size())
    fut = dist.all_reduce(half, async_op=True).get_future()

    def unpack(f: torch.futures.Future) -> torch.Tensor:
        buf.copy_(f.value()[0])
        return buf

    return fut.then(unpack)


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def rank0_running_stats(model: nn.Module) -> None:
    """Every rank takes rank 0's BatchNorm running statistics; call on all ranks at once (evaluation's start).
    They are buffers that each rank updates from its own micro-batches (DDP's broadcast_buffers sends rank 0's
    before a training forward, so the last one's update differs; FSDP2 never sends them): evaluation ran a
    different model on each rank (val_loss a mean over them, no model's) while checkpoints and final/ keep
    rank 0's. Usage: `model.eval(); rank0_running_stats(model)`."""
    if not dist.is_initialized():
        return
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            for b in m.buffers():
                dist.broadcast(b, src=0)


_LIVE: "weakref.WeakSet[DDP]" = weakref.WeakSet()


def release_reducers() -> None:
    """Drop every live DDP's reducer; call before destroying the process group.

    The reducer holds the process group from C++ and is freed with the GIL held. Were it the group's last
    holder, gloo's destructor would join its worker threads while one of them waits for the GIL to free
    a finished all-reduce's tensors: a deadlock at exit (seen as a rare hang of 2-rank CPU runs). Freed
    here, while the group is still registered, the reducer is never the last holder."""
    for ddp in list(_LIVE):
        for attr in ("logger", "reducer"):  # the logger keeps the reducer alive too
            ddp.__dict__.pop(attr, None)
    _LIVE.clear()


@contextlib.contextmanager
def grad_sync(model: nn.Module, last_micro_step: bool):
    """Reduce gradients on the last micro-batch of an accumulation only: DDP's no_sync, FSDP2's
    set_requires_gradient_sync (unsharded grads accumulate locally until then). A no-op otherwise.
    Under parallel.static_graph DDP records the graph in its first synced backward and fails an internal assert
    when that backward is a no_sync one: the first step's micro-batches all reduce (a mean of sums is the sum of
    means: the same gradients, one step's extra traffic)."""
    if isinstance(model, DDP) and not last_micro_step and not _recording(model):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(last_micro_step)
        yield
    else:
        yield


def _recording(model: DDP) -> bool:
    """A static-graph DDP before its first synced backward (torch's own flag for it)."""
    return model.static_graph and not getattr(model, "_static_graph_delay_allreduce_enqueued", False)
