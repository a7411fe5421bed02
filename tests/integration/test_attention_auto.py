"""kernels.attention="auto" on a GPU: measured on the model's own SDPA calls, kept, and what the run uses."""
import json
import tomllib

import pytest
import torch

from tests.helpers import tiny_gpt
from turbotrain.trainer import train

pytestmark = pytest.mark.gpu


def test_auto_measures_the_backends_and_the_run_uses_the_fastest(tmp_path, capsys):
    """Packed attention off: with it on (Hopper, cudnn-frontend) the GPT's attention makes no SDPA call to measure
    (tests/integration/test_packed_attention_gpu.py)."""
    cfg = tiny_gpt(tmp_path, "kernels.attention=auto", "kernels.packed_attention=false", "precision.dtype=bf16",
                   "run.device=cuda", "train.steps=2",
                   f"compile.cache_dir={str(tmp_path / 'cache')!r}", "model.args.n_embd=128", "model.args.n_head=2")
    train(cfg)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "attention: cudnn" in ln)
    chosen = line.rsplit("→ ", 1)[1].strip()
    assert chosen in ("cudnn", "flash", "efficient"), line
    effective = tomllib.loads((tmp_path / "gpt2-124m" / "config.toml").read_text())["kernels"]["attention"]
    assert effective == chosen
    (kept,) = (tmp_path / "cache").glob("*/attention-*.json")
    assert json.loads(kept.read_text())["choice"] == chosen
    train(tiny_gpt(tmp_path, "kernels.attention=auto", "kernels.packed_attention=false", "precision.dtype=bf16",
                   "run.device=cuda", "train.steps=2",
                   f"compile.cache_dir={str(tmp_path / 'cache')!r}", "model.args.n_embd=128", "model.args.n_head=2",
                   "run.name=again"))
    assert f"→ {chosen} (measured earlier: {kept})" in capsys.readouterr().out


FAMILY = {"cudnn": "cudnn", "pytorch_flash": "flash", "fmha_cutlass": "efficient"}  # kernel-name mark → backend


@pytest.mark.parametrize("setting", ["cudnn", "flash", "efficient"])
@pytest.mark.parametrize("compiled", [False, True])
def test_the_setting_is_the_kernel_that_runs_eager_and_compiled(setting, compiled):
    """The attention kernels the profiler sees under each explicit setting, bf16, eager and compiled."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from turbotrain.accel.attention import attention_backend

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).float().sum()

    torch._dynamo.reset()
    q, k, v = (torch.randn(4, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.compile(f) if compiled else f
    with attention_backend(setting, torch.device("cuda")):
        g(q, k, v).backward()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            g(q, k, v).backward()
            torch.cuda.synchronize()
    names = [e.name.lower() for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    families = {fam for n in names for mark, fam in FAMILY.items() if mark in n}
    assert families == {setting}, names
