"""Teardown order: DDP's reducer is freed before the process group is destroyed.

Freed after it, the reducer is the group's last holder and gloo's destructor joins its worker threads with
the GIL held while a worker waits for the GIL: 2-rank CPU runs hung at exit about one time in eight on a
loaded 2-core machine (py-spy: ~ProcessGroupGloo → thread::join under Reducer dealloc)."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, gc, torch, torch.distributed as dist
    from torch import nn
    from turbotrain.distributed.ddp import apply_ddp, _LIVE
    from turbotrain.distributed.env import shutdown
    from turbotrain.distributed.parallel import ParallelConfig
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + os.environ["PORT"])
    model = apply_ddp(nn.Linear(8, 8), torch.device("cpu"), ParallelConfig())
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
    assert "reducer" in model.__dict__
    shutdown()
    assert "reducer" not in model.__dict__ and "logger" not in model.__dict__ and not _LIVE
    assert not dist.is_initialized()
    del model
    gc.collect()
    print("clean exit")
""")


def test_shutdown_frees_ddp_reducers_before_the_group():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PORT": str(port)})
    assert r.returncode == 0 and "clean exit" in r.stdout, r.stderr[-3000:]
