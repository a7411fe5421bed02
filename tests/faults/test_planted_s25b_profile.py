"""Planted cases of `profile`'s second pass: the built-in fused loss's asynchronous bounds check read as a host
read (the gpt2 preset was told to remove reads it does not make), a user optimizer's Python step given only
batch and parameter advice, the tiny-op levers ranked for a forward+backward of 3% of the step, a loss looping
over samples advised as "the model's small ops", and graph breaks of a compiled model never named. Verdicts are
asserted by kind and advice, never by a timing share."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from tests.faults.common import BASE_TOML, lit, step_events
from tests.faults.test_planted_s22 import check_report
from tests.helpers import TINY_GPT
from turbotrain import profile as prof
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.monitor import phases

pytestmark = pytest.mark.usefixtures("userpkg_importable")

PKG = "userpkg.planted_s25b_profile"
ITEMS = ['data.name="userpkg.planted_s22:items"', "data.num_workers=0", 'train.loss="cross_entropy"',
         "data.args={}", f'model.name="{PKG}:wide"', "model.args={}"]
READS = "remove the host reads from the model and the loss"
LOSS = "vectorize the loss"
SMALL_OPS = "vectorize the model's small ops"


def _profile(tmp_path, *overrides, config=str(BASE_TOML), name="fault") -> dict:
    argv = [config, f"run.out_dir={lit(tmp_path)}", *overrides]
    assert main(["profile", "--active", "3", *argv]) == 0
    out = tmp_path / name / "profile"
    report = json.loads((out / "report.json").read_text())
    check_report(report, (out / "report.md").read_text(), argv)  # the markdown says what the JSON says
    return report


def _dos(report_or_recs) -> list[str]:
    recs = report_or_recs["recommendations"] if isinstance(report_or_recs, dict) else report_or_recs
    return [r["do"] for r in recs if not r["set"]]


# ---------------------------------------------------------------- asynchronous asserts are no host read

def test_an_async_assert_is_no_host_read():
    """torch._assert_async reads its flag on a CPU (aten::item inside it), but on a GPU it raises from the kernel
    without a host wait: the fused loss's bounds check made every gpt preset a 'host read' to remove."""
    w = torch.randn(32, 4, requires_grad=True)
    x = torch.randn(8, 32)

    def checked():
        h = x @ w
        torch._assert_async((h > -1e30).all())
        return h.sum()
    assert prof.host_reads(step_events(checked), 1) == 0
    assert prof.host_reads(step_events(lambda: (x @ w).sum() + (x @ w).mean().item()), 1) == 1


def test_the_gpt_preset_is_not_told_to_remove_reads_it_does_not_make(tmp_path):
    report = _profile(tmp_path, *TINY_GPT, 'run.device="cpu"', "data.batch_size=2", "train.eval_every=0",
                      "checkpoint.every=0", config="gpt2-124m", name="gpt2-124m")
    assert report["host_reads_per_step"] == 0 and READS not in _dos(report), report["recommendations"]


# ---------------------------------------------------------------- the user's own optimizer

def test_a_python_optimizer_is_told_to_vectorize_its_step():
    """A user optimizer looping over rows of each parameter: its advice was a larger batch and fewer parameters;
    the step's own code is what to change."""
    from userpkg.planted_s25b_profile import PySGD
    run = _run(f'train.optimizer="{PKG}:py_sgd"')
    run.trainee.opt = PySGD(run.trainee.model.parameters())
    shares = dict.fromkeys(prof.PARTS, 0.0) | {"optimizer": 0.8, "forward": 0.1, "backward": 0.1}
    kind, recs = prof.verdict(shares, run, {})
    assert kind == "optimizer-bound" and recs[0].get("do") == "make PySGD.step cheaper", recs
    assert not any("optimizer_impl" in r["set"] for r in recs)


def _run(*overrides):
    from types import SimpleNamespace
    model = nn.Linear(8, 8)
    return SimpleNamespace(cfg=load_config(str(BASE_TOML), list(overrides)),
                           batches=SimpleNamespace(resident=False, loader=SimpleNamespace(num_workers=0, dataset=None)),
                           trainee=SimpleNamespace(device=torch.device("cpu"), dtype="fp32", model=model,
                                                   opt=torch.optim.AdamW(model.parameters(), fused=True)))


def test_torch_optimizers_get_no_rewrite_advice():
    shares = dict.fromkeys(prof.PARTS, 0.0) | {"optimizer": 0.8, "forward": 0.1, "backward": 0.1}
    kind, recs = prof.verdict(shares, _run('train.optimizer="torch.optim:AdamW"'), {})
    assert kind == "optimizer-bound" and not any(d.startswith("make ") for d in _dos(recs)), recs


# ---------------------------------------------------------------- levers of a negligible part

def test_tiny_op_levers_are_not_ranked_for_a_negligible_forward():
    """forward+backward 5% of an optimizer-bound step, in tiny ops: 'compile' and 'vectorize the model' were
    ranked for them all the same (a lever on 5% of the step)."""
    shares = dict.fromkeys(prof.PARTS, 0.0) | {"optimizer": 0.9, "forward": 0.03, "backward": 0.02,
                                                "host_overhead": 0.05}
    _, recs = prof.verdict(shares, _run(), {}, tiny=0.95)
    assert SMALL_OPS not in _dos(recs) and "compile.enabled=true" not in [r["set"] for r in recs], recs
    shares |= {"optimizer": 0.3, "forward": 0.3, "backward": 0.35}
    assert SMALL_OPS in _dos(prof.verdict(shares, _run(), {}, tiny=0.95)[1])


# ---------------------------------------------------------------- a loss that loops over the batch

def _loss_events(loss_fn):
    from userpkg.planted_s25b_profile import wide
    model, x, y = wide(), torch.randn(8, 32), torch.randint(0, 4, (8,))
    phases.enable(True)
    try:
        with phases.model_range(model), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
            with phases.phase("forward"):
                loss = loss_fn(model(x), y)
            with phases.phase("backward"):
                loss.backward()
    finally:
        phases.enable(False)
    return p.events()


def test_a_looping_loss_is_told_apart_from_a_built_in_one():
    """Op counts, not times: in a tiny model cross-entropy alone can be most of forward's op time."""
    from userpkg.planted_s25b_profile import slow_loss
    assert prof.loop_loss_share(_loss_events(slow_loss)) > 0
    assert prof.loop_loss_share(_loss_events(nn.functional.cross_entropy)) == 0


def test_a_loss_looping_over_samples_is_named_first(tmp_path):
    """A per-sample loss loop (128 cross-entropies a step) was advised as 'the model's small ops', a larger
    batch first: a per-sample loop costs as much per sample at any batch size. Named whatever the verdict (a
    loaded machine moves the shares), first where the host bounds the step."""
    report = _profile(tmp_path, *ITEMS, f'train.loss="{PKG}:slow_loss"')
    assert report["loop_loss_share"] >= prof.LOOP_LOSS and LOSS in _dos(report), report["recommendations"]
    if report["verdict"].startswith("host"):
        assert report["recommendations"][0].get("do") == LOSS, report["recommendations"]


def test_a_built_in_loss_is_not_accused(tmp_path):
    report = _profile(tmp_path, *ITEMS)
    assert report["loop_loss_share"] == 0 and LOSS not in _dos(report)


# ---------------------------------------------------------------- graph breaks

BREAK = ("Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace builtin operator "
         "`print` with argument types ['str']\n  Hint: Avoid calling builtin `print`")


@pytest.mark.parametrize("kind, at", [("host-overhead-bound", 1), ("compute-bound", -1)])
def test_graph_breaks_are_named_with_their_reasons(kind, at):
    """A compiled model with a print and a value-dependent `if` in forward: the header counted 2 graph breaks
    and no advice named them."""
    shares = dict.fromkeys(prof.PARTS, 0.0) | {"forward": 0.3, "backward": 0.3, "host_overhead": 0.4}
    recs = [prof._tip("first", "why", 0.4), prof._tip("second", "why", 0.4)]
    out = prof._with_breaks_tip(recs, kind, shares, {"graph_breaks": 2, "graph_break_reasons": [BREAK]})
    tip = out[at]
    assert tip["do"] == "remove the graph breaks in the model's forward" and "builtin operator `print`" in tip["why"]
    assert "\n" not in tip["why"] and len(out) == 3
    assert prof._with_breaks_tip(recs, kind, shares, {"graph_breaks": 0}) == recs


# ---------------------------------------------------------------- communication on a CPU (gloo)

PEER = """
import sys, time, datetime, torch, torch.distributed as dist
limit = datetime.timedelta(seconds=30)
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, False, timeout=limit)
dist.init_process_group("gloo", store=store, rank=1, world_size=2, timeout=limit)
time.sleep(float(sys.argv[2]))  # a slow peer: rank 0 waits in its all-reduce
dist.all_reduce(torch.ones(1_000_000))
dist.destroy_process_group()
"""


def test_a_gloo_all_reduce_waited_for_is_communication_not_host_overhead():
    """DDP on CPU ranks (gloo): the collective runs on the process group's threads and the step waits for it at
    backward's end; that wait was read as host overhead ('Python outside torch ops: loops, sleeps') and
    exposed communication was 0 whatever the gradient."""
    import subprocess
    import sys
    import time
    from datetime import timedelta

    import torch.distributed as dist

    from tests.helpers import userpkg_env
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=30), wait_for_workers=False)
    # the peer sleeps 3 s after joining: rank 0's profiler start and step take far less even on a loaded machine
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(store.port), "3"], env=userpkg_env())
    try:
        dist.init_process_group("gloo", store=store, rank=0, world_size=2, timeout=timedelta(seconds=30))
        w, x = torch.randn(64, 64, requires_grad=True), torch.randn(8, 64)
        phases.enable(True)
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
            with phases.phase("forward"):
                loss = (x @ w).square().mean()
            with phases.phase("backward"):
                loss.backward()
                dist.all_reduce(torch.ones(1_000_000))  # as DDP's reducer: launched in backward, waited for there
        per, _ = prof.analyze(p.events(), time.perf_counter() - t0, 1, on_gpu=False)
    finally:
        phases.enable(False)
        if dist.is_initialized():
            dist.destroy_process_group()
        try:
            peer.wait(timeout=60)  # its own timeouts end it in 30 s where this side failed first
        finally:
            if peer.poll() is None:
                peer.kill()
    shares = {k: v / sum(per.values()) for k, v in per.items()}
    assert prof.bottleneck(shares) == "communication", shares
    assert per["exposed_comm"] > per["host_overhead"], per
