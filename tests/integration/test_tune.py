"""`turbotrain tune` on a CPU: a host-bound user dataset gets loader workers and trains ≥ 1.5x faster; the
four files; every applicable dimension recorded; failed trials recorded and the search going on; user
errors as one `error:` line. The search itself is tested with a stand-in runner (no processes)."""
import json
import subprocess
import sys
import time

import pytest

from tests.helpers import USERPKG, userpkg_env
from turbotrain.cli import main
from turbotrain.tune import Budget, Search
from turbotrain.tune_space import Ctx, Probe, dimensions

TOML = str(USERPKG / "tune.toml")  # a residual MLP (blocks) on items that sleep 5 ms each; 0 workers


@pytest.mark.slow
def test_tune_speeds_up_a_host_bound_dataset_and_its_result_trains(tmp_path):
    out = f"run.out_dir={str(tmp_path)!r}"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "turbotrain", "tune", TOML, out, "--budget-min", "2", "--repeats", "1"],
                       capture_output=True, text=True, timeout=300, env=userpkg_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert time.perf_counter() - t0 < 2 * 60 + 5  # the budget counts from the process's start, report included
    tune = tmp_path / "tune-slow" / "tune"
    result = json.loads((tune / "tune.json").read_text())
    assert (tune / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "| t00 |" in (tune / "tune.md").read_text()
    trials, table = result["trials"], (tune / "tune.md").read_text()
    assert trials[0]["label"] == "input config" and trials[0]["status"] == "ok"
    assert all(t["status"] in ("ok", "slower", "oom", "error", "timeout", "skipped") for t in trials)
    # one trial (run or pruned, with its reason) per dimension that applies to this model on a CPU
    assert {"data path", "optimizer kernel", "micro-batch x accumulation, checkpointing", "precision",
            "compile"} <= {t["dimension"] for t in trials}, table
    assert not {"channels_last", "attention backend", "parallel"} & {t["dimension"] for t in trials}
    w = result["winner"]
    assert w["changes"].get("data.num_workers", 0) > 0 and w["speedup"] >= 1.5, table
    assert "num_workers" in (tune / "tuned.toml").read_text() and "# " in (tune / "tuned.toml").read_text()
    # the math is kept: the global batch of every trial is the input's
    assert {t["global_batch"] for t in trials if t.get("global_batch")} == {32}
    r = subprocess.run([sys.executable, "-m", "turbotrain", "train", str(tune / "tuned.toml")], capture_output=True,
                       text=True, timeout=300, env=userpkg_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    tuned = json.loads((tmp_path / "tune-slow-tuned" / "summary.json").read_text())
    assert tuned["samples_per_s"] >= 1.5 * trials[0]["samples_per_s"], (tuned["samples_per_s"], trials[0])


def _probe(**kw) -> Probe:
    base = dict(on_gpu=True, bf16=True, world_size=1, strategy="none", has_conv=False, has_blocks=True,
                has_batchnorm=False, has_attention=True, in_memory=True, cpus=16, builtin_optimizer=True,
                static_bytes=2 << 30, capacity_bytes=80 << 30, attention_backends=("cudnn", "flash", "efficient"))
    return Probe(**{**base, **kw})


def _ctx(probe: Probe):
    from turbotrain.config import load_config

    eff = load_config("gpt2-124m", ["data.batch_size=8", "train.grad_accum=4", "precision.dtype=fp32",
                                    'train.optimizer_impl="foreach"', "data.device_resident=false",
                                    "compile.enabled=false",
                                    'kernels.attention="default"', "data.num_workers=0"])
    return Ctx(probe, eff, best_fits=False)


def test_search_records_failures_prunes_by_memory_and_goes_on():
    """A stand-in runner on a GPU-like probe: the input config runs out of memory (a recorded result: its
    lower bound prunes the larger micro-batches), a compile error is recorded, and the search continues to
    a winner that fits: a smaller micro-batch without checkpointing beats full checkpointing."""
    calls = []

    def run(name, config, timeout_s, what):
        calls.append(config)
        micro, ckpt = config.get("data.batch_size", 8), config.get("memory.activation_checkpointing", "none")
        if config.get("compile.enabled"):
            return {"status": "error", "reason": "exit 1: InductorError: boom", "wall_s": 1.0}
        if micro >= 8 and ckpt == "none":
            return {"status": "oom", "reason": "exit 2: out of memory (peak 79.1 GiB allocated)", "wall_s": 1.0}
        speed = {"none": 1.0, "selective": 0.9, "full": 0.75}[ckpt] * (1.0 if micro >= 4 else 0.8)
        speed *= 2.0 if config.get("precision.dtype") == "bf16" else 1.0
        return {"status": "ok", "samples_per_s": 100 * speed, "peak_mem_gib": 40.0, "wall_s": 1.0}

    probe = _probe()
    search = Search(_ctx(probe), run, Budget(10))
    search.baseline()
    search.explore(dimensions(probe))
    by = {t["label"]: t for t in search.trials}
    assert by["input config"]["status"] == "oom" and "out of memory" in by["input config"]["reason"]
    assert by["compile + CUDA graphs"]["status"] == "error" and "InductorError" in by["compile"]["reason"]
    assert by["micro-batch 32 x accumulation 1"]["status"] == "skipped"  # 4x the OOM'd micro-batch: cannot fit
    assert "memory estimate" in by["micro-batch 32 x accumulation 1"]["reason"]
    assert search.best["config"]["data.batch_size"] == 4
    assert search.best["config"].get("memory.activation_checkpointing", "none") == "none"
    assert search.best["config"]["precision.dtype"] == "bf16"
    assert all(c.get("train.grad_accum", 4) * c.get("data.batch_size", 8) == 32 for c in calls)  # same global batch
    assert len({json.dumps(c, sort_keys=True) for c in calls}) == len(calls)  # no configuration ran twice
    assert {t["dimension"] for t in search.trials} >= {"precision", "compile", "data path", "optimizer kernel",
                                                        "attention backend", "compiler kernel tuning"}


def test_cpu_space_is_ordered_data_first_compile_last():
    names = [d.name for d in dimensions(_probe(on_gpu=False, has_attention=False))]
    assert names[0] == "data path" and names[-1] == "compile" and "attention backend" not in names


@pytest.mark.parametrize("argv, says", [
    (["tune", "no-such-preset"], "error: no preset or file named"),
    (["tune", TOML, "train.steps=zero"], "error: train.steps"),
    (["tune", TOML, "--budget-min", "0"], "error: --budget-min must be a number of minutes > 0"),
    (["tune", TOML, "--budget-min", "inf"], "error: --budget-min must be a number of minutes > 0 (not inf"),
])
def test_bad_config_or_override_is_one_error_line(argv, says, capsys, tmp_path):
    assert main([*argv, f"run.out_dir={str(tmp_path)!r}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1, err


def test_under_torchrun_it_says_to_use_nproc(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["tune", TOML, f"run.out_dir={str(tmp_path)!r}"]) == 2
    err = capsys.readouterr().err
    assert "--nproc 2" in err and err.count("\n") == 1


def test_the_finalists_share_goes_to_the_search_until_two_configurations_ran(monkeypatch):
    """A 3-min budget (a quarter kept for the finalists) whose input config runs out of memory: with one
    configuration measured there is nothing for finalists to compare, so their share goes to one more trial;
    once two have run, a trial is stopped where the finalists' share begins."""
    clock, calls = [0.0], []
    monkeypatch.setattr(Budget, "elapsed", lambda self: clock[0])

    def run(name, config, timeout_s, what):
        calls.append((config, timeout_s))
        clock[0] += 50.0
        if config.get("data.batch_size", 8) >= 8:
            return {"status": "oom", "reason": "exit 2: out of memory", "wall_s": 50.0}
        return {"status": "ok", "samples_per_s": 100.0 / config["data.batch_size"], "peak_mem_gib": 20.0,
                "wall_s": 50.0}

    probe = _probe()
    budget = Budget(3)  # 180 s, 5 of them for the report
    search = Search(_ctx(probe), run, budget)
    search.baseline()
    budget.finals_s = 45.0  # as run_tune sizes it: a quarter of the budget
    search.explore(dimensions(probe))
    ran = [(c.get("data.batch_size"), t) for c, t in calls[1:]]
    assert ran == [(4, 125.0), (2, 75.0)]  # the second would not have fitted beside a kept share (75 - 45 < 50)
    assert all(t["status"] == "skipped" for t in search.trials[3:])
    assert search._search_left() == 180 - 5 - 150 - 45  # two configurations ran: the share is kept again


def test_a_config_that_never_trains_writes_the_record_no_tuned_toml_and_one_error_line(tmp_path):
    """Every trial fails (a model whose forward raises): tune.json/tune.md record each failure, there is no
    tuned.toml to train with, and the command ends with one `error:` line naming the input config's failure."""
    toml = tmp_path / "broken.toml"
    toml.write_text(f'extends = {TOML!r}\n[model]\nname = "userpkg.tune_workloads:failing_model"\n')
    r = subprocess.run([sys.executable, "-m", "turbotrain", "tune", str(toml), f"run.out_dir={str(tmp_path)!r}",
                        "--budget-min", "1", "--repeats", "0"], capture_output=True, text=True, timeout=200,
                       env=userpkg_env(), cwd=tmp_path)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: no configuration trained to the end"), r.stderr
    tune = tmp_path / "broken" / "tune"  # the run is named after the config file that extends tune.toml
    trials = json.loads((tune / "tune.json").read_text())["trials"]
    assert trials[0]["status"] == "error" and not (tune / "tuned.toml").exists()
    assert "Train with" not in (tune / "tune.md").read_text()
