"""The lead's fixes of session 25 (red-team wave 7): one test per class."""
from __future__ import annotations

import re

import pytest
import torch

from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.bench import _judge, format_table
from turbotrain.cli import main


def _row(variant: str, rate: float | None, error: str | None = None) -> dict:
    if error:
        return {"variant": variant, "error": error}
    return {"variant": variant, "samples_per_s": rate, "tokens_per_s": None, "step_ms": 1.0, "peak_mem_gib": 0.1,
            "compile_s": 0.0, "final_loss": 1.0, "val_loss": None, "val_acc": None}


def test_bench_without_a_baseline_says_why_it_has_no_speedup():
    for rows, why in (([_row("fp16", 50.0)], "add baseline to --variants"),
                      ([_row("baseline", None, "failed: out of memory"), _row("bf16", 50.0)], "baseline row failed")):
        _judge(rows, converge=False)
        table = format_table({"device": "cpu", "torch": "x", "steps": 3, "synthetic_data": False, "repeats": 1,
                              "rows": rows})
        line = next(ln for ln in table.splitlines() if ln.startswith(f"| {rows[-1]['variant']} |"))
        assert "| — |" in line and "—x" not in line, line
        assert why in line, line


def test_nan_inputs_at_an_earlier_step_than_the_stop_are_blamed_on_the_data(tmp_path, capsys):
    """A NaN row poisons the weights at the step that reads it; the loss stays NaN after, and the stop comes at a
    log step whose batch is clean. Before, that clean batch was checked and the stop advised a lower LR."""
    for extra in ([], ["data.num_workers=1"]):
        rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", 'data.name="userpkg.lead_s25:nan_rows"',
                   "train.steps=40", "train.log_every=10", "checkpoint.every=0", *extra])
        line = error_line(capsys.readouterr().err)
        assert rc == 2, line
        assert "(where it went non-finite) holds NaN/inf in its inputs" in line and "clean the data" in line, line
        assert "lower train.lr" not in line, line
        first = int(re.search(r"the batch of step (\d+)", line).group(1))
        assert first < 10, line  # the step that read the bad row, not the log step of the stop


def test_a_loss_gone_nan_from_the_lr_is_still_blamed_on_the_lr(tmp_path, capsys):
    """The data is clean: the earlier step's batch, read again, holds no NaN, so the LR advice stands."""
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", 'train.optimizer="sgd"', "train.lr=50",
               "train.grad_clip=0", "train.steps=40", "train.log_every=10", "checkpoint.every=0"])
    line = error_line(capsys.readouterr().err)
    assert rc == 2 and "lower train.lr" in line and "clean the data" not in line, line


class Augmented(torch.utils.data.Dataset):
    """Random augmentation drawn from the global RNG in __getitem__, as users write it."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((3,), float(i)) + torch.randn(3), torch.tensor(i % 4)


@pytest.mark.parametrize("resident", [False, True])
def test_a_step_read_again_is_the_batch_the_run_read(resident):
    """Batches.read_step (what a NaN stop reads to find the step that went non-finite) gives the micro-batches the
    loop got at that step: the same order, and under SeededReads the same augmentation draws."""
    from turbotrain.data.datasets import Pairs
    from turbotrain.data.loader import Batches, StepSampler

    ds = Pairs(torch.randn(40, 3), torch.arange(40) % 4) if resident else Augmented()
    batches = Batches(ds, StepSampler(len(ds), 4, 2, seed=3), torch.device("cpu"), resident)
    seen = [next(batches) for _ in range(2 * 7)]  # 7 steps of 2 micro-batches: past one epoch of 5 steps
    for step in (0, 3, 6):
        again = batches.read_step(step)
        for got, want in zip(again, seen[2 * step:2 * step + 2]):
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (step, got, want)


def test_a_torchrun_trial_whose_rank_was_sigkilled_is_out_of_memory(tmp_path):
    """torchrun exits 1 when the OOM killer ends a rank; its summary names SIGKILL. The trial was an `error`."""
    from turbotrain.tune import outcome

    log = tmp_path / "trial.log"
    log.write_text("step 3/40 | loss 1.0\n[2026-11-26 10:00:00] torch.distributed.elastic.multiprocessing.api: "
                   "[WARNING] Sending process 123 closing signal SIGTERM\n"
                   "  exitcode  : -9 (pid: 124)\n  error_file: <N/A>\n"
                   "  traceback : Signal 9 (SIGKILL) received by PID 124\n")
    got = outcome(1, log, tmp_path / "summary.json", 3.0)
    assert got["status"] == "oom", got


def test_a_resume_that_changes_the_model_but_not_its_shapes_is_refused(tmp_path, capsys):
    """n_head 2 → 4 keeps every parameter's shape: the checkpoint loaded, and its weights were trained on under
    another head split, unsaid. Dropout may change; the same args resume."""
    gpt = [f"run.out_dir={lit(tmp_path)}", "run.name=g", 'model.name="gpt"', "model.args.n_layer=1",
           "model.args.n_embd=16", "model.args.block_size=16", "data.args.block_size=16", "data.batch_size=4",
           "compile.enabled=false", "checkpoint.every=2", "data.eval_batches=0", "train.log_every=1"]
    assert main(["train", "gpt-shakespeare", *gpt, "model.args.n_head=2", "train.steps=2"]) == 0
    capsys.readouterr()
    rc = main(["train", "gpt-shakespeare", *gpt, "model.args.n_head=4", "train.steps=4"])
    line = error_line(capsys.readouterr().err)
    assert rc == 2 and "model.args.n_head = 2; this run has 4" in line and 'checkpoint.resume="never"' in line, line
    assert main(["train", "gpt-shakespeare", *gpt, "model.args.n_head=2", "model.args.dropout=0.1",
                 "train.steps=4"]) == 0
    assert "resumed from step 2" in capsys.readouterr().out


def test_watch_shows_an_alerts_whole_message_with_its_fix(tmp_path):
    """watch cut each alert at ~120 characters: the fix, at the end of the message, was what was cut."""
    from turbotrain.report import RunFiles
    from turbotrain.watch import _alert_lines

    msg = "throughput 12.5 samples/s is 20% of the median 61.2 of the earlier log windows " * 2 + "FIX: do this"
    run = RunFiles(path=tmp_path, alerts=[
        {"step": 7, "rank": 0, "rule": "throughput_drop", "message": msg}])
    lines = _alert_lines(run, 80)
    assert "FIX: do this" in " ".join(x.strip() for x in lines) and all(len(x) <= 80 for x in lines), lines


def test_a_rerun_of_a_run_without_checkpoints_says_it_starts_over(tmp_path, capsys):
    """Raising train.steps continues a run only from a checkpoint: without one the rerun trained from step 0 and
    said only that the earlier run was moved aside."""
    over = ["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "checkpoint.every=0"]
    assert main([*over, "train.steps=2"]) == 0
    capsys.readouterr()
    assert main([*over, "train.steps=4"]) == 0
    out = capsys.readouterr().out
    assert "held an earlier run" in out and "no checkpoint to resume from" in out and "checkpoint.every" in out, out


def test_a_misspelt_model_arg_or_dataset_name_gets_the_closest(tmp_path, capsys):
    assert main(["train", "mlp-seed", f"run.out_dir={lit(tmp_path)}", "model.args.widht=8"]) == 2
    assert "(did you mean width?)" in error_line(capsys.readouterr().err)
    assert main(["data", "fetch", "shakespear"]) == 2
    assert "(did you mean shakespeare?)" in error_line(capsys.readouterr().err)


def test_more_loader_workers_than_cpus_is_one_warning_line_not_torchs_paragraph(tmp_path, capsys):
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f"data.num_workers={cpus + 1}",
                 "train.steps=2"]) == 0
    out, err = capsys.readouterr()
    assert f"data.num_workers = {cpus + 1} is more than the {cpus} CPU(s)" in out and "UserWarning" not in err, err


def test_ddp_bucket_advice_only_where_the_gradients_overflow_one_bucket():
    """A model whose gradients fit one bucket was told to double it: the same single all-reduce."""
    from types import SimpleNamespace

    from turbotrain.config import load_config
    from turbotrain.profile import PARTS, verdict

    cfg = load_config("gpt-shakespeare", ['parallel.strategy="ddp"'])
    small = torch.nn.Linear(64, 64)  # 16 KB of gradients, the default bucket is 100 MB
    s = SimpleNamespace(cfg=cfg, trainee=SimpleNamespace(device=torch.device("cuda"), dtype="bf16", model=small),
                        batches=SimpleNamespace(resident=True))
    kind, recs = verdict(dict.fromkeys(PARTS, 0.0) | {"forward": 0.3, "backward": 0.4, "exposed_comm": 0.3}, s, {})
    advice = [r["set"] for r in recs]
    assert kind == "communication-bound" and not any("bucket_cap_mb" in a for a in advice), advice
    assert advice[0] == "train.grad_accum=2", advice
