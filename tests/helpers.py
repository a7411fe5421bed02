"""Shared builders for tests: tiny configs that run in a second on a CPU, and the user-code package."""
import os
from pathlib import Path

from turbotrain.config import load_config

TESTS = Path(__file__).resolve().parent  # the sys.path / PYTHONPATH entry that makes `import userpkg` work
USERPKG = TESTS / "userpkg"  # the one package of user code (see userpkg/__init__.py); TOMLs live there too


def userpkg_env(**extra: str) -> dict:
    """os.environ for a subprocess that must import `userpkg`: tests/ prepended to PYTHONPATH, plus extra."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env

TINY_GPT = ["model.args.n_layer=2", "model.args.n_head=2", "model.args.n_embd=32", "model.args.block_size=32",
            "model.args.vocab_size=64", "model.args.dropout=0.0", "data.args.seq_len=32", "data.args.vocab_size=64",
            "data.args.size=256", "data.eval_batches=2", "precision.dtype=fp32", "compile.enabled=false"]


def tiny_gpt(tmp_path, *overrides):
    """gpt2-124m's wiring with a 2-layer, 32-wide model on synthetic tokens."""
    return load_config("gpt2-124m", [*TINY_GPT, f"run.out_dir={str(tmp_path)!r}", "train.log_every=1", *overrides])


def losses(tmp_path, name):
    import json

    rows = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
    return [r["loss"] for r in rows if "loss" in r]


def count_host_reads(monkeypatch, run) -> int:
    """How often `run()` reads a tensor's value on the host (item/tolist/float/bool/int): each is a device
    sync on a GPU when the tensor lives there. Usage: `count_host_reads(monkeypatch, lambda: train(cfg))`."""
    import torch

    counts = {"n": 0}
    for attr in ("item", "tolist", "__float__", "__bool__", "__int__"):
        original = getattr(torch.Tensor, attr)

        def counted(self, *a, _original=original, **k):
            counts["n"] += 1
            return _original(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, attr, counted)
    try:
        run()
    finally:
        monkeypatch.undo()
    return counts["n"]


def run_bounded(cmd: list[str], timeout: float, what: str, **popen):
    """Run `cmd` in its own session; a hang fails the test after `timeout` s and takes every process of it
    (torchrun's ranks too) with it, instead of eating the CI budget."""
    import os
    import signal
    import subprocess

    import pytest

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{what} hung for {timeout:.0f} s\n{out[-2000:]}{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def compiled_gpt_losses(switch, steps: int) -> list[float]:
    """The losses of a small GPT compiled with CUDA graphs (reduce-overhead, fullgraph), bf16 autocast, trained
    `steps` steps inside the context manager `switch` (a model-op switch: packed attention, the GELU epilogue, or
    off): the GPU tests' check that an op trains the same loss curve as the model's plain code."""
    import torch
    import torch.nn.functional as F

    from turbotrain.models import gpt

    torch.manual_seed(0)
    m = gpt.build(vocab_size=512, block_size=128, n_layer=2, n_head=4, n_embd=256).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    step_model = torch.compile(m, mode="reduce-overhead", fullgraph=True)
    idx = torch.randint(0, 512, (4, 129), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    out = []
    with switch:
        for _ in range(steps):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(step_model(idx[:, :-1]).flatten(0, 1).float(), idx[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(loss.item())
    return out
