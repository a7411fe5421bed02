"""Red-team cases of the environment and the file system: a stdout that cannot spell `→` or "é", a stdout the
shell closed, a current folder deleted under the shell, standard descriptors closed (`2>&-`), too few file
descriptors for the loader's workers, a file-size limit (`ulimit -f`), run names too long in bytes, and names an
ASCII file-name encoding cannot spell. Each user-caused problem is one `error:` line, exit 2, no traceback; a run
whose output has nowhere to go still trains and writes its directory. In-process through `turbotrain.cli.main`,
except where the interpreter's own start-up (its file-name encoding, its descriptors) is what is tested."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from tests.faults.common import BASE_TOML, error_line, lit
from tests.helpers import TESTS, userpkg_env
from turbotrain import log
from turbotrain.cli import main
from turbotrain.errors import UserError
from turbotrain.rundir import RunConfig, write_run_file

BASE = str(BASE_TOML)


@pytest.fixture(autouse=True)
def _keep_paths(monkeypatch):
    """The CLI puts the config's folder and the cwd first on sys.path and PYTHONPATH: undo it after each test."""
    monkeypatch.setattr(sys, "path", [str(TESTS), *sys.path])
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))


def train(tmp_path, *overrides: str) -> int:
    return main(["train", BASE, f"run.out_dir={lit(tmp_path)}", "train.steps=2", *overrides])


# ---------------------------------------------------------------- stdout

def test_a_stdout_that_cannot_spell_a_character_shows_escapes(tmp_path, monkeypatch, capsys):
    """PYTHONIOENCODING=ascii: the run's `done: ... →` line (and a run name "héllo") failed the finished run with
    UnicodeEncodeError's traceback."""
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii"))
    assert train(tmp_path, 'run.name="héllo"') == 0, capsys.readouterr().err
    sys.stdout.flush()
    assert "\\u2192" in raw.getvalue().decode("ascii") and "h\\xe9llo" in raw.getvalue().decode("ascii")
    assert (tmp_path / "héllo" / "final").is_dir()


def test_config_to_an_ascii_stdout_is_toml_that_reads_back(monkeypatch, capsys):
    """`turbotrain config ... > my.toml` under PYTHONIOENCODING=ascii: a traceback, or (escaped by the stream)
    "h\\xe9llo", which TOML refuses."""
    import tomllib

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii"))
    assert main(["config", BASE, 'run.name="héllo"', 'run.out_dir="/tmp/😀"']) == 0, capsys.readouterr().err
    sys.stdout.flush()
    run = tomllib.loads(raw.getvalue().decode("ascii"))["run"]
    assert (run["name"], run["out_dir"]) == ("héllo", "/tmp/😀")


def test_console_of_the_python_api_survives_an_ascii_stdout(monkeypatch):
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii"))
    log.console("done → runs/é")
    sys.stdout.flush()
    assert raw.getvalue() == b"done \\u2192 runs/\\xe9\n"


def test_a_run_with_stdout_closed_trains_and_writes_its_directory(tmp_path, monkeypatch, capsys):
    """`turbotrain train ... >&-` (nohup, a daemon): Python's stdout is None, and the logger's isatty() on it
    was an AttributeError traceback before a step ran."""
    monkeypatch.setattr(sys, "stdout", None)
    assert train(tmp_path) == 0, capsys.readouterr().err
    assert (tmp_path / "fault" / "final").is_dir() and (tmp_path / "fault" / "metrics.jsonl").stat().st_size


class _Full(io.TextIOBase):
    """A stream on a full disk (`2>/dev/full`), without a descriptor."""

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("argv", [["train", BASE, "train.steps=0"], ["trian"]], ids=["bad-config", "bad-command"])
def test_a_stderr_that_cannot_take_the_error_line_keeps_exit_code_2(monkeypatch, argv):
    """`turbotrain ... 2>/dev/full` (or stderr's reader gone): the error line's own write failed, and the exit
    code of a user error became 1 with an exception."""
    monkeypatch.setattr(sys, "stderr", _Full())
    assert main(argv) == 2


# ---------------------------------------------------------------- the process's surroundings

def test_a_deleted_current_folder_is_one_error_line(tmp_path, monkeypatch, capsys):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert main(["config", "--reference"]) == 2
    assert "current folder no longer exists" in error_line(capsys.readouterr().err)


CLOSED_FDS = """
import os, sys
os.close(0); os.close(2)
from turbotrain.cli import _environment_problem
assert _environment_problem(True) is None
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
print(fd, os.path.realpath(f"/proc/self/fd/2"))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="Linux /proc")
def test_closed_standard_descriptors_are_not_handed_to_the_run_files(tmp_path):
    """`turbotrain train 2>&-`: the run's first file took descriptor 2, so anything written to "stderr" (a C++
    warning, a loader worker) went into it. A subprocess: the descriptors are the interpreter's own."""
    r = subprocess.run([sys.executable, "-c", CLOSED_FDS, str(tmp_path / "metrics.jsonl")], env=userpkg_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    fd, fd2 = r.stdout.split()
    assert int(fd) > 2 and fd2 == os.devnull


def test_too_few_file_descriptors_is_one_error_line(tmp_path, capsys):
    """`ulimit -n` too low for the DataLoader's workers: OSError EMFILE was a traceback (and the half-started
    iterator's __del__ another one at exit)."""
    resource = pytest.importorskip("resource")
    assert train(tmp_path, "run.name=warm", "data.num_workers=2") == 0  # the imports a run needs, done
    capsys.readouterr()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 6, hard))
    try:
        rc = train(tmp_path, "data.num_workers=2")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    line = error_line(capsys.readouterr().err)
    assert rc == 2 and "ulimit -n" in line, line


def test_a_file_size_limit_is_said_as_such_and_the_old_file_stays(tmp_path):
    """EFBIG (`ulimit -f`) was told "free space", with gigabytes free."""
    from tests.faults.test_full_disk import file_size_limit

    path = tmp_path / "config.toml"
    path.write_text("old = 1\n")
    with file_size_limit(64), pytest.raises(UserError, match=r"ulimit -f"):
        write_run_file(path, "x" * 1000)
    assert path.read_text() == "old = 1\n"


# ---------------------------------------------------------------- names the file system cannot take

@pytest.mark.parametrize("name", ["日" * 50, "é" * 65], ids=["cjk-150-bytes", "latin-130-bytes"])
def test_a_run_name_too_long_in_bytes_is_refused_as_the_name(name):
    """100 CJK characters pass a 128-character rule but are 300 bytes: mkdir's "File name too long" then
    blamed run.out_dir."""
    with pytest.raises(UserError, match=r"run\.name = .*bytes long"):
        RunConfig(name=name)


ASCII_FS = """
import sys
from pathlib import Path
from turbotrain.errors import UserError
from turbotrain.rundir import RunConfig, write_run_file
for kw in ({"name": "h\\xe9llo"}, {"out_dir": "/tmp/r\\xe9"}):
    try:
        RunConfig(**kw)
        print("accepted", kw)
    except UserError as e:
        assert "file-name encoding (ascii)" in str(e) and "\\n" not in str(e), e
write_run_file(Path(sys.argv[1]), 'name = "h\\xe9llo"\\n')
"""


def test_an_ascii_file_system_encoding_refuses_what_it_cannot_spell(tmp_path):
    """PYTHONUTF8=0 under the C locale: mkdir of "héllo" raised UnicodeEncodeError's traceback, and config.toml
    was written in the locale's encoding where it is read back as UTF-8."""
    env = userpkg_env(LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    r = subprocess.run([sys.executable, "-c", ASCII_FS, str(tmp_path / "config.toml")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "accepted" not in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "config.toml").read_bytes() == 'name = "héllo"\n'.encode()


# ---------------------------------------------------------------- config files behind links

@pytest.mark.parametrize("how", ["loop", "dangling", "extends-loop"])
def test_a_config_link_to_nothing_is_one_error_line(tmp_path, capsys, how):
    """A link that points at itself made pathlib's resolve() raise RuntimeError("Symlink loop"): a traceback."""
    link = tmp_path / "my.toml"
    link.symlink_to(link if how != "dangling" else tmp_path / "gone.toml")
    config = str(link)
    if how == "extends-loop":
        config = str(tmp_path / "child.toml")
        (tmp_path / "child.toml").write_text('extends = "my.toml"\n')
    assert main(["config", config]) == 2
    line = error_line(capsys.readouterr().err)
    assert "my.toml" in line and "is a symbolic link to nothing" in line, line


# ---------------------------------------------------------------- special files where run files go

def test_a_fifo_as_the_run_lock_is_one_error_line(tmp_path, capsys):
    """A FIFO at .lock: ftruncate's EINVAL was a traceback."""
    (tmp_path / "fault").mkdir()
    os.mkfifo(tmp_path / "fault" / ".lock")
    assert train(tmp_path) == 2
    line = error_line(capsys.readouterr().err)
    assert ".lock" in line and "not a regular file" in line, line


def test_a_fifo_where_a_run_file_is_written_is_refused(tmp_path):
    """A FIFO at a run file (a reader held open here, so the old open did not block): the run's rows went into
    the pipe, read by whoever held it, and no file was kept."""
    from turbotrain.rundir import open_run_file

    fifo = tmp_path / "alerts.jsonl"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(UserError, match=r"alerts\.jsonl .*not a regular file"):
            open_run_file(fifo, "a").close()
    finally:
        os.close(reader)
