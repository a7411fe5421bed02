"""FSDP2's optimizer step on local shards, in a 1-rank gloo process (a subprocess: gloo threads outlive the
process group once FSDP is imported)."""
import subprocess
import sys

SHARD_STEP = r'''
import os, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from turbotrain.accel.optim import build_optimizer, clip_grad_norm
from turbotrain.distributed.fsdp import shard_local_step
dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
def make():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    fully_shard(m)
    return m
a, b = make(), make()
oa = build_optimizer(a, "adamw", 1e-2, 0.1, torch.device("cpu"), "fused")
ob = shard_local_step(build_optimizer(b, "adamw", 1e-2, 0.1, torch.device("cpu"), "fused"))
x = torch.randn(4, 6)
for step in range(4):
    for m, o in ((a, oa), (b, ob)):
        m(x).square().mean().backward()
        clip_grad_norm(list(m.parameters()), 0.5)
        o.step()
        o.zero_grad(set_to_none=True)
for p, q in zip(a.parameters(), b.parameters()):
    assert torch.equal(p.full_tensor(), q.full_tensor()), "local-shard step diverged"
sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
assert sa.keys() == sb.keys() and all(type(sb[k]["exp_avg"]).__name__ == "DTensor" for k in sb)
assert all(torch.equal(sa[k]["exp_avg_sq"].full_tensor(), sb[k]["exp_avg_sq"].full_tensor()) for k in sa)
import copy
ob.load_state_dict(copy.deepcopy(oa.state_dict()))  # new state tensors: the views are rebuilt
assert ob._views is None
for m, o in ((a, oa), (b, ob)):
    m(x).square().mean().backward(); o.step(); o.zero_grad(set_to_none=True)
assert all(torch.equal(p.full_tensor(), q.full_tensor()) for p, q in zip(a.parameters(), b.parameters()))
print("ok", flush=True)
os._exit(0)  # gloo threads outlive destroy_process_group once FSDP is imported (see cli.main)
'''


def test_fsdp_local_shard_step_equals_the_dtensor_step():
    """The optimizer stepping on FSDP2's local shards gives bit-identical weights and DTensor state."""
    r = subprocess.run([sys.executable, "-c", SHARD_STEP], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-1000:] + r.stderr[-3000:]
