"""Which SDPA kernel turbotrain's GPT block runs, compiled, under autocast, per way of choosing the backend."""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from turbotrain.accel.attention import attention_backend
from turbotrain.models import gpt


def names(p):
    ns = {e.name[:50] for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    return sorted(n for n in ns if any(s in n.lower() for s in ("flash", "sdpa", "fmha")))

def run(label, ctx, compiled, autocast=True, fullgraph=True):
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = gpt.build(n_layer=2).cuda()
    f = torch.compile(m, fullgraph=fullgraph) if compiled else m
    x = torch.randint(0, 50304, (16, 1024), device="cuda")
    try:
        with ctx():
            for i in range(2):
                with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
                    out = f(x)
                loss = out.float().mean()
                loss.backward()
                torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
                    out = f(x)
                loss = out.float().mean()
                loss.backward()
                torch.cuda.synchronize()
        print(f"{label:34s} compiled={compiled} autocast={autocast}: {names(p)}", flush=True)
    except Exception as e:
        print(f"{label:34s} compiled={compiled}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)

dev = torch.device("cuda")
for label, ctx in [("turbotrain attention_backend(flash)", lambda: attention_backend("flash", dev)),
                   ("sdpa_kernel([FLASH]) only", lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])),
                   ("turbotrain attention_backend(efficient)", lambda: attention_backend("efficient", dev))]:
    for compiled in (False, True):
        run(label, ctx, compiled)
run("turbotrain attention_backend(flash)", lambda: attention_backend("flash", dev), True, autocast=False)
