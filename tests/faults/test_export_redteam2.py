"""Red-team cases of `turbotrain export` against the run directories around it: an --out inside any run directory
(another run, its final/ or a checkpoint, the exported run itself) or over existing files is refused; RUN/final
as the run stands for RUN; a run still training is refused, and one started mid-export is kept out; a checkpoint
that vanishes or fails while it is read is passed over for the one before; every refusal creates nothing."""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

import turbotrain
import turbotrain.export as export_mod
from tests.faults.common import error_line
from tests.faults.test_export_redteam import _train
from tests.helpers import TESTS
from turbotrain.checkpoint import Checkpointer
from turbotrain.cli import main
from turbotrain.errors import UserError
from turbotrain.export import export
from turbotrain.rundir import RunConfig, RunDir

pytestmark = pytest.mark.usefixtures("userpkg_importable")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Two finished runs (a: checkpoints and final/, b: final/ only) and an unfinished one (checkpoints at steps 2
    and 4, no final/), copied per case."""
    sys.path.insert(0, str(TESTS))
    try:
        base = tmp_path_factory.mktemp("built")
        return {"a": _train(base / "a", None, "checkpoint.every=2"), "b": _train(base / "b"),
                "unfinished": _train(base / "u", None, "checkpoint.every=2", "checkpoint.final=false")}
    finally:
        sys.path.remove(str(TESTS))


@pytest.fixture
def runs(tmp_path, built) -> dict[str, Path]:
    """Per-case copies under tmp_path/runs/ (the lock files copied too: plain files, no one holds them)."""
    return {k: Path(shutil.copytree(v, tmp_path / "runs" / k)) for k, v in built.items()}


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None: a folder): equal before and after means nothing was written."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["export", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def refused(capsys, *argv: str) -> str:
    rc, _, err = cli(capsys, *argv)
    assert rc == 2, err
    return error_line(err)


# ------------------------------------------------------------------ --out inside a run directory

OUT_INSIDE = {  # where --out points -> (the run directory named in the error, the path relative to tmp_path)
    "other-run": ("b", "runs/b"),
    "other-final": ("b", "runs/b/final"),
    "other-new-folder": ("b", "runs/b/exports/mine"),
    "other-tb": ("b", "runs/b/tb/x"),
    "checkpoint": ("a", "runs/a/checkpoints/step-00000004"),
    "in-a-checkpoint": ("a", "runs/a/checkpoints/step-00000004/sub"),
    "checkpoints-folder": ("a", "runs/a/checkpoints"),
    "the-run-itself": ("a", "runs/a"),
    "its-final": ("a", "runs/a/final"),
    "an-unfinished-run": ("unfinished", "runs/unfinished/checkpoints/step-00000002"),
    "another-runs-export": ("b", "runs/b/export/safetensors"),
}


@pytest.mark.parametrize("fmt", ["safetensors", "hf"])
@pytest.mark.parametrize("named, rel", OUT_INSIDE.values(), ids=OUT_INSIDE.keys())
def test_out_inside_any_run_directory_is_refused_and_writes_nothing(tmp_path, capsys, runs, named, rel, fmt):
    before = tree(tmp_path)
    line = refused(capsys, str(runs["a"]), "--format", fmt, "--out", str(tmp_path / rel))
    assert f"inside the run directory {runs[named]} (" in line and "choose a folder outside" in line, line
    assert tree(tmp_path) == before
    assert all(Checkpointer.verify(p) is None for p in (runs["a"] / "checkpoints").iterdir())  # resumes as before


def test_out_through_a_link_into_a_run_or_a_previous_run_is_refused(tmp_path, capsys, runs):
    (tmp_path / "link").symlink_to(runs["b"] / "final")
    shutil.copytree(runs["b"], runs["a"] / "previous-1", ignore=shutil.ignore_patterns("previous-*"))
    (runs["a"] / "export").symlink_to(runs["b"])  # the run's own export/ a link into another run
    before = tree(tmp_path)
    previous = runs["a"] / "previous-1"
    for out, named in ((tmp_path / "link" / "x", runs["b"]), (previous / "new", previous)):
        line = refused(capsys, str(runs["a"]), "--format", "safetensors", "--out", str(out))
        assert f"inside the run directory {named} (" in line, line
    line = refused(capsys, str(runs["a"]), "--format", "safetensors")  # the default, through that link
    assert f"inside the run directory {runs['b']} (" in line, line
    assert tree(tmp_path) == before


def test_the_final_folder_as_the_run_is_the_run(tmp_path, capsys, runs):
    run = runs["a"]
    final_before = tree(run / "final")
    rc, _, err = cli(capsys, str(run / "final"), "--format", "safetensors")
    assert rc == 0, err
    assert tree(run / "final") == final_before  # nothing exported into final/
    assert sorted(p.name for p in (run / "export" / "safetensors").iterdir()) == \
        ["config.toml", "final.json", "model.safetensors"]
    x = torch.randn(3, 8)
    torch.testing.assert_close(turbotrain.load(run / "export" / "safetensors", "cpu")(x),
                               turbotrain.load(run, "cpu")(x), rtol=0, atol=0)
    # the run's own final/ as --out is refused too, whichever way the run is named
    line = refused(capsys, str(run / "final"), "--format", "safetensors", "--out", str(run / "final"))
    assert f"inside the run directory {run} (" in line, line


@pytest.mark.parametrize("out", ["", " "])
def test_an_empty_out_is_refused_not_taken_as_the_current_folder(tmp_path, capsys, monkeypatch, runs, out):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts the current directory first
    before = tree(tmp_path)
    line = refused(capsys, str(runs["a"]), "--format", "safetensors", "--out", out)
    assert "--out ''" in line and "unset shell variable" in line, line
    with pytest.raises(UserError, match="names no folder"):
        export(runs["a"], "safetensors", out)
    with pytest.raises(UserError, match="names no folder"):
        export(out, "safetensors")
    assert tree(tmp_path) == before


def test_out_over_existing_files_is_refused_an_empty_folder_taken(tmp_path, capsys, runs):
    run, mine = runs["a"], tmp_path / "mine"
    assert cli(capsys, str(run), "--format", "safetensors", "--out", str(mine))[0] == 0
    before = tree(tmp_path)
    for out in (mine, mine / "model.safetensors"):  # an earlier export, a file
        line = refused(capsys, str(run), "--format", "safetensors", "--out", str(out))
        assert "already exists" in line, line
    line = refused(capsys, str(run), "--format", "safetensors", "--out", str(mine / "model.safetensors" / "x"))
    assert "cannot create it" in line and "is a file" in line, line
    assert tree(tmp_path) == before
    (tmp_path / "empty").mkdir()
    assert cli(capsys, str(run), "--format", "safetensors", "--out", str(tmp_path / "empty"))[0] == 0
    assert (tmp_path / "empty" / "model.safetensors").read_bytes() == (run / "final" / "model.safetensors").read_bytes()
    # the run's own default folder is the one place an earlier export is replaced (whole)
    for _ in range(2):
        assert cli(capsys, str(run), "--format", "safetensors")[0] == 0
    assert sorted(p.name for p in (run / "export").iterdir()) == ["safetensors"]


def test_a_failed_write_leaves_no_half_export(tmp_path, capsys, monkeypatch, runs):
    copy = shutil.copyfile

    def full_disk(src, dst, *a, **k):
        if Path(dst).name == "config.toml":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return copy(src, dst, *a, **k)

    monkeypatch.setattr(export_mod.shutil, "copyfile", full_disk)
    line = refused(capsys, str(runs["a"]), "--format", "safetensors", "--out", str(tmp_path / "out" / "st"))
    assert "No space left on device" in line, line
    assert list((tmp_path / "out").iterdir()) == []  # neither the export nor its temporary folder


# ------------------------------------------------------------------ a run still training

def _hold(run: Path, text: str = "4242 trainhost\n") -> int:
    """What a training run's rank 0 does to its directory (rundir.RunDir._take_lock)."""
    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, text.encode())
    return fd


@pytest.mark.parametrize("which", ["a", "unfinished"])
@pytest.mark.parametrize("fmt", ["safetensors", "hf"])
def test_a_run_still_training_is_refused_and_nothing_written(tmp_path, capsys, runs, which, fmt):
    run = runs[which]
    fd = _hold(run)
    try:
        before = tree(tmp_path)
        for argv in ((str(run),), (str(run / "final"),), (str(run), "--out", str(tmp_path / "elsewhere"))):
            if not argv[0].endswith("final") or (run / "final").is_dir():
                line = refused(capsys, *argv, "--format", fmt)
                assert line == (f"error: {run} is still training (pid 4242 on trainhost); export it when it "
                                "finishes, or copy it first"), line
        assert tree(tmp_path) == before
        # the named way out: a copy is held by no one
        copy = shutil.copytree(run, tmp_path / "copy")
        assert cli(capsys, str(copy), "--format", "safetensors")[0] == 0
    finally:
        os.close(fd)
    assert cli(capsys, str(run), "--format", "safetensors")[0] == 0  # once it has finished


def test_a_run_started_during_the_export_is_refused(tmp_path, capsys, monkeypatch, runs):
    """The export holds the lock shared while it writes: a run started meanwhile cannot take the directory
    (rotating the checkpoints read, setting final/ aside mid-write)."""
    run, write_final, seen = runs["unfinished"], export_mod.write_final, []

    def start_a_run_first(*a, **k):
        with pytest.raises(UserError, match="in use by another run"):
            RunDir(RunConfig(name=run.name, out_dir=str(run.parent)), True).open()
        seen.append(True)
        return write_final(*a, **k)

    monkeypatch.setattr(export_mod, "write_final", start_a_run_first)
    assert cli(capsys, str(run), "--format", "safetensors")[0] == 0 and seen
    RunDir(RunConfig(name=run.name, out_dir=str(run.parent)), True).open().release()  # free again after


# ------------------------------------------------------------------ a checkpoint vanishing mid-export

def _model_state(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt / "state.pt", weights_only=True)["model"]


def _vanish_after_verify(monkeypatch, names: set[str]) -> None:
    """Delete the named checkpoints right after they verify, before they are read (a run's rotation)."""
    verify = Checkpointer.verify

    def then_gone(path: Path):
        problem = verify(path)
        if path.name in names:
            shutil.rmtree(path)
        return problem

    monkeypatch.setattr(Checkpointer, "verify", staticmethod(then_gone))


def _raise_in_verify(monkeypatch, names: set[str]) -> None:
    """verify itself meets a file removed under it (rglob, sha256 of a vanished file)."""
    verify = Checkpointer.verify

    def racing(path: Path):
        if path.name in names:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path / "state.pt"))
        return verify(path)

    monkeypatch.setattr(Checkpointer, "verify", staticmethod(racing))


def _unreadable_state(monkeypatch, names: set[str]) -> None:
    """state.pt fails while read (truncated by a crash after verification)."""
    from turbotrain import checkpoint

    load = checkpoint._safe_torch_load

    def failing(f, what):
        if Path(f.name).parent.name in names:
            raise checkpoint.CorruptCheckpoint(f"{what} is truncated or damaged (EOFError)")
        return load(f, what)

    monkeypatch.setattr(checkpoint, "_safe_torch_load", failing)


VANISH = {"deleted-after-verify": _vanish_after_verify, "gone-during-verify": _raise_in_verify,
          "fails-while-read": _unreadable_state}


@pytest.mark.parametrize("vanish", VANISH.values(), ids=VANISH.keys())
def test_a_checkpoint_that_vanishes_mid_export_passes_to_the_one_before(tmp_path, capsys, monkeypatch, runs, vanish):
    run = runs["unfinished"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000002", "step-00000004"]
    want = _model_state(run / "checkpoints" / "step-00000002")
    vanish(monkeypatch, {"step-00000004"})
    rc, out, err = cli(capsys, str(run), "--format", "safetensors")
    assert rc == 0 and "Traceback" not in err, err
    assert "checkpoint step-00000004 cannot be exported" in out and "comes from checkpoint step-00000002" in out, out
    got = turbotrain.load(run / "export" / "safetensors", "cpu").state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("vanish", VANISH.values(), ids=VANISH.keys())
def test_when_every_checkpoint_vanishes_it_is_one_line_and_nothing_written(tmp_path, capsys, monkeypatch, runs,
                                                                          vanish):
    run = runs["unfinished"]
    vanish(monkeypatch, {"step-00000002", "step-00000004"})
    line = refused(capsys, str(run), "--format", "safetensors")
    assert "no good checkpoint to export from" in line, line
    assert not (run / "final").exists() and not (run / "export").exists()


# ------------------------------------------------------------------ every check before anything is written

def test_hf_for_a_non_hf_model_writes_nothing_even_from_a_checkpoint(tmp_path, capsys, runs):
    for which in ("a", "unfinished"):
        before = tree(tmp_path)
        line = refused(capsys, str(runs[which]), "--format", "hf")
        assert "--format hf needs an HF model" in line and "'userpkg.models:linear'" in line, line
        assert tree(tmp_path) == before  # no final/ from the checkpoint, no export/hf/


@pytest.mark.parametrize("what", ["empty", "files", "tb", "checkpoints", "a-checkpoint"])
def test_a_folder_that_is_not_a_run_is_said_so_and_nothing_written(tmp_path, capsys, runs, what):
    folder = {"tb": runs["a"] / "tb", "checkpoints": runs["a"] / "checkpoints",
              "a-checkpoint": runs["a"] / "checkpoints" / "step-00000004"}.get(what, tmp_path / "plain")
    folder.mkdir(exist_ok=True)
    if what == "files":
        (folder / "notes.txt").write_text("hello")
    before = tree(tmp_path)
    for fmt in ("safetensors", "hf"):
        line = refused(capsys, str(folder), "--format", fmt)
        assert f"{folder}: not a run directory" in line and "no final/model.safetensors" not in line, line
    assert tree(tmp_path) == before
    with pytest.raises(UserError, match="not a run directory"):
        turbotrain.load(folder)


def test_other_refusals_create_no_folder(tmp_path, capsys, runs):
    """The checks that come after the destination's (a damaged final/) leave no export/ behind either."""
    run = runs["a"]
    (run / "final" / "final.json").write_text("[")
    before = tree(tmp_path)
    for argv in ((), ("--out", str(tmp_path / "new" / "deep"))):
        line = refused(capsys, str(run), "--format", "safetensors", *argv)
        assert "final.json is damaged" in line, line
    assert tree(tmp_path) == before
