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
