"""Session 23's red-team leftovers fixed outside the helpers' scopes: a finished run whose final/ is missing says how
to get the model from its checkpoint."""
from __future__ import annotations

import shutil

import pytest
import torch

from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.cli import main


def train_cli(tmp_path, *overrides: str) -> int:
    return main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *overrides])


def test_a_finished_run_without_final_names_export_when_rerun(tmp_path, capsys):
    """kill -9 (or an older version) between the end checkpoint and final/: the rerun said "nothing to do" and
    left the user without the model's way out."""
    assert train_cli(tmp_path, "train.steps=2", "checkpoint.every=2") == 0
    capsys.readouterr()
    assert train_cli(tmp_path, "train.steps=2", "checkpoint.every=2") == 2
    assert "export" not in error_line(capsys.readouterr().err)  # final/ is there: nothing to add
    shutil.rmtree(tmp_path / "fault" / "final")
    (tmp_path / "fault" / "summary.json").unlink()
    assert train_cli(tmp_path, "train.steps=2", "checkpoint.every=2") == 2
    line = error_line(capsys.readouterr().err)
    assert "nothing to do" in line and f"turbotrain export {tmp_path / 'fault'}" in line, line
    assert main(["export", str(tmp_path / "fault"), "--format", "safetensors",
                 "--out", str(tmp_path / "model")]) == 0
    assert (tmp_path / "model" / "model.safetensors").is_file()


def test_a_reader_that_goes_away_ends_the_output_not_the_run(tmp_path):
    """`turbotrain train ... | head -1`: the first line after the reader left raised BrokenPipeError, and the run
    died before its checkpoints and final model were written."""
    import subprocess
    import sys

    from tests.helpers import userpkg_env

    cmd = [sys.executable, "-m", "turbotrain", "train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}",
           "train.steps=6", "train.log_every=1", "checkpoint.every=3"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=userpkg_env())
    p.stdout.readline()
    p.stdout.close()  # the reader is gone: every later write to stdout fails with EPIPE
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err.decode()[-2000:]
    run = tmp_path / "fault"
    assert (run / "final").is_dir() and (run / "summary.json").is_file()
    assert sorted(d.name for d in (run / "checkpoints").iterdir() if d.name.startswith("step-"))[-1] == "step-00000006"


def test_launcher_integers_that_are_not_are_one_line_in_train(tmp_path, capsys, monkeypatch):
    """`env` said these; `train` died of int()'s ValueError in the launcher's environment."""
    from turbotrain.distributed.env import restart_store_warning
    from turbotrain.errors import UserError

    for k, v in {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "abc"}.items():
        monkeypatch.setenv(k, v)
    assert train_cli(tmp_path, "train.steps=1") == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith("error: environment: SLURM_NTASKS='abc'"), line
    with pytest.raises(UserError, match="TORCHELASTIC_MAX_RESTARTS='x' is not an integer"):
        restart_store_warning({"TORCHELASTIC_MAX_RESTARTS": "x"})  # read when torchrun starts 2+ ranks


def test_a_warm_up_longer_than_the_run_is_said(tmp_path, capsys):
    """The LR never reached train.lr and nothing said so (a short trial of a long run's config)."""
    assert train_cli(tmp_path, "train.steps=4", "train.warmup_steps=8") == 0
    assert "train.warmup_steps=8 > train.steps=4: the LR rises for the whole run and peaks at 50% of train.lr" \
        in capsys.readouterr().out
    assert train_cli(tmp_path, "train.steps=4", "train.warmup_steps=4", "run.name=b") == 0
    assert "warmup_steps" not in capsys.readouterr().out


def test_bench_compare_that_names_nothing_is_one_line(capsys):
    """`--compare ""` (an unset shell variable) ran the bench without the peers asked for, unsaid."""
    assert main(["bench", "mlp-seed", "--compare", ""]) == 2
    assert error_line(capsys.readouterr().err).startswith("error: --compare names no framework")


def test_a_second_compiled_run_in_one_process_reports_its_own_graph_breaks(tmp_path):
    """dynamo's counters are process-wide: a run after one that broke its graph reported those breaks as its own."""
    import torch

    from tests.helpers import tiny_gpt
    from turbotrain.trainer import train

    def breaks(x):
        torch._dynamo.graph_break()
        return x

    torch._dynamo.reset()
    torch.compile(breaks, backend="eager")(torch.ones(2))
    s = train(tiny_gpt(tmp_path, "train.steps=2", "compile.enabled=true", "compile.backend=aot_eager"))
    assert s["graph_breaks"] == 0 and s["compile_fell_back"] is False


def test_parquet_text_columns_read_strings_and_refuse_other_values(tmp_path, monkeypatch, capsys):
    """A parquet "text" column of numbers trained on their digits (str() of each value), unsaid."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from turbotrain.data.text import _read

    pq.write_table(pa.table({"text": ["to be", None, "or not"]}), tmp_path / "ok.parquet")
    assert _read(tmp_path / "ok.parquet") == "to be\nor not"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"text": [3, 1, 4]}), corpus / "nums.parquet")
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "cache"))
    assert train_cli(tmp_path, 'data.name="text"', f"data.args.path={lit(corpus)}", "data.args.block_size=16") == 2
    line = error_line(capsys.readouterr().err)
    assert "nums.parquet's \"text\" column holds int values" in line, line


class _FailsInEval(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 1)

    def forward(self, x):
        if not self.training:
            raise MemoryError("planted: out of memory in evaluation")
        return self.fc(x).squeeze(-1)


def test_the_python_api_leaves_the_callers_objects_and_streams_as_they_were(tmp_path):
    """An evaluation that failed left the caller's model in eval mode; load() drew from the caller's RNG; a
    callback spec string in code and a config value that cannot be copied died of AttributeError / TypeError."""
    import threading

    import turbotrain
    from turbotrain.config import load_config
    from turbotrain.errors import UserError

    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "train.steps=2", "train.eval_every=1"])
    model = _FailsInEval()
    with pytest.raises(MemoryError):
        turbotrain.train(cfg, model=model)
    assert model.training
    assert turbotrain.train(load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "run.name=ok"]))
    torch.manual_seed(3)
    first = torch.rand(2)
    torch.manual_seed(3)
    turbotrain.load(tmp_path / "ok")
    assert torch.equal(torch.rand(2), first)
    with pytest.raises(UserError, match="got the string 'userpkg.x:Cb'; pass callback objects"):
        turbotrain.train(load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}"]), callbacks=["userpkg.x:Cb"])
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}"])
    cfg.model.args["lock"] = threading.Lock()
    with pytest.raises(UserError, match="holds a value that cannot be copied"):
        turbotrain.train(cfg)
