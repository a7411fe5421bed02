"""Red-team cases of bad inputs: a model (or a module inside it) whose __init__ never calls super().__init__()
ended `turbotrain train` in a traceback from torch ("object has no attribute '_parameters'"), exit 1; a float
given for an integer key past 64 bits (data.batch_size=1e30, model.args.dim=1e30) was told to "write" a 31-digit
integer that is then refused as out of range. Each is one `error:` line, exit 2, no traceback, no run dir.
User code: tests/userpkg/redteam_s27_inputs.py."""
from __future__ import annotations

import pytest

from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.cli import main

PKG = "userpkg.redteam_s27_inputs"


def _train(tmp_path, *overrides: str) -> int:
    return main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path / 'runs')}", "run.name='r'", *overrides])


@pytest.mark.parametrize("factory, part", [
    ("uninitialised", "the model (NoSuperInit)"),
    ("nested", "its module `blocks.0` (NoSuperInit)"),
])
def test_a_module_that_skips_super_init_is_one_error_line_naming_it(tmp_path, capsys, factory, part):
    assert _train(tmp_path, f"model.name='{PKG}:{factory}'") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = error_line(err)
    assert part in line and "super().__init__()" in line and f"{PKG}:{factory}" in line, line
    assert not (tmp_path / "runs" / "r").exists()  # refused before a run dir is made


def test_a_model_that_skips_super_init_given_to_the_python_api_is_a_user_error(tmp_path):
    from userpkg.redteam_s27_inputs import NoSuperInit

    from turbotrain.config import load_config
    from turbotrain.errors import UserError
    from turbotrain.trainer import train

    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path / 'runs')}", "run.name='r'"])
    with pytest.raises(UserError, match=r"NoSuperInit\.__init__ does not call super\(\)\.__init__\(\)"):
        train(cfg, model=NoSuperInit())
    assert not (tmp_path / "runs" / "r").exists()


@pytest.mark.parametrize("argv, said, unsaid", [
    (["config", str(BASE_TOML), "data.batch_size=1e30"], "out of range (a 64-bit integer at most)", "write 1"),
    (["config", str(BASE_TOML), "parallel.bucket_cap_mb=1e308"], "out of range", "write 1"),
    (["config", str(BASE_TOML), "data.batch_size=1e3"], "write 1000", "out of range"),  # the hint still given
    (["config", str(BASE_TOML), f"model.name='{PKG.replace('s27', 's26')}:declared'", "model.args.dim=1e30"],
     "64 bits at most", "write 1"),
    (["config", str(BASE_TOML), f"model.name='{PKG.replace('s27', 's26')}:declared'", "model.args.dim=8.0"],
     "write 8", "64 bits"),
], ids=["batch_size-1e30", "bucket_cap_mb-1e308", "batch_size-1e3", "model-arg-1e30", "model-arg-8.0"])
def test_a_whole_float_for_an_integer_is_told_to_be_written_only_when_it_fits(capsys, argv, said, unsaid):
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err)
    assert said in line and unsaid not in line, line
    assert len(line) < 300, line  # no 300-digit integer spelt out


def test_an_empty_text_file_is_named_in_full_with_the_fix(tmp_path, capsys):
    # the file's base name alone (and "hold" for one file) said neither where it is nor what to do
    empty = tmp_path / "corpus" / "empty.txt"
    empty.parent.mkdir()
    empty.write_text("")
    assert _train(tmp_path, "data.name='text'", f"data.args.path={lit(empty)}") == 2
    line = error_line(capsys.readouterr().err)
    assert f"{empty} holds no text" in line and "point data.args.path at" in line, line
    assert not (tmp_path / "runs" / "r").exists()
