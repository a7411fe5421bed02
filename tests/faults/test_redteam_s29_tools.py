"""Red team, session 29 (tools): what bench, tune and profile say and do about train.optimizer_impl now that
"triton" is AdamW's one-launch kernel. A row, trial or piece of advice must measure or name the kernel that
would really step the run: not the baseline's again under another name, not one the resolver refuses, not
"triton" where torch's kernels step. On this CPU the kernels' availability is faked where the other tests fake
it (accel/triton_adamw.py's triton_problem), and a failed build by a _kernels that raises as triton's compiler
does where it cannot build."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tests.helpers import userpkg_env
from turbotrain import bench
from turbotrain import profile as prof
from turbotrain.accel import optim as topt
from turbotrain.accel import triton_adamw as ta
from turbotrain.config import load_config
from turbotrain.distributed.fsdp import shard_local_step
from turbotrain.tune_space import Ctx, Probe, _optimizer

FAULT = str(Path(__file__).resolve().parents[1] / "userpkg" / "fault.toml")
USER_OPT = 'train.optimizer="userpkg.extensions:sgd_nesterov"'


def _bench(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "turbotrain", "bench", FAULT, f"run.out_dir={str(tmp_path)!r}",
                           *args], capture_output=True, text=True, timeout=300, env=userpkg_env(), cwd=tmp_path)


# ---------------------------------------------------------------- bench: optimizer rows that measure nothing new

@pytest.mark.parametrize("args, said", [
    ([USER_OPT, "--variants", "baseline,fused_opt"], "user's factory"),  # resolved to "auto": the baseline again
    (["--variants", "baseline,triton_opt"], "GPU"),  # every run refused by the resolver on this CPU
    (['train.optimizer="sgd"', "--variants", "baseline,triton_opt"], "AdamW's"),
])
def test_an_optimizer_variant_that_cannot_change_the_kernel_is_refused_before_any_run(tmp_path, args, said):
    r = _bench(tmp_path, *args)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "fault-bench-baseline").exists()


def test_default_variants_on_a_gpu_name_no_optimizer_row_for_a_user_factory(monkeypatch):
    monkeypatch.setattr(bench, "triton_problem", lambda device: None)
    plain = bench.default_variants(load_config(FAULT, []), on_gpu=True)
    assert {"fused_opt", "triton_opt"} <= set(plain)
    user = bench.default_variants(load_config(FAULT, [USER_OPT]), on_gpu=True)
    assert not {"fused_opt", "triton_opt"} & set(user), user


def transposed_weight(dim: int = 8) -> nn.Module:
    """userpkg's linear model plus a trainable parameter stored transposed (not contiguous), as a user's tied or
    permuted weight is: the Triton kernel does not take it."""
    from userpkg.models import linear

    model = linear(dim)
    model.extra = nn.Parameter(torch.zeros(dim, 4).t())
    return model


def test_default_variants_name_no_triton_row_for_a_model_whose_parameters_keep_the_kernel_off(monkeypatch):
    """Such a run builds torch's fused AdamW under optimizer_impl "triton": the row was fused_opt's again."""
    monkeypatch.setattr(bench, "triton_problem", lambda device: None)
    cfg = load_config(FAULT, [f'model.name="{__name__}:transposed_weight"'])
    out = bench.default_variants(cfg, on_gpu=True)
    assert "fused_opt" in out and "triton_opt" not in out, out


def test_a_triton_row_whose_run_fell_back_to_torch_says_so(tmp_path, monkeypatch, capsys):
    """The message the optimizer's build prints where a parameter keeps the kernel off (here a bfloat16 one),
    read back from the run's log as bench reads it: the row is torch's fused kernel, not the Triton one."""
    monkeypatch.setattr(ta, "triton_problem", lambda device: None)
    model = nn.Linear(4, 4).to(torch.bfloat16)
    assert topt._triton_or_fused("adamw", model, torch.device("cpu")) != "triton"
    log = tmp_path / "fault-bench-triton_opt.log"
    log.write_text("[turbotrain] bench: step 1\n" + capsys.readouterr().out)
    off = bench._optimizer_off("triton_opt", log)
    assert off and "did not step this run" in off and "bfloat16" in off, off
    assert bench._optimizer_off("fused_opt", log) is None
    log.write_text("[turbotrain] optimizer: adamw (triton: one kernel over every parameter)\n")
    assert bench._optimizer_off("triton_opt", log) is None


# ---------------------------------------------------------------- tune: a trial that reruns the current kernel

def _ctx(**over) -> Ctx:
    probe = Probe(on_gpu=True, bf16=True, world_size=1, strategy="none", has_conv=True, has_blocks=False,
                  has_batchnorm=True, has_attention=False, in_memory=True, cpus=16, builtin_optimizer=True,
                  static_bytes=1 << 30, capacity_bytes=80 << 30)
    eff = load_config("cnn-fashion", ["compile.enabled=false"])
    return Ctx(probe, eff, best=dict(over))


@pytest.mark.parametrize("current", ["triton", "fused"])
def test_tune_tries_no_optimizer_kernel_that_channels_last_turns_into_the_current_one(monkeypatch, current):
    """channels_last conv weights are not contiguous: "triton" builds torch's fused AdamW there, so a
    "fused" trial from "triton" (what "auto" resolves to) or a "triton" one from "fused" reruns the input."""
    monkeypatch.setattr(ta, "triton_problem", lambda device: None)
    cands = _optimizer(_ctx(**{"memory.channels_last": True, "train.optimizer_impl": current}))
    assert [c.changes["train.optimizer_impl"] for c in cands] == ["foreach"], [c.label for c in cands]
    # contiguous weights: the Triton kernel runs, and is a trial of its own
    cands = _optimizer(_ctx(**{"memory.channels_last": False, "train.optimizer_impl": "fused"}))
    assert [c.changes["train.optimizer_impl"] for c in cands] == ["triton", "foreach"]


# ---------------------------------------------------------------- profile: the kernel named and advised

def _run(opt, model, spec="adamw"):
    return SimpleNamespace(cfg=load_config(FAULT, [f"train.optimizer={spec!r}"]),
                           trainee=SimpleNamespace(device=torch.device("cpu"), dtype="fp32", model=model, opt=opt))


def test_a_triton_adamw_whose_kernels_failed_to_build_is_named_foreach_and_advised_fused(monkeypatch):
    """Where triton cannot build its kernels (no C compiler) every step runs torch's foreach AdamW: profile
    named it "triton" and advised nothing for it."""
    monkeypatch.setattr(ta, "triton_problem", lambda device: None)

    def no_compiler():
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")
    monkeypatch.setattr(ta, "_kernels", no_compiler)
    model = nn.Linear(16, 16)
    opt = ta.TritonAdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    assert opt._broken  # the build failed and torch's foreach AdamW stepped
    facts = prof.optimizer_facts(opt)
    assert facts["impl"] == "foreach", facts
    recs = prof._optimizer_advice(_run(opt, model), 0.4)
    assert any(r["set"] == 'train.optimizer_impl="fused"' for r in recs), recs
    assert not any("triton" in r["set"] for r in recs), recs


def test_fsdp2_shard_local_adamw_on_foreach_is_advised_its_fused_kernel():
    """FSDP2 wraps the optimizer's class (ShardLocalAdamW, stepping local shards with torch's kernels): the
    fused advice looked for torch's exact class and said nothing for it."""
    model = nn.Linear(16, 16)
    opt = shard_local_step(torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True))
    assert type(opt).__name__ == "ShardLocalAdamW"
    assert prof.optimizer_facts(opt)["impl"] == "foreach"
    recs = prof._optimizer_advice(_run(opt, model), 0.4)
    assert any(r["set"] == 'train.optimizer_impl="fused"' for r in recs), recs
    # its fused kernel: no triton advice (the resolver refuses triton over FSDP2's shards)
    fused = shard_local_step(torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True))
    assert not any("optimizer_impl" in r["set"] for r in prof._optimizer_advice(_run(fused, model), 0.4))


def test_torchs_foreach_adamw_where_the_triton_kernel_would_run_is_advised_triton_not_fused(monkeypatch):
    """The kernels faked available (as on a GPU with triton): "auto" takes triton there, so advising "fused"
    sent the user to the slower kernel (and the next profile to advise triton). A channels_last conv weight
    keeps the kernel off: fused stays the advice."""
    monkeypatch.setattr(ta, "triton_problem", lambda device: None)
    model = nn.Linear(16, 16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    sets = [r["set"] for r in prof._optimizer_advice(_run(opt, model), 0.4)]
    assert 'train.optimizer_impl="triton"' in sets and 'train.optimizer_impl="fused"' not in sets, sets
    conv = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(conv.parameters(), lr=1e-3, foreach=True)
    sets = [r["set"] for r in prof._optimizer_advice(_run(opt, conv), 0.4)]
    assert 'train.optimizer_impl="fused"' in sets and not any("triton" in s for s in sets), sets


@pytest.mark.parametrize("strategy, offered", [("ddp", True), ("fsdp", False)])
def test_tune_offers_the_triton_kernel_wherever_the_resolver_takes_it(monkeypatch, strategy, offered):
    """The resolver refuses triton only over FSDP2's shards; under DDP each rank steps whole float32 tensors
    and "auto" takes triton, yet tune left it out of every multi-GPU search."""
    monkeypatch.setattr(ta, "triton_problem", lambda device: None)
    probe = Probe(on_gpu=True, bf16=True, world_size=2, strategy=strategy, has_conv=False, has_blocks=True,
                  has_batchnorm=False, has_attention=True, in_memory=True, cpus=16, builtin_optimizer=True,
                  static_bytes=1 << 30, capacity_bytes=80 << 30)
    eff = load_config("gpt2-124m", [f"parallel.strategy={strategy!r}", 'train.optimizer_impl="fused"'])
    impls = [c.changes["train.optimizer_impl"] for c in _optimizer(Ctx(probe, eff))]
    assert ("triton" in impls) is offered and "fused" not in impls, impls


# ---------------------------------------------------------------- env: a recommendation every optimizer takes

def test_env_recommends_no_bare_triton_that_the_resolver_refuses_for_other_optimizers(monkeypatch):
    """On a GPU with triton "auto" takes AdamW's kernel; env printed train.optimizer_impl: triton, which the
    resolver refuses for adam, sgd and FSDP2. The recommendation is a value every optimizer accepts."""
    from turbotrain import env

    # where every optimizer takes the same kernel (a CPU: foreach), that kernel is the recommendation
    assert env.recommended_optimizer_impl(torch.device("cpu")) == "foreach"
    monkeypatch.setattr(ta, "triton_problem", lambda device: None)
    value = env.recommended_optimizer_impl(torch.device("cuda"))
    assert value.split()[0] == "auto", value
    assert "triton for adamw" in value and "fused for sgd" in value and "fused for adamw under FSDP2" in value
