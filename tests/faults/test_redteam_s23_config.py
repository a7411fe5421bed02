"""Red-team cases of the config and the command line: a stdout that cannot take the output (a pipe whose reader
exited, a full disk, a closed stream), launcher variables that `turbotrain env` must report as `train` would treat
them, misspelt names that deserve a suggestion, scalars given where a string goes, and config files whose name
holds `=`. Each user mistake is one `error:` line, exit 2, no traceback. In-process through `turbotrain.cli.main`."""
from __future__ import annotations

import errno
import io
import os
import sys

import pytest
import torch

from tests.faults.common import error_line
from turbotrain import cli
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.env import describe_distributed
from turbotrain.errors import UserError


@pytest.fixture(autouse=True)
def _keep_paths(monkeypatch):
    """The CLI puts the config's folder and the cwd first on sys.path and PYTHONPATH: undo it after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))


class _Unwritable(io.TextIOBase):
    """A stdout whose writes fail as a pipe with no reader or a full disk does (no descriptor: fileno raises)."""

    def __init__(self, exc: OSError):
        self.exc = exc

    def write(self, text: str) -> int:
        raise self.exc


# ---------------------------------------------------------------- stdout that cannot take the output

@pytest.mark.parametrize("exc, said", [
    (BrokenPipeError(errno.EPIPE, "Broken pipe"), "cannot write to stdout (its reader exited)"),
    (OSError(errno.ENOSPC, "No space left on device"), "a write failed (No space left on device)")])
@pytest.mark.parametrize("argv", [["presets"], ["config", "--reference"]])
def test_stdout_that_fails_is_one_error_line(capsys, monkeypatch, argv, exc, said):
    monkeypatch.setattr(sys, "stdout", _Unwritable(exc))
    assert main(argv) == 2
    assert said in error_line(capsys.readouterr().err)


def test_closed_stdout_is_said_not_silently_empty(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)  # what Python sets when fd 1 is closed (`turbotrain presets >&-`)
    assert main(["presets"]) == 2
    assert "stdout is closed" in error_line(capsys.readouterr().err)


def test_a_failed_write_that_names_its_file_is_not_taken_for_stdout(capsys, monkeypatch):
    def fail(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/some/file")

    monkeypatch.setitem(cli.COMMANDS, "presets", fail)
    assert main(["presets"]) == 2
    line = error_line(capsys.readouterr().err)
    assert "stdout" not in line and "/some/file" in line


# ---------------------------------------------------------------- `turbotrain env` and launcher variables

SRUN_STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}


@pytest.mark.parametrize("environ, key, said", [
    ({"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_MAX_RESTARTS": "abc"}, "restarts", "TORCHELASTIC_MAX_RESTARTS"),
    ({**SRUN_STEP, "SLURM_NTASKS": "abc"}, "launcher", "SLURM_NTASKS='abc' is not an integer"),
    ({**SRUN_STEP, "SLURM_STEP_NUM_TASKS": "x", "SLURM_NTASKS": "4"}, "launcher", "SLURM_STEP_NUM_TASKS"),
])
def test_env_reports_malformed_launcher_integers(environ, key, said):
    assert said in describe_distributed(environ)[key]


@pytest.mark.parametrize("environ, said", [({"RANK": "abc"}, "RANK='abc' is not an integer"),
                                           ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK=5 is out of range")])
def test_env_says_train_would_refuse_the_torchrun_variables(monkeypatch, environ, said):
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    launcher = describe_distributed()["launcher"]
    assert launcher.startswith("torchrun, refused") and said in launcher


def test_env_of_a_malformed_launcher_is_no_traceback(capsys, monkeypatch):
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_MAX_RESTARTS": "abc"}.items():
        monkeypatch.setenv(k, v)
    assert main(["env"]) == 0
    assert "restarts: refused" in capsys.readouterr().out


def test_env_of_a_well_formed_launcher_is_unchanged(monkeypatch):
    assert describe_distributed({"RANK": "0", "WORLD_SIZE": "2"})["launcher"] == "torchrun (rank 0 of 2)"
    assert describe_distributed({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "abc"})["launcher"].startswith("none")


# ---------------------------------------------------------------- names that deserve a suggestion

@pytest.mark.parametrize("argv, said", [
    (["train", "mlp-seed", "train.stepz=3"], "unknown key train.stepz (did you mean steps?)"),
    (["train", "mlp-seed", "train.grad-accum=3"], "(did you mean grad_accum?)"),
    (["train", "mlp-seed", "Train.steps=3"], "unknown section [Train] (did you mean train?)"),
    (["train", "mlp-seed", "trian.steps=3"], "(did you mean train?)"),
    (["train", "mlp_seed"], "(did you mean mlp-seed?)"),
    (["train", "MLP-Seed"], "(did you mean mlp-seed?)"),
    (["train", "mlp-seed.toml"], "not found (the preset is mlp-seed, without .toml)"),
])
def test_misspelt_names_get_a_suggestion(capsys, argv, said):
    assert main(argv) == 2
    assert said in error_line(capsys.readouterr().err)


def test_no_suggestion_when_nothing_is_close():
    with pytest.raises(UserError) as e:
        load_config("mlp-seed", ["train.xyzzy=1"])
    assert "did you mean" not in str(e.value)


# ---------------------------------------------------------------- scalars where a string goes

@pytest.mark.parametrize("value, shown", [("1", "1"), ("true", "true"), ("2026-01-01", "2026-01-01"),
                                          ("12:00:00", "12:00:00")])
def test_a_scalar_for_a_string_says_how_to_quote_it(value, shown):
    with pytest.raises(UserError) as e:
        load_config("mlp-seed", [f"run.name={value}"])
    assert str(e.value) == f'run.name = {shown}: expected a string; quote it to make it a string: "{shown}"'


def test_a_date_for_a_number_is_shown_as_written():
    with pytest.raises(UserError, match=r"^train.steps = 2026-01-01: expected an integer$"):
        load_config("mlp-seed", ["train.steps=2026-01-01"])


# ---------------------------------------------------------------- a config file whose name holds `=`

@pytest.mark.parametrize("arg", ["a=b.toml", "./a=b.toml"])
def test_config_file_with_equals_in_its_name_is_a_file(tmp_path, monkeypatch, arg):
    (tmp_path / "a=b.toml").write_text('extends = "mlp-seed"\n[train]\nsteps = 2\n')
    monkeypatch.chdir(tmp_path)
    seen = {}
    monkeypatch.setattr("turbotrain.trainer.train", lambda cfg, *a, **k: seen.setdefault("cfg", cfg))
    assert main(["train", arg, "train.lr=0.5"]) == 0
    assert (seen["cfg"].train.steps, seen["cfg"].train.lr, seen["cfg"].model.name) == (2, 0.5, "mlp")


def test_missing_path_with_equals_is_not_read_as_an_override(capsys, tmp_path):
    assert main(["train", f"{tmp_path}/a=b.toml"]) == 2
    assert "config file" in error_line(capsys.readouterr().err)


def test_override_in_the_config_slot_still_means_the_default_preset(monkeypatch):
    seen = {}
    monkeypatch.setattr("turbotrain.trainer.train", lambda cfg, *a, **k: seen.setdefault("cfg", cfg))
    assert main(["train", 'model.args."a/b"=1', "train.steps=2"]) == 0
    assert seen["cfg"].model.args["a/b"] == 1 and seen["cfg"].model.name == "gpt"


# ---------------------------------------------------------------- a loader setting that cannot apply

def test_prefetch_without_workers_is_said_and_not_recorded(capsys):
    """DataLoader gets prefetch_factor=None without workers: config.toml must not say 8 batches were prefetched."""
    from turbotrain.resolve import Facts, resolve

    cfg = load_config("mlp-seed", ["data.num_workers=0", "data.prefetch_factor=8"])
    out = resolve(cfg, Facts(device=torch.device("cpu")))
    assert out.data.prefetch_factor == "auto"
    assert 'data.prefetch_factor: 8 → "auto" (data.num_workers = 0' in capsys.readouterr().out
    kept = resolve(load_config("mlp-seed", ["data.num_workers=2", "data.prefetch_factor=8"]),
                   Facts(device=torch.device("cpu")))
    assert kept.data.prefetch_factor == 8


# ---------------------------------------------------------------- the Python API's load_config

def test_load_config_takes_a_path_object(tmp_path):
    cfg_file = tmp_path / "mine.toml"
    cfg_file.write_text('extends = "mlp-seed"\n[train]\nsteps = 2\n')
    cfg = load_config(cfg_file)
    assert (cfg.train.steps, cfg.run.name) == (2, "mine")


@pytest.mark.parametrize("source, overrides, said", [
    (123, [], "load_config: source = 123 (int)"),
    (b"mlp-seed", [], "(bytes); expected a preset name or a .toml path"),
    ("mlp-seed", "train.steps=3", 'overrides = "train.steps=3": expected a list of KEY=VALUE strings'),
    ("mlp-seed", [3], "overrides = [3]: expected a list"),
    ("mlp-seed", ["train.steps=3", None], "expected a list of KEY=VALUE strings"),
    ("mlp-seed", {"train.steps": 3}, "expected a list of KEY=VALUE strings"),
])
def test_load_config_of_the_wrong_kind_of_object_is_a_user_error(source, overrides, said):
    with pytest.raises(UserError) as e:
        load_config(source, overrides)
    assert said in str(e.value) and "\n" not in str(e.value)
