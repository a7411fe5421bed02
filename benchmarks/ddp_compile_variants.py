"""DDP + compile, outside the trainer: GPT-2 124M (B16, T1024, bf16 autocast, fused AdamW) in a loop shaped like
the plain-PyTorch anchor, to tell what DDP costs from what the trainer adds. On a CPU: a tiny shape, host time.

VARIANT (how compile meets DDP):
  inplace_outer        ours: DDP(WithLoss(model)).compile(); dynamo splits the graph at bucket boundaries
  torch_compile_outer  the anchor's: torch.compile(DDP(...))
  inplace_inner        WithLoss compiled in place, DDP around it
Environment: CLIP=none|ours|torch|compiled adds clipping (ours: turbotrain's clip_grad_norm; torch:
clip_grad_norm_(foreach=True); compiled: ours under torch.compile); BUCKET_MB sets DDP's bucket_cap_mb (25, torch's
default and the anchor's; the trainer's is 100).
Prints, from rank 0: median ms/step over 5 x 20 steps after 8 warm-up steps, tokens/s per GPU, the host time
of the clip call, graph breaks.

Run: [CLIP=ours] torchrun --standalone --nproc_per_node=N benchmarks/ddp_compile_variants.py VARIANT
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel as DDP

from turbotrain.accel.compile import WithLoss
from turbotrain.accel.optim import clip_grad_norm
from turbotrain.models.gpt import GPT

VARIANT, CLIP, BUCKET_MB = sys.argv[1], os.environ.get("CLIP", "none"), int(os.environ.get("BUCKET_MB", "25"))
clip_fn = {"none": None, "ours": clip_grad_norm, "compiled": torch.compile(clip_grad_norm),
           "torch": lambda ps, c: torch.nn.utils.clip_grad_norm_(list(ps), c, foreach=True)}[CLIP]

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)
V, T, B = (50304, 1024, 16) if cuda else (64, 32, 2)


def ce(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


torch.manual_seed(0)
model = GPT(vocab_size=V, block_size=T, n_layer=12, n_head=12 if cuda else 2, n_embd=768 if cuda else 32).to(dev)
wl = WithLoss(model, ce)
ddp = dict(gradient_as_bucket_view=True, bucket_cap_mb=BUCKET_MB)
if VARIANT == "inplace_outer":
    step = DDP(wl, **ddp)
    step.compile()
elif VARIANT == "torch_compile_outer":
    step = torch.compile(DDP(wl, **ddp))
elif VARIANT == "inplace_inner":
    wl.compile()
    step = DDP(wl, **ddp)
else:
    raise SystemExit(f"unknown variant {VARIANT}")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda, foreach=not cuda)
data = torch.randint(0, V, (4, B, T + 1), device=dev, generator=torch.Generator(device=dev).manual_seed(dist.get_rank()))
host_clip = []


def one(i):
    d = data[i % 4]
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = step(d[:, :-1], d[:, 1:])
    loss.backward()
    if clip_fn is not None:
        t0 = time.perf_counter()
        clip_fn(model.parameters(), 1.0)
        host_clip.append(time.perf_counter() - t0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def drain():
    if cuda:
        torch.cuda.synchronize()


for i in range(8):
    one(i)
drain()
times = []
for _ in range(5):
    t0 = time.perf_counter()
    for i in range(20):
        loss = one(i)
    drain()
    times.append((time.perf_counter() - t0) / 20)
dt = statistics.median(times)
if dist.get_rank() == 0:
    print(f"world={dist.get_world_size()} {VARIANT} clip={CLIP} bucket_mb={BUCKET_MB} ms/step {dt * 1e3:.2f} "
          f"tok/s/gpu {B * T / dt:.0f} host_clip_ms {statistics.median(host_clip) * 1e3 if host_clip else 0:.3f} "
          f"graph_breaks {sum(counters['graph_break'].values())} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
