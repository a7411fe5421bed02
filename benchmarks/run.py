"""Run a benchmark suite and record what ran where: `python benchmarks/run.py SUITE [--out DIR]`.

Each suite is a list of commands: turbotrain from source (`PYTHONPATH=src python -m turbotrain ...`) and
the baseline scripts of `benchmarks/baselines/`, run one after another in the same call so ratios are
measured side by side. Every command's output goes to `DIR/<label>.log`, turbotrain's run folders to
`DIR/runs/`, the baselines' JSON lines to `DIR/baselines.jsonl`, and `DIR/RECORD.json` holds the command
lines, their exit codes and wall times, the git commit, the date, the devices and the versions. RECORD.json
is rewritten after every command, so a call cut short still says what finished.

    python benchmarks/run.py --list
    python benchmarks/run.py bench-gpt --out benchmarks/results/2026-11-24-bench-gpt
    python benchmarks/run.py scale --gpus 1,2 --out /tmp/out --pack $OUT/results.tar.gz   # on the device tool
    python benchmarks/run.py profile --dry-run            # print the commands only
    # cold on one machine, then warm on a fresh one carrying only the archive (see `compile-cache` in --list)
    python benchmarks/run.py compile-cache --cache-tar $OUT/compile-cache.tar.gz --pack $OUT/results.tar.gz
    python benchmarks/run.py compile-cache-warm --cache-tar compile-cache.tar.gz --pack $OUT/results.tar.gz

Data for the real-data suites (`converge`, `profile`'s cnn-fashion) comes from TURBOTRAIN_CACHE, `.data`
of the repository root when it exists (fetch it once where a registry is reachable:
`turbotrain data fetch shakespeare`, `turbotrain data fetch fashion_mnist`). NVLink multicast stays off.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINES = "benchmarks/baselines"
PY = sys.executable
# the compile-cache suites' cache folder: outside the results, emptied before use, so only the tar can warm it
COMPILE_CACHE = Path("/tmp/turbotrain-compile-cache")
CACHE_MODES = {"ro": "reduce-overhead", "mat": "max-autotune-no-cudagraphs"}  # --cache-modes picks some
TAR_LIMIT = 16 << 20  # what the device tool returns per file


@dataclass
class Cmd:
    label: str
    argv: list[str]
    after: str | None = None  # name of a follow-up in FOLLOW_UPS, run after this command
    stream: bool = False  # echo every output line (progress of a long command), not only JSON lines


@dataclass
class Suite:
    about: str
    device: str  # the device kind it was written for
    commands: list[Cmd] = field(default_factory=list)


def tt(*args: str) -> list[str]:
    return [PY, "-m", "turbotrain", *args]


def baseline(script: str, *args: str) -> list[str]:
    return [PY, f"{BASELINES}/{script}", *args]


def torchrun(n: int, script: str, *args: str) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", f"{BASELINES}/{script}", *args]


# issue 18's overhead: every rule and sink on (a webhook nobody answers, Prometheus, the watchdog) vs all off
MONITOR = {
    "on": ["monitor.prometheus_port=9464", 'monitor.webhook_url="http://127.0.0.1:9/alerts"',
           "monitor.hang_timeout_s=600", 'monitor.trackers=["jsonl", "tensorboard", "csv"]'],
    "off": ['monitor.trackers=["jsonl"]'] + [f"monitor.{k}=0" for k in (
        "loss_spike_factor", "loss_diverging_rise", "loss_plateau_window", "throughput_drop_ratio", "data_wait_pct",
        "gpu_util_low_pct", "gpu_temp_high_c", "gpu_mem_high_pct", "sync_latency_ms")],
}


# issue 16: every turbotrain row times 60 steps (median of 10-step log windows, the first window's compile
# and warm-up left out); the baselines time the median of their windows after untimed warm-up steps
FASTER_RUN = ["train.steps=60", "train.log_every=10", "data.eval_batches=0", "checkpoint.every=0",
              "checkpoint.final=false"]
# what tune picks for ResNet-50 on one GPU (session 9) and what the peers get too: CUDA graphs, data on the device
RESNET_FAST = ["compile.enabled=true", "compile.mode='reduce-overhead'", "data.device_resident=true"]
# issue 16's FP8 convergence check: a narrower Llama (4 layers, D 1536, SwiGLU 6144: wide enough that torchao's
# size filter converts its MLP up/gate projections under rowwise and every linear under tensorwise) on Shakespeare
# in byte-level BPE subwords (4,096, trained on the train split: a real LM head, which characters are not), at
# lr 6e-4 (at 2e-3 bf16 itself moved 1.6 % between runs) and 40 eval batches (bf16 seed 0: 0.2 % spread over four runs)
FP8_CONVERGE = ["data.name=text", "data.args.path='.data/shakespeare/shakespeare.txt'",
                "data.args.tokens='.data/bpe/tokenizer.json'", "data.batch_size=8", "train.lr=6e-4",
                "train.steps=1000", "train.eval_every=250", "data.eval_batches=40", "checkpoint.every=0",
                "checkpoint.final=false", "model.args.n_layer=4", "model.args.n_embd=1536", "model.args.n_head=12",
                "model.args.n_kv_head=4", "model.args.ffn_hidden=6144", "compile.enabled=true"]
FP8_VARIANTS = {"bf16": [], "fp8_tensorwise": ['precision.fp8="tensorwise"'],
                "fp8_tensorwise_head": ['precision.fp8="tensorwise"', "precision.fp8_head=true"]}
# issue 15: tune from the naive config (bench's baseline, plus default attention) against the hand-tuned preset,
# both trained the same way after the tune, in one call: 7 min, as one device call (10 min) holds all three
TUNE_BUDGET_MIN = "7"
# turbotrain.bench.BASELINE (fp32, eager, foreach, no loader tuning), repeated so --list needs no torch; a unit
# test keeps the two equal
NAIVE = ["precision.dtype=fp32", "compile.enabled=false", "memory.channels_last=false",
         'memory.activation_checkpointing="none"', 'train.optimizer_impl="foreach"', "data.num_workers=0",
         "data.pin_memory=false", "data.device_resident=false", "data.persistent_workers=false",
         "kernels.fused_loss=false", "kernels.convnet=false", "kernels.packed_attention=false",
         "kernels.gelu_epilogue=false", 'precision.weight_copies="auto"']
# issue 15's edge of memory: GPT-2 medium shapes (24 x 1024, 355M parameters), bf16 + compile, at a micro-batch
# of 96 x 1024 tokens: too large for an 80 GB H100 without checkpointing, small enough with full checkpointing
EDGE = ["model.args.n_layer=24", "model.args.n_embd=1024", "model.args.n_head=16", "data.batch_size=96",
        "precision.dtype=bf16", "compile.enabled=true", 'compile.mode="default"', "kernels.fused_loss=false"]
FASTER_GPT = {"preset": [], "no_fused_loss": ["kernels.fused_loss=false"],
              "attention_default": ['kernels.attention="default"'],
              "neither": ["kernels.fused_loss=false", 'kernels.attention="default"'],
              "coordinate_descent": ["compile.coordinate_descent_tuning=true"]}


def compile_cache_runs(out: str, phase: str, after: str) -> list[Cmd]:
    """GPT-2 124M compiled in each cache mode with the cache in COMPILE_CACHE, then an eager run whose
    kernels.attention="auto" is measured (its verdict is kept in the same folder)."""
    cache = f"compile.cache_dir='{COMPILE_CACHE / 'compile'}'"
    runs = [Cmd(f"{phase}_{m}", tt("train", "gpt2-124m", "train.steps=30", "checkpoint.every=0", f"compile.mode={mode}",
                                   "kernels.fused_loss=true",  # the graph of 2026-11-23's cold run, our custom op in it
                                   cache, out, f"run.name={phase}_{m}")) for m, mode in CACHE_MODES.items()]
    attention = tt("train", "gpt2-124m", "train.steps=20", "checkpoint.every=0", "compile.enabled=false",
                   "kernels.attention=auto", "precision.dtype=bf16", cache, out, f"run.name={phase}_attention_auto")
    runs.append(Cmd(f"{phase}_attention_auto", attention, after=after))
    return runs


def tune_runs(preset: str, extra: list[str], out: str, runs: str, budget: str = TUNE_BUDGET_MIN) -> list[Cmd]:
    """The preset trained, `tune` from the naive config (bench's baseline + `extra`), then the tuned config
    trained the same way."""
    naive, name = [*NAIVE, *extra], preset.split("-")[0] + "_naive"
    return [Cmd(f"preset_{name}", tt("train", preset, *FASTER_RUN, out, f"run.name=preset_{name}")),
            Cmd(f"tune_{name}", tt("tune", preset, *naive, out, f"run.name={name}", "--budget-min", budget),
                stream=True),
            Cmd(f"tuned_{name}", tt("train", f"{runs}/{name}/tune/tuned.toml", *FASTER_RUN, out,
                                    f"run.name=tuned_{name}"), after="tune_ratio")]


def suites(gpus: list[int], runs: str, cache_tar: str = "compile-cache.tar.gz") -> dict[str, Suite]:
    """The suites, built for the world sizes asked (`--gpus`), turbotrain's run folder `runs` and the
    compile-cache suites' archive `cache_tar`."""
    out = f"run.out_dir='{runs}'"
    g = ",".join(map(str, gpus))
    gpt_peers = [Cmd("plain_gpt", baseline("plain_gpt.py")),
                 Cmd("accelerate_gpt", baseline("peer.py", "--framework", "accelerate", "--workload", "gpt")),
                 Cmd("fabric_gpt", baseline("peer.py", "--framework", "fabric", "--workload", "gpt"))]
    resnet_peers = [Cmd("plain_resnet", baseline("plain_resnet.py")),
                    Cmd("plain_resnet_fp16_eager",
                        baseline("plain_resnet.py", "--dtype", "fp16", "--compile-mode", "none")),
                    Cmd("accelerate_resnet", baseline("peer.py", "--framework", "accelerate", "--workload", "resnet")),
                    Cmd("fabric_resnet", baseline("peer.py", "--framework", "fabric", "--workload", "resnet"))]
    ddp_baseline = [Cmd(f"plain_ddp_{n}", torchrun(n, "plain_ddp.py")) for n in gpus]
    return {
        "bench-gpt": Suite(
            "every technique on GPT-2 124M, Accelerate and Fabric beside it, then the baselines", "nvidia-h200",
            [Cmd("bench_gpt2", tt("bench", "gpt2-124m", "train.steps=30", out, "run.name=gpt2",
                                  "--compare", "accelerate,fabric")), *gpt_peers]),
        "bench-gpt-compare": Suite(
            "the `all` row of GPT-2 124M against Accelerate and Fabric, 2 repeats, then the baselines", "nvidia-h200",
            [Cmd("bench_gpt2cmp", tt("bench", "gpt2-124m", "train.steps=30", out, "run.name=gpt2cmp",
                                     "--variants", "all", "--repeats", "2", "--compare", "accelerate,fabric")),
             *gpt_peers]),
        "bench-resnet": Suite(
            "every technique on ResNet-50 (B=256, 224²), Accelerate and Fabric beside it, then the baselines",
            "nvidia-h200",
            [Cmd("bench_resnet", tt("bench", "resnet50-synthetic", "train.steps=30", out, "run.name=resnet",
                                    "--compare", "accelerate,fabric")), *resnet_peers]),
        "converge": Suite(
            "convergence parity on real data: char-GPT on Shakespeare, CNN on Fashion-MNIST", "nvidia-h200",
            [Cmd("converge_shakespeare", tt("bench", "gpt-shakespeare", out, "run.name=shakespeare", "--converge",
                                            "--variants", "baseline,tf32,bf16,fp16,compile,accum,all")),
             Cmd("converge_fashion", tt("bench", "cnn-fashion", out, "run.name=fashion", "--converge", "--variants",
                                        "baseline,tf32,bf16,fp16,channels_last,compile,accum,all"))]),
        "profile": Suite(
            "profiles of GPT-2 (eager bf16, compiled) and cnn-fashion; the eager profile's first advice followed",
            "nvidia-h200",
            [Cmd("profile_gpt2_eager_bf16", tt("profile", "gpt2-124m", "compile.enabled=false", "precision.dtype=bf16",
                                               out, "run.name=gpt2_eager_bf16"), after="advice"),
             Cmd("profile_gpt2_compiled", tt("profile", "gpt2-124m", "compile.mode=default", out,
                                             "run.name=gpt2_compiled")),
             Cmd("profile_cnn_fashion", tt("profile", "cnn-fashion", out, "run.name=cnn_fashion"))]),
        "scale": Suite(
            "the scaling acceptance command (DDP and FSDP2, 2 repeats, 200 steps), then plain DDP at each size",
            f"nvidia-h200-x{max(gpus)}" if max(gpus) > 1 else "nvidia-h200",
            [Cmd("scale", tt("scale", "gpt2-124m", "--gpus", g, "--strategies", "ddp,fsdp", "--repeats", "2",
                             "train.steps=200", out, "run.name=scale")), *ddp_baseline]),
        "scale-ddp": Suite(
            "DDP alone at each world size (200 steps), then plain DDP at each size", f"nvidia-h200-x{max(gpus)}",
            [Cmd("scale_ddp", tt("scale", "gpt2-124m", "--gpus", g, "--strategies", "ddp", "train.steps=200", out,
                                 "run.name=ddp")), *ddp_baseline]),
        "scale-fsdp": Suite(
            "FSDP2 alone at each world size (200 steps)", f"nvidia-h200-x{max(gpus)}",
            [Cmd("scale_fsdp", tt("scale", "gpt2-124m", "--gpus", g, "--strategies", "fsdp", "train.steps=200", out,
                                  "run.name=fsdp"))]),
        "scale-resnet": Suite(
            "ResNet-50 DDP at each world size (B=256 per GPU, 150 steps)", f"nvidia-h200-x{max(gpus)}",
            [Cmd("scale_resnet", tt("scale", "resnet50-synthetic", "--gpus", g, "--strategies", "ddp",
                                    "train.steps=150", out, "run.name=resnet"))]),
        "monitor-overhead": Suite(
            "GPT-2 124M with every alert rule and sink on, then every rule off (JSONL only), alternating twice: the "
            "cost of monitoring (issue 18: < 1 % of step time)", "nvidia-h100-x1",
            [Cmd(f"monitor_{state}_{i}", tt("train", "gpt2-124m", "train.steps=300", "train.log_every=10",
                                            "data.eval_batches=0", out, f"run.name=monitor_{state}_{i}",
                                            *MONITOR[state]), after="overhead" if (i, state) == (2, "off") else None)
             for i in (1, 2) for state in ("on", "off")]),
        "faster-gpt": Suite(
            "issue 16 on GPT-2 124M: turbotrain's preset and each lever off in turn, then plain PyTorch, Accelerate "
            "and Fabric with the preset's compile mode (CUDA graphs), in one call", "nvidia-h200",
            [*[Cmd(f"tt_gpt_{name}", tt("train", "gpt2-124m", *FASTER_RUN, *extra, out, f"run.name=gpt_{name}"))
               for name, extra in FASTER_GPT.items()],
             *[Cmd(c.label, c.argv + ["--compile-mode", "reduce-overhead"]) for c in gpt_peers]],
            ),
        "faster-resnet": Suite(
            "issue 16 on ResNet-50 (B=256, bf16, CUDA graphs, device-resident data): turbotrain with the convnet "
            "kernels (on by default) and coordinate-descent tuning, then Accelerate and Fabric with the same compile "
            "mode, channels_last and cudnn.benchmark, in one call (~9 min on an H100: the tuning compile is ~5)",
            "nvidia-h200",
            [Cmd("tt_resnet_convnet_cdt", tt("train", "resnet50-synthetic", *FASTER_RUN, *RESNET_FAST,
                                             "compile.coordinate_descent_tuning=true", out, "run.name=resnet_cdt")),
             *[Cmd(c.label, c.argv + ["--compile-mode", "reduce-overhead"])
               for c in resnet_peers if c.label in ("accelerate_resnet", "fabric_resnet")]]),
        "faster-resnet-levers": Suite(
            "ResNet-50 as faster-resnet without coordinate-descent tuning: turbotrain with the convnet kernels off "
            "and on, and plain PyTorch, in one call", "nvidia-h200",
            [*[Cmd(f"tt_resnet_convnet_{v}", tt("train", "resnet50-synthetic", *FASTER_RUN, *RESNET_FAST,
                                                f"kernels.convnet={v}", out, f"run.name=resnet_convnet_{v}"))
               for v in ("false", "true")],
             *[Cmd(c.label, c.argv + ["--compile-mode", "reduce-overhead"])
               for c in resnet_peers if c.label == "plain_resnet"]]),
        "faster-llama": Suite(
            "issue 16 on llama-1b (one H200): turbotrain bf16 + compile, FP8 rowwise, tensorwise, tensorwise with "
            "the head in FP8; Accelerate bf16 + compile and Accelerate's FP8 (torchao) backend, in one call; needs "
            "torchao (carry .wheels)", "nvidia-h200",
            [*[Cmd(f"tt_llama_{name}", tt("train", "llama-1b", "train.steps=40", "train.log_every=10",
                                          "data.eval_batches=0", "checkpoint.every=0", *extra, out,
                                          f"run.name=llama_{name}"))
               for name, extra in (("bf16", []), ("fp8_rowwise", ['precision.fp8="rowwise"']),
                                   ("fp8_tensorwise", ['precision.fp8="tensorwise"']),
                                   ("fp8_tensorwise_head", ['precision.fp8="tensorwise"', "precision.fp8_head=true",
                                                            "kernels.fused_loss=false"]))],
             Cmd("accelerate_llama", baseline("peer.py", "--framework", "accelerate", "--workload", "llama",
                                              "--steps", "30", "--warmup-steps", "5", "--windows", "3")),
             Cmd("accelerate_llama_fp8", baseline("peer.py", "--framework", "accelerate", "--workload", "llama",
                                                  "--fp8", "--steps", "30", "--warmup-steps", "5", "--windows", "3"))]),
        "fp8-converge": Suite(
            "issue 16: val loss of FP8 (tensorwise, tensorwise + head) vs bf16 after 1,000 steps of a narrower Llama "
            "on Shakespeare BPE, seeds 0-2, one after another (the 2026-11-24 table ran them at once: its c.sh); "
            "carry .wheels and .data with bpe/tokenizer.json from `python benchmarks/shakespeare_bpe.py "
            ".data/bpe/tokenizer.json`)",
            "nvidia-h200",
            [Cmd(f"converge_llama_{name}_s{seed}", tt("train", "llama-shakespeare", *FP8_CONVERGE, *extra,
                                                      f"run.seed={seed}", out, f"run.name=converge_{name}_s{seed}"))
             for seed in range(3) for name, extra in FP8_VARIANTS.items()]),
        "compile-cache": Suite(
            "GPT-2 124M compiled cold (reduce-overhead, max-autotune-no-cudagraphs) into an empty cache folder, "
            "packed into --cache-tar (<= 16 MiB) for compile-cache-warm on a fresh machine", "nvidia-h100-x1",
            [Cmd("empty_cache", ["rm", "-rf", str(COMPILE_CACHE)]), *compile_cache_runs(out, "cold", "pack_cache")]),
        "compile-cache-warm": Suite(
            "compile-cache's runs again on a fresh machine, warm from --cache-tar only; compile_s cold vs warm "
            "into compile_cache.json", "nvidia-h100-x1",
            [Cmd("unpack_cache", ["bash", "-c", f"rm -rf {shlex.quote(str(COMPILE_CACHE))} && mkdir -p "
                                  f"{shlex.quote(str(COMPILE_CACHE))} && tar -xzf {shlex.quote(cache_tar)} -C "
                                  f"{shlex.quote(str(COMPILE_CACHE))}"]),
             *compile_cache_runs(out, "warm", "cache_ratio")]),
        "tune-gpt": Suite(
            f"issue 15: tune from naive gpt2-124m (fp32, eager, foreach) with a {TUNE_BUDGET_MIN}-min budget vs the "
            "hand-tuned preset, both trained after it, in one call", "nvidia-h100-x1",
            tune_runs("gpt2-124m", ['kernels.attention="default"'], out, runs)),
        "tune-resnet": Suite(
            f"issue 15: tune from naive resnet50-synthetic (fp32, eager) with a {TUNE_BUDGET_MIN}-min budget vs the "
            "preset, both trained after it, in one call", "nvidia-h100-x1",
            tune_runs("resnet50-synthetic", [], out, runs)),
        "tune-edge": Suite(
            "issue 15: a 355M GPT at a micro-batch that needs checkpointing on an 80 GB H100: full checkpointing "
            "at that micro-batch, then tune (6 min), then the tuned config", "nvidia-h100-x1",
            [Cmd("edge_full_ckpt", tt("train", "gpt2-124m", *EDGE, *FASTER_RUN, "train.steps=30",
                                      'memory.activation_checkpointing="full"', out, "run.name=edge_full_ckpt")),
             Cmd("tune_edge", tt("tune", "gpt2-124m", *EDGE, out, "run.name=edge", "--budget-min", "6"), stream=True),
             Cmd("tuned_edge", tt("train", f"{runs}/edge/tune/tuned.toml", *FASTER_RUN, "train.steps=30", out,
                                  "run.name=tuned_edge"), after="tune_ratio")]),
        "anchors": Suite(
            "the baseline scripts alone on one GPU (plain PyTorch, Accelerate, Fabric; GPT-2 and ResNet-50)",
            "nvidia-h200", [*gpt_peers, *resnet_peers]),
    }


def follow_advice(out: Path, runs: Path, env: dict, record: dict) -> None:
    """Train eager bf16 GPT-2 before and after the first advice of its profile; the speedup into advice.json."""
    report = runs / "gpt2_eager_bf16" / "profile" / "report.json"
    recs = json.loads(report.read_text()).get("recommendations", []) if report.exists() else []
    advice = next((r["set"].split() for r in recs if r.get("set")), [])  # the first that is a config change
    base = ["gpt2-124m", "compile.enabled=false", "precision.dtype=bf16", "checkpoint.every=0", f"run.out_dir='{runs}'"]
    rates = {}
    for name, extra in (("before", []), ("after", advice)):
        rc = run_one(Cmd(f"advice_{name}", tt("train", *base, *extra, f"run.name=advice_{name}")), out, env, record)
        summary = runs / f"advice_{name}" / "summary.json"
        if rc == 0 and summary.exists():
            rates[name] = json.loads(summary.read_text())["samples_per_s"]
    result = {"advice": " ".join(advice), **{f"{k}_samples_per_s": v for k, v in rates.items()}}
    if len(rates) == 2:
        result["speedup"] = rates["after"] / rates["before"]
    (out / "advice.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)


def monitor_overhead(out: Path, runs: Path, env: dict, record: dict) -> None:
    """Tokens/s of the monitor-overhead runs, log-step work included (summary's samples_per_s_overall), and
    the cost of monitoring: 1 - median(on) / median(off); into overhead.json."""
    import statistics

    rates = {}
    for state in ("on", "off"):
        rates[state] = [
            json.loads((runs / f"monitor_{state}_{i}" / "summary.json").read_text())["samples_per_s_overall"]
            for i in (1, 2) if (runs / f"monitor_{state}_{i}" / "summary.json").exists()]
    result = {"samples_per_s_overall": rates}
    if rates["on"] and rates["off"]:
        result["overhead"] = 1 - statistics.median(rates["on"]) / statistics.median(rates["off"])
    (out / "overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)


def _summary(runs: Path, name: str) -> dict:
    path = runs / name / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def pack_cache(out: Path, runs: Path, env: dict, record: dict) -> None:
    """The cold runs' compile_s into COMPILE_CACHE/cold.json, then the folder as one .tar.gz at --cache-tar:
    everything if it fits in 16 MiB, else the portable .bin files and verdicts alone."""
    cold = {m: _summary(runs, f"cold_{m}").get("compile_s") for m in CACHE_MODES}
    COMPILE_CACHE.mkdir(parents=True, exist_ok=True)
    (COMPILE_CACHE / "cold.json").write_text(json.dumps({"compile_s": cold}, indent=2) + "\n")
    tar = Path(record["cache_tar"])
    portable = lambda i: i if i.isdir() or i.name.endswith((".bin", ".json")) else None  # noqa: E731
    for what, keep in (("whole folder", None), ("portable .bin files only", portable)):
        tmp = tar.with_name(tar.name + ".tmp")
        with tarfile.open(tmp, "w:gz") as t:
            t.add(COMPILE_CACHE, arcname=".", filter=keep)
        tmp.replace(tar)
        if tar.stat().st_size <= TAR_LIMIT:
            break
    result = {"cold_compile_s": cold, "cache_tar": str(tar), "tar_bytes": tar.stat().st_size, "packed": what}
    (out / "compile_cache.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)


def cache_ratio(out: Path, runs: Path, env: dict, record: dict) -> None:
    """compile_s cold (from the unpacked cold.json) and warm, their ratio, and the warm runs' cache hits."""
    cold_file = COMPILE_CACHE / "cold.json"
    cold = json.loads(cold_file.read_text())["compile_s"] if cold_file.exists() else {}
    result = {}
    for m, mode in CACHE_MODES.items():
        s = _summary(runs, f"warm_{m}")
        warm = s.get("compile_s")
        result[mode] = {"cold_compile_s": cold.get(m), "warm_compile_s": warm,
                        "warm_over_cold": warm / cold[m] if warm is not None and cold.get(m) else None,
                        **{k: s.get(k) for k in ("compile_cache", "fxgraph_cache_hit", "fxgraph_cache_miss",
                                                 "aot_autograd_cache_hit", "aot_autograd_cache_miss")}}
    (out / "compile_cache.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)


def tune_ratio(out: Path, runs: Path, env: dict, record: dict) -> None:
    """Each tune's winner (tune.json) and its tuned config's training run against the reference run of the
    same suite (the preset, or full checkpointing at the edge), tokens/s from summary.json; into tune_ratio.json."""
    result = {}
    for tune_json in sorted(runs.glob("*/tune/tune.json")):
        name = tune_json.parent.parent.name
        ref_name = f"preset_{name}" if (runs / f"preset_{name}").exists() else f"{name}_full_ckpt"
        t, tuned, ref = json.loads(tune_json.read_text()), _summary(runs, f"tuned_{name}"), _summary(runs, ref_name)
        rate = lambda s: s.get("tokens_per_s") or s.get("samples_per_s")  # noqa: E731
        result[name] = {"reference": ref_name, "reference_rate": rate(ref), "tuned_rate": rate(tuned),
                        "tuned_over_reference": rate(tuned) / rate(ref) if rate(tuned) and rate(ref) else None,
                        "reference_peak_gib": ref.get("peak_mem_gib"), "tuned_peak_gib": tuned.get("peak_mem_gib"),
                        "winner": (t.get("winner") or {}).get("changes"),
                        "winner_speedup_over_input": (t.get("winner") or {}).get("speedup"),
                        "trials": len(t.get("trials", [])), "elapsed_min": t.get("elapsed_min")}
    (out / "tune_ratio.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)


FOLLOW_UPS = {"advice": follow_advice, "overhead": monitor_overhead, "pack_cache": pack_cache,
              "cache_ratio": cache_ratio, "tune_ratio": tune_ratio}


def git_commit() -> dict:
    """HEAD and whether the tree differs from it; "unknown" where the tree is a copy without .git."""
    if not (ROOT / ".git").exists():
        return {"commit": "unknown", "note": "no .git in this copy of the tree"}
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return {"commit": head.stdout.strip(), "tracked_files_modified": bool(dirty)}
    except (OSError, subprocess.CalledProcessError) as e:
        return {"commit": "unknown", "note": f"git failed: {e}"}


def machine() -> dict:
    """Devices and versions as torch sees them (imported here only, so --list and --dry-run stay light)."""
    import torch

    cuda = torch.cuda.is_available()
    nccl = None
    if cuda and torch.distributed.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {"devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else ["cpu"],
            "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "python": platform.python_version(), "hostname": socket.gethostname()}


def write_record(out: Path, record: dict) -> None:
    tmp = out / "RECORD.json.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(out / "RECORD.json")
    if record.get("pack"):
        pack(out, Path(record["pack"]))


def pack(out: Path, tar_gz: Path) -> None:
    """The results folder as one archive, leaving out checkpoints and CUDA memory snapshots (large)."""
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        cache_tar = info.name.endswith("compile-cache.tar.gz")  # returned as its own file
        big = "checkpoints" in parts or "final" in parts or info.name.endswith((".pickle", ".safetensors", ".pt"))
        return None if big or cache_tar else info
    tmp = tar_gz.with_name(tar_gz.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(out, arcname=out.name, filter=keep)
    tmp.replace(tar_gz)


def run_one(cmd: Cmd, out: Path, env: dict, record: dict) -> int:
    """One command, its output into <label>.log and its JSON lines (baselines) into baselines.jsonl."""
    print(f"== {cmd.label}: {' '.join(cmd.argv)}", flush=True)
    t0 = time.perf_counter()
    with open(out / f"{cmd.label}.log", "w") as log:
        proc = subprocess.Popen(cmd.argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        is_baseline = any(a.startswith(BASELINES) for a in cmd.argv)
        for line in proc.stdout:
            log.write(line)
            if cmd.stream:
                print(line, end="", flush=True)
            elif is_baseline and line.startswith("{"):
                with open(out / "baselines.jsonl", "a") as rows:
                    rows.write(line)
                print(line, end="", flush=True)
        rc = proc.wait()
    wall = time.perf_counter() - t0
    line = "PYTHONPATH=src " + shlex.join(["python" if a == PY else a for a in cmd.argv])
    record["commands"].append({"label": cmd.label, "command": line, "argv": cmd.argv, "rc": rc,
                               "wall_s": round(wall, 1)})
    write_record(out, record)
    if rc:
        print(f"   exit {rc} after {wall:.0f} s; last lines of {cmd.label}.log:", flush=True)
        print("".join((out / f"{cmd.label}.log").read_text().splitlines(keepends=True)[-5:]), flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suite", nargs="*", help="one or more suite names (see --list)")
    p.add_argument("--out", default="/tmp/out", help="results folder (default /tmp/out)")
    p.add_argument("--gpus", default="1,2", help="world sizes for the scale suites (default 1,2)")
    p.add_argument("--list", action="store_true", help="list the suites and exit")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    p.add_argument("--pack", metavar="TAR_GZ", default=None,
                   help="also pack the results (no checkpoints, no memory snapshots) into this .tar.gz after every "
                        "command, for a device tool that returns only a few files: --pack $OUT/results.tar.gz")
    p.add_argument("--cache-tar", default=None, metavar="TAR_GZ",
                   help="compile-cache: where the cache folder is packed (default <out>/compile-cache.tar.gz); "
                        "compile-cache-warm: the archive to start warm from")
    p.add_argument("--cache-modes", default=",".join(CACHE_MODES),
                   help=f"compile-cache suites: the compile modes to run, of {', '.join(CACHE_MODES)} (default all)")
    args = p.parse_args(argv)
    modes = [m for m in args.cache_modes.split(",") if m]
    if not modes or any(m not in CACHE_MODES for m in modes):
        print(f"error: --cache-modes {args.cache_modes!r}: choose from {', '.join(CACHE_MODES)}", file=sys.stderr)
        return 2
    for m in set(CACHE_MODES) - set(modes):  # the follow-ups read CACHE_MODES too
        del CACHE_MODES[m]
    gpus = [int(x) for x in args.gpus.split(",")]
    out = Path(args.out).resolve()
    cache_tar = Path(args.cache_tar).resolve() if args.cache_tar else out / "compile-cache.tar.gz"
    table = suites(gpus, str(out / "runs"), str(cache_tar))
    if args.list or not args.suite:
        for name, s in table.items():
            print(f"{name:18} {s.device:16} {s.about}")
        return 0 if args.list else 2
    unknown = [s for s in args.suite if s not in table]
    if unknown:
        print(f"error: unknown suite {', '.join(unknown)}; choose from {', '.join(table)}", file=sys.stderr)
        return 2
    if args.dry_run:
        for name in args.suite:
            for c in table[name].commands:
                print(f"[{name}] {' '.join(c.argv)}" + (f"   (then: {c.after})" if c.after else ""))
        return 0

    out.mkdir(parents=True, exist_ok=True)
    path = [str(ROOT / "src"), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONUNBUFFERED": "1",
           "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    if "TURBOTRAIN_CACHE" not in env and (ROOT / ".data").is_dir():
        env["TURBOTRAIN_CACHE"] = str(ROOT / ".data")
    record = {"suites": args.suite, "invocation": [Path(sys.argv[0]).as_posix(), *(argv or sys.argv[1:])],
              "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), **git_commit(),
              **machine(), "env": {k: v for k, v in sorted(env.items()) if k.startswith(("NCCL_", "TORCH_"))},
              "commands": [], "pack": str(Path(args.pack).resolve()) if args.pack else None,
              "cache_tar": str(cache_tar)}
    write_record(out, record)
    failed = 0
    for name in args.suite:
        for cmd in table[name].commands:
            failed += run_one(cmd, out, env, record) != 0
            if cmd.after:
                FOLLOW_UPS[cmd.after](out, out / "runs", env, record)
    record["finished_utc"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    write_record(out, record)
    print(f"results: {out} ({failed} command(s) failed)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
