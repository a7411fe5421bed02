"""Red-team cases of compile caches, dataset caches, user `module:name` specs and run/export folders: a compile
cache folder inductor cannot write in is refused up front (torch's default caches instead), and a later run with
the cache off stops writing to it; a damaged checksums table is a damaged meta.json, not a traceback; a spec that
is a file path, relative or spaced is named as such, not blamed on the user's module; a module shadowed by the
standard library is named; a module that changes folder at import does not move the run; an --out inside the
default export folders is refused; a fresh run sets the earlier run's export aside with it."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from tests.faults.common import BASE_TOML, error_line, lit
from tests.faults.test_data_cache import offline  # noqa: F401 (a fixture)
from tests.faults.test_export_redteam import _copy, finished  # noqa: F401 (a fixture)
from turbotrain.accel.compile import CompileConfig
from turbotrain.accel.compile_cache import cache_folder, device_key, open_compile_cache
from turbotrain.cli import main
from turbotrain.data import fetch
from turbotrain.errors import UserError
from turbotrain.plugins import load_object

pytestmark = pytest.mark.usefixtures("userpkg_importable")

CPU = torch.device("cpu")
CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


# ---------------------------------------------------------------- compile cache folders

@pytest.mark.parametrize("blocked", ["inductor", "triton"])
def test_a_cache_folder_inductor_cannot_write_in_is_not_pointed_at(tmp_path, monkeypatch, capsys, blocked):
    """A file where the cache's inductor/ or triton/ goes: inductor would fail its compile on it (it creates the
    folder at each use), so the run compiles with torch's default caches, saying so once."""
    for var in CACHE_VARS:
        monkeypatch.delenv(var, raising=False)
    comp = CompileConfig(enabled=True, cache_dir=str(tmp_path / "cc"))
    folder = tmp_path / "cc" / device_key(CPU)
    folder.mkdir(parents=True)
    (folder / blocked).write_text("not a folder")
    assert open_compile_cache(comp, CPU, "abc") is None
    assert capsys.readouterr().out.count("cannot be made (") == 1
    assert not any(str(tmp_path) in os.environ.get(var, "") for var in CACHE_VARS)


def test_a_later_run_with_the_cache_off_stops_writing_to_it(tmp_path, monkeypatch):
    """The Python API runs many configs in one process: compile.cache=false (or a cache that cannot be used)
    after a cached run put the variables back, rather than keep the first run's folder silently."""
    for var in CACHE_VARS:
        monkeypatch.delenv(var, raising=False)
    assert open_compile_cache(CompileConfig(enabled=True, cache_dir=str(tmp_path)), CPU, "abc") is not None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path))
    assert open_compile_cache(CompileConfig(enabled=True, cache=False), CPU, "abc") is None
    assert not any(var in os.environ for var in CACHE_VARS)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))  # a user's own value stays
    assert open_compile_cache(CompileConfig(enabled=True, cache=False), CPU, "abc") is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "users")


def test_a_relative_cache_dir_is_taken_from_the_folder_the_run_started_in(tmp_path, monkeypatch):
    """Inductor reads the variable at each use: a relative one would follow any later change of folder."""
    monkeypatch.chdir(tmp_path)
    folder = cache_folder(CompileConfig(enabled=True, cache_dir="cc"), CPU)
    assert folder.is_absolute() and folder.parent == tmp_path / "cc"


# ---------------------------------------------------------------- dataset caches

@pytest.mark.parametrize("digest", [5, 1.5, True, {"sha256": "ab"}])
def test_a_checksums_table_of_non_strings_is_a_damaged_meta_not_a_crash(tmp_path, monkeypatch, capsys, digest,
                                                                         offline):  # noqa: F811
    """meta.json's checksums compared as strings: a number there was a TypeError traceback (exit 1)."""
    folder = tmp_path / "shakespeare"
    folder.mkdir()
    (folder / "shakespeare.txt").write_text("not the plays")
    (folder / "meta.json").write_text(json.dumps({"checksums": {"shakespeare.txt": digest}}))
    assert "meta.json is unreadable" in fetch._check_prepared("shakespeare", folder)
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path))
    assert main(["data", "fetch", "shakespeare"]) == 2
    assert "meta.json is unreadable" in error_line(capsys.readouterr().err)


# ---------------------------------------------------------------- module:name specs

@pytest.mark.parametrize("spec, words", [
    ("./userpkg/models.py:linear", "a file path"),
    ("userpkg/models:linear", "a file path"),
    ("userpkg.models.py:linear", "a file path"),
    (".models:linear", "a relative module name"),
    ("userpkg.models: linear", "spaces"),
    (" userpkg.models:linear", "spaces"),
    ("userpkg..models:linear", "not a dotted module name"),
    ("userpkg.models:linear:x", "not a name"),
])
def test_a_spec_that_is_no_module_name_is_said_so(tmp_path, capsys, spec, words):
    """importlib took './x.py' or '.m' as a relative import and the error blamed the user's module ("raised
    TypeError ...; fix it there")."""
    with pytest.raises(UserError, match=words) as e:
        load_object(spec, "model.name")
    assert "fix it there" not in str(e.value)
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", f"model.name={spec!r}"])
    assert rc == 2 and words in error_line(capsys.readouterr().err)


def test_a_module_shadowed_by_the_standard_library_is_named(tmp_path, monkeypatch):
    (tmp_path / "json.py").write_text("def build(dim=8):\n    raise AssertionError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match="rename yours") as e:
        load_object("json:build", "model.name")
    assert str(tmp_path / "json.py") in str(e.value)
    with pytest.raises(UserError, match="rename yours"):
        load_object("json.models:build", "model.name")  # 'json' is not a package: the same cause


def test_a_module_that_changes_folder_at_import_does_not_move_the_run(tmp_path, monkeypatch, capsys):
    """run.out_dir is relative to the folder the run started in; the module moved the whole run elsewhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path / "home")
    monkeypatch.setenv("RT_S23_CHDIR", str(elsewhere))
    monkeypatch.delitem(sys.modules, "userpkg.redteam_s23_cache", raising=False)
    rc = main(["train", str(BASE_TOML), "run.out_dir='runs'", "train.steps=2",
               "model.name='userpkg.redteam_s23_cache:linear'"])
    assert rc == 0
    assert os.getcwd() == str(tmp_path / "home")
    assert (tmp_path / "home" / "runs" / "fault" / "summary.json").is_file() and not any(elsewhere.iterdir())
    assert "changed the working directory" in capsys.readouterr().out


# ---------------------------------------------------------------- export destinations

@pytest.mark.parametrize("inner", ["safetensors/mine", "hf/mine"])
def test_out_inside_a_default_export_folder_is_refused(tmp_path, capsys, finished, inner):  # noqa: F811
    """The next default export of that format replaces its folder whole: an export nested there would go too."""
    run = _copy(finished, tmp_path)
    rc = main(["export", str(run), "--format", "safetensors", "--out", str(run / "export" / inner)])
    assert rc == 2 and "replaces whole" in error_line(capsys.readouterr().err)
    assert not (run / "export").exists()
    rc = main(["export", str(run), "--format", "safetensors", "--out", str(run / "export" / "mine")])
    assert rc == 0 and (run / "export" / "mine" / "model.safetensors").is_file()


def test_out_at_the_runs_export_folder_itself_is_refused(tmp_path, capsys, finished):  # noqa: F811
    run = _copy(finished, tmp_path)
    rc = main(["export", str(run), "--format", "safetensors", "--out", str(run / "export")])
    assert rc == 2 and "folder of exports" in error_line(capsys.readouterr().err)
    assert not (run / "export").exists()


def test_a_fresh_run_sets_the_earlier_runs_export_aside(tmp_path, capsys, finished):  # noqa: F811
    """A fresh run in a directory that held an exported run: its export/ beside the new final/ handed out the
    earlier run's weights as this run's."""
    run = _copy(finished, tmp_path)
    assert main(["export", str(run), "--format", "safetensors"]) == 0
    old = (run / "export" / "safetensors" / "model.safetensors").read_bytes()
    assert main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "run.name='run'", "run.seed=5"]) == 0
    assert "held an earlier run" in capsys.readouterr().out
    assert not (run / "export").exists()
    assert (run / "previous-1" / "export" / "safetensors" / "model.safetensors").read_bytes() == old
