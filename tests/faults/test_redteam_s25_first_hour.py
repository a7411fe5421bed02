"""Red team, session 25: a new user's first hour from the README and --help alone. A key written in the wrong
section (`lr` under [model], above every header, or as `lr=1e-3` on the command line) is named with the section
it belongs to; `train.lr = 3` typed with spaces says so; a number in quotes or an integer written as 1e3 says
how to write it; every command's own --help says what it does; the README's Quick tour export of the
"Bring your own model" run and its Python API line work as written. In-process through `turbotrain.cli.main`."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.faults.common import error_line
from turbotrain.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(autouse=True)
def _keep_paths(monkeypatch):
    """The CLI puts the config's folder and the cwd first on sys.path and PYTHONPATH: undo it after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))


# ---------------------------------------------------------------- a key in the wrong place

@pytest.mark.parametrize("toml, overrides, said", [
    ("[model]\nlr = 1e-3\n", [], "unknown key model.lr (lr is a key of [train]: train.lr)"),
    ("", ["train.batch_size=8"], "unknown key train.batch_size (batch_size is a key of [data]: data.batch_size)"),
    ("lr = 1e-3\n", [], "lr = 0.001 is outside any section (lr is a key of [train]: train.lr); write it under "
                        "[train]"),
    ("foo = 1\n", [], "foo = 1 is outside any section; keys go under a [section]"),
    ("", ["lr=1e-3"], 'override "lr=1e-3": no section given; did you mean train.lr=1e-3?'),
    ("[train]\ncompile = true\n", [], "(compile is a section of its own: [compile], e.g. compile.enabled)"),
    ("[train]\nsteps = 2\nextends = \"mlp-seed\"\n", [], "(extends goes at the top of the file, before any"),
    ("", ["args.n=1"], "unknown section [args] (args is a key of [model] and [data]: model.args)"),
])
def test_a_key_in_the_wrong_place_names_where_it_belongs(tmp_path, capsys, toml, overrides, said):
    """Each said only 'unknown key model.lr; valid keys in [model]: name, args' (or 'unknown section [lr]' for a
    key above every header): the user had to search docs/config.md for where lr lives."""
    path = tmp_path / "my.toml"
    path.write_text(f'extends = "mlp-seed"\n{toml}')
    assert main(["config", str(path), *overrides]) == 2
    assert said in error_line(capsys.readouterr().err)


@pytest.mark.parametrize("overrides", [["train.lr", "=", "3"], ["train.lr", "=3"]])
def test_an_override_typed_with_spaces_around_the_equals_says_so(capsys, overrides):
    assert main(["config", "mlp-seed", *overrides]) == 2
    assert "write KEY=VALUE as one argument, with no spaces around the =" in error_line(capsys.readouterr().err)


@pytest.mark.parametrize("line, said", [
    ('[train]\nlr = "1e-3"\n', 'train.lr = "1e-3": expected a number; write it without quotes: 1e-3'),
    ('[compile]\nenabled = "false"\n', "write it without quotes: false"),
    ("[train]\nsteps = 1e3\n", "train.steps = 1000.0: expected an integer; write 1000"),
])
def test_a_value_of_the_wrong_toml_type_says_how_to_write_it(tmp_path, capsys, line, said):
    path = tmp_path / "my.toml"
    path.write_text(f'extends = "mlp-seed"\n{line}')
    assert main(["config", str(path)]) == 2
    assert said in error_line(capsys.readouterr().err)


def test_a_string_that_is_no_number_gets_no_unquoting_hint(capsys):
    assert main(["config", "mlp-seed", "train.steps=ten"]) == 2
    assert error_line(capsys.readouterr().err) == 'error: train.steps = "ten": expected an integer'


# ---------------------------------------------------------------- --help

@pytest.mark.parametrize("argv, said", [
    (["env"], "device, versions, peak FLOP/s"), (["env"], "--json print it as one JSON object"),
    (["data"], "list or fetch datasets"), (["data", "fetch"], "a dataset of `turbotrain data list`"),
    (["presets"], "list the built-in presets"), (["report"], "a run's folder"), (["watch"], "live terminal view"),
    (["export"], "safetensors: any model; hf: a model built from Hugging"),
])
def test_every_commands_own_help_says_what_it_does(capsys, argv, said):
    """`turbotrain export --help` showed only `--format {safetensors,hf}` and RUN_DIR, nothing of what either is."""
    assert main([*argv, "--help"]) == 0
    assert said in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------- the README as written

def _write_example(folder: Path) -> None:
    section = README.read_text().split("## Bring your own model and data", 1)[1].split("\n## ", 1)[0]
    for body in re.findall(r"```(?:python|toml)\n(.*?)```", section, flags=re.S):
        path = folder / body.splitlines()[0][2:].strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)


def test_the_quick_tours_export_of_the_example_run_works(tmp_path, monkeypatch, capsys):
    """The tour said `turbotrain export runs/my --format hf`, which refuses runs/my: the README's own model is
    an nn.Sequential, not an hf: model."""
    _write_example(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "my.toml", "train.steps=2", "data.num_workers=0", "train.warmup_steps=0"]) == 0
    tour = README.read_text().split("## Quick tour", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    export = next(ln.split("#", 1)[0].split() for ln in tour.splitlines() if ln.startswith("turbotrain export"))
    assert export[1:3] == ["export", "runs/my"]
    assert main(export[1:]) == 0, capsys.readouterr().err
    assert list((tmp_path / "runs" / "my" / "export").glob("*/*.safetensors"))


def test_the_readmes_python_api_line_trains(tmp_path, monkeypatch):
    """The README called `turbotrain.train(cfg, ...)` without saying where cfg comes from (a preset name there is
    refused): the line that makes it is in the README now, and runs."""
    import torch

    import turbotrain

    _write_example(tmp_path)
    monkeypatch.chdir(tmp_path)
    text = " ".join(README.read_text().split("From Python:", 1)[1].split("\n\n", 1)[0].split())
    made = re.search(r"`(cfg = turbotrain\.load_config\([^`]*\))`", text)
    assert made, text
    scope = {"turbotrain": turbotrain}
    exec(made.group(1), scope)
    cfg = scope["cfg"]
    cfg.train.steps, cfg.train.warmup_steps, cfg.data.num_workers = 2, 0, 0
    tokens = torch.randint(0, 65, (64, 33))
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    model = torch.nn.Sequential(torch.nn.Embedding(65, 16), torch.nn.Linear(16, 65))
    summary = turbotrain.train(cfg, model=model, train_data=data, val_data=data)
    assert summary["steps"] == 2 and summary["val_loss"] is not None


# ---------------------------------------------------------------- a GPU preset on a CPU

@pytest.mark.parametrize("preset, warned", [("gpt2-124m", True), ("resnet50-synthetic", True),
                                            ("gpt-shakespeare", False)])
def test_a_gpu_preset_started_on_a_cpu_says_so_before_it_starts(monkeypatch, capsys, preset, warned):
    """`turbotrain train gpt2-124m` on a CPU said only that CUDA graphs were off, then compiled for minutes
    before its first step: it looked like a hang. The training itself is not what is tested here: it is left
    out so the test stays fast."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("the warning is for a machine without a GPU")
    started = []
    monkeypatch.setattr("turbotrain.trainer.train", lambda cfg, *a, **k: started.append(cfg) or {})
    assert main(["train", preset]) == 0
    out = capsys.readouterr().out
    assert started and (f"warning: {preset} is sized for a GPU and this machine has none" in out) == warned, out
