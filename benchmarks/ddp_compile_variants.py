# DDP + compile: where the compile is applied (ours: DDP(WithLoss).compile(); the anchor: torch.compile(DDP(...));
# inner: WithLoss compiled in place, DDP around it). Steady ms/step (median of 5 x 20 steps after 8 warm-up),
# graph breaks. GPU: GPT-2 124M, B16 T1024, bf16 autocast, fused AdamW. CPU: a tiny shape, host time only.
# CLIP=none|ours|torch|compiled adds gradient clipping to the step (ours: turbotrain's clip_grad_norm; torch:
# clip_grad_norm_(foreach=True); compiled: ours under torch.compile); host_clip_ms is the host time of that call.
# Run: [CLIP=...] torchrun --standalone --nproc_per_node=N benchmarks/ddp_compile_variants.py VARIANT
import os, sys, time, statistics, torch, torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from turbotrain.models.gpt import GPT
from turbotrain.accel.compile import WithLoss
from torch._dynamo.utils import counters
from turbotrain.accel.optim import clip_grad_norm
CLIP = os.environ.get("CLIP", "none")
clip_fn = {"none": None, "ours": clip_grad_norm, "compiled": torch.compile(clip_grad_norm),
           "torch": lambda ps, c: torch.nn.utils.clip_grad_norm_(list(ps), c, foreach=True)}[CLIP]
host_clip = []
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
if dev.type == "cuda": torch.cuda.set_device(int(os.environ["LOCAL_RANK"])); dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
big = dev.type == "cuda"
V, T, B = (50304, 1024, 16) if big else (64, 32, 2)
def ce(o, y): return F.cross_entropy(o.reshape(-1, o.shape[-1]), y.reshape(-1))
which = sys.argv[1]
torch.manual_seed(0)
m = GPT(vocab_size=V, block_size=T, n_layer=12, n_head=12 if big else 2, n_embd=768 if big else 32).to(dev)
wl = WithLoss(m, ce)
if which == "inplace_outer":      # ours today: DDP(WithLoss).compile()
    step = DDP(wl, gradient_as_bucket_view=True); step.compile()
elif which == "torch_compile_outer":  # the anchor's: torch.compile(DDP(...))
    step = torch.compile(DDP(wl, gradient_as_bucket_view=True))
elif which == "inplace_inner":    # compile the module, then DDP around it
    wl.compile(); step = DDP(wl, gradient_as_bucket_view=True)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=big, foreach=not big)
g = torch.Generator(device=dev).manual_seed(0)
data = torch.randint(0, V, (4, B, T + 1), device=dev, generator=g)
def one(i):
    d = data[i % 4]
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = step(d[:, :-1], d[:, 1:])
    loss.backward()
    if clip_fn is not None:
        t0 = time.perf_counter(); clip_fn(m.parameters(), 1.0); host_clip.append(time.perf_counter() - t0)
    opt.step(); opt.zero_grad(set_to_none=True)
    return loss
for i in range(8): one(i)
if big: torch.cuda.synchronize()
ts = []
for r in range(5):
    t0 = time.perf_counter()
    for i in range(20): one(i)
    if big: torch.cuda.synchronize()
    ts.append((time.perf_counter() - t0) / 20)
dt = statistics.median(ts)
if dist.get_rank() == 0:  # world 2: rank 0 speaks for both
    print(which, "clip", CLIP, "host_clip_ms", round(statistics.median(host_clip) * 1e3, 3) if host_clip else None, "ms/step", round(dt * 1e3, 2), "tok/s", round(B * T / dt), "graph_breaks", sum(counters["graph_break"].values()),
          "unique_graphs", counters["stats"].get("unique_graphs"), flush=True)
dist.destroy_process_group()
