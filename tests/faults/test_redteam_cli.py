"""Red-team cases of the command line and run directories: odd run directories for watch/report/export,
bad --out folders, damaged final/, empty CONFIG, out-of-range flags and integers, folders where run files go.
Each ends in one `error:` line and exit 2, or (watch/report over damaged lines) in a frame that skips them."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.cli import main

BASE = str(BASE_TOML)


pytestmark = pytest.mark.usefixtures("userpkg_importable")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One finished 4-step run with checkpoints at steps 2 and 4, copied per case."""
    out = tmp_path_factory.mktemp("finished")
    assert main(["train", BASE, f"run.out_dir={lit(out)}", "checkpoint.every=2"]) == 0
    return out / "fault"


def call(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _put(rel: str, data: bytes | str | None):
    """prepare: replace run_dir/rel by a file holding `data`, or by a folder when data is None."""
    def prep(d: Path) -> None:
        f = d / rel
        if f.is_dir() and not f.is_symlink():
            shutil.rmtree(f)
        elif f.exists() or f.is_symlink():
            f.unlink()
        if data is None:
            f.mkdir()
        else:
            f.write_bytes(data if isinstance(data, bytes) else data.encode())
    return prep


def _link(rel: str):
    def prep(d: Path) -> None:
        (d / rel).unlink(missing_ok=True)
        (d / rel).symlink_to(d.parent / "victim")
    return prep


def _no_final_other_config(d: Path) -> None:
    shutil.rmtree(d / "final")
    (d / "config.toml").write_text((d / "config.toml").read_text().replace("dim = 8", "dim = 4"))


RESUME = ["train", BASE, "run.out_dir={parent}", "run.name={name}", "train.steps=6", "checkpoint.every=2"]

# (id, prepare(run_dir), argv with {d} = the run dir, substrings of the error line)
ERRORS = [
    ("report-png-is-a-link", _link("report.png"), ["report", "{d}"], ["report.png", "symbolic link"]),
    ("report-png-is-a-folder", _put("report.png", None), ["report", "{d}"], ["report.png", "not a regular file"]),
    ("report-md-is-a-folder", _put("report.md", None), ["report", "{d}"], ["report.md", "not a regular file"]),
    ("export-out-is-a-file", None, ["export", "{d}", "--format", "safetensors", "--out", "{d}/config.toml"],
     ["--out", "cannot create"]),
    ("export-out-is-final", None, ["export", "{d}", "--format", "safetensors", "--out", "{d}/final"],
     ["--out", "final/"]),
    ("export-out-is-the-run-dir", None, ["export", "{d}", "--format", "safetensors", "--out", "{d}"],
     ["--out", "run directory"]),
    ("export-dir-is-a-file", _put("export", "x"), ["export", "{d}", "--format", "safetensors"], ["--out", "export"]),
    ("export-weights-damaged", _put("final/model.safetensors", b"garbage" * 10),
     ["export", "{d}", "--format", "safetensors"], ["model.safetensors", "sha256"]),
    ("export-hf-weights-damaged", _put("final/model.safetensors", b"garbage" * 10),
     ["export", "{d}", "--format", "hf"], ["model.safetensors", "sha256"]),
    ("export-final-json-damaged", _put("final/final.json", "{"), ["export", "{d}", "--format", "hf"],
     ["final.json", "damaged"]),
    ("export-final-json-a-list", _put("final/final.json", "[]"), ["export", "{d}", "--format", "safetensors"],
     ["final.json", "damaged"]),
    ("export-checkpoint-of-another-model", _no_final_other_config, ["export", "{d}", "--format", "safetensors"],
     ["does not fit", "config.toml"]),
    ("train-empty-config", None, ["train", "", "run.out_dir={d}/r"], ["CONFIG", "empty"]),
    ("config-empty-config", None, ["config", ""], ["CONFIG", "empty"]),
    ("watch-interval-inf", _put("summary.json", "{}"), ["watch", "{d}", "--interval", "inf"], ["--interval"]),
    ("scale-gpus-huge", None, ["scale", "mlp-seed", "--gpus", "99999999999999999999"], ["--gpus", "at most"]),
    ("tune-nproc-huge", None, ["tune", "mlp-seed", "--nproc", "100000"], ["--nproc", "at most"]),
    ("bench-compare-unknown-before-running", None, ["bench", "mlp-seed", "--compare", "bogus", "run.out_dir={d}/b"],
     ["--compare", "bogus"]),
    ("bench-variants-empty", None, ["bench", "mlp-seed", "--variants", "", "run.out_dir={d}/b"],
     ["--variants names no variant"]),
    ("bench-variants-only-commas", None, ["bench", "mlp-seed", "--variants", " , ,", "run.out_dir={d}/b"],
     ["--variants names no variant"]),
    ("scale-out-dir-under-a-file", _put("s", "x"), ["scale", "mlp-seed", "--gpus", "1", "run.out_dir={d}/s"],
     ["cannot create", "Not a directory"]),
    ("config-int-beyond-int64", None, ["config", "mlp-seed", "train.steps=99999999999999999999999"],
     ["train.steps", "out of range"]),
    ("config-out-dir-empty", None, ["config", "mlp-seed", "run.out_dir=''"], ["run.out_dir", "must name a folder"]),
    ("resume-config-toml-is-a-folder", _put("config.toml", None), RESUME, ["config.toml", "cannot write"]),
    ("resume-metrics-is-a-folder", _put("metrics.jsonl", None), RESUME, ["metrics.jsonl", "cannot read"]),
    ("resume-lock-is-a-folder", _put(".lock", None), RESUME, [".lock", "cannot take the lock"]),
]


def _fill(argv: list[str], d: Path) -> list[str]:
    """{d} = the run dir, {parent}/{name} = its out_dir and name; in a KEY=VALUE as a TOML string."""
    out = []
    for a in argv:
        if "=" in a and "{" in a:
            key, val = a.split("=", 1)
            a = f"{key}={lit(val.replace('{parent}', str(d.parent)).replace('{name}', d.name).replace('{d}', str(d)))}"
        out.append(a.replace("{d}", str(d)))
    return out


@pytest.mark.parametrize("prepare, argv, expect", [pytest.param(*c[1:], id=c[0]) for c in ERRORS])
def test_cli_fault_is_one_error_line(tmp_path, capsys, finished, prepare, argv, expect):
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    if prepare:
        prepare(d)
    rc, out, err = call(capsys, _fill(argv, d))
    assert rc == 2, f"rc={rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}"
    line = error_line(err)
    for text in expect:
        assert text in line, f"{text!r} not in {line!r}"
    assert not (tmp_path / "victim").exists()  # nothing written through a link


# damaged lines a running or crashed run may leave: watch and report skip them and draw the rest
DAMAGED = [  # (id, file, bytes, commands that broke on it)
    ("metrics-not-utf8", "metrics.jsonl", b'\xff\xfe{\n{"step": 2, "loss": 1.0}\n', ("watch", "report")),
    ("alerts-not-utf8", "alerts.jsonl", b"\xff\n", ("watch", "report")),
    ("step-400-digits", "metrics.jsonl", b'{"step": 1' + b"0" * 400 + b', "loss": 1.0}\n{"step": 2, "loss": 2}\n',
     ("report",)),
    ("loss-near-float-max", "metrics.jsonl", b'{"step": 1, "loss": 1e308}\n{"step": 2, "loss": -1e308}\n',
     ("watch", "report")),
    ("alert-odd-fields", "alerts.jsonl", b'{"step": "x", "rule": 1}\n{"step": 1e400, "rule": "a"}\n', ("report",)),
]


@pytest.mark.parametrize("name, data, command", [pytest.param(name, data, cmd, id=f"{cmd}-{i}")
                                                  for i, name, data, cmds in DAMAGED for cmd in cmds])
def test_damaged_lines_are_skipped(tmp_path, capsys, finished, name, data, command):
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    (d / name).write_bytes(data)
    rc, out, err = call(capsys, [command, str(d), *(["--once"] if command == "watch" else [])])
    assert rc == 0, err
    assert "Traceback" not in err


def test_resume_with_damaged_metric_bytes_keeps_good_rows(tmp_path, capsys, finished):
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    good = (d / "metrics.jsonl").read_bytes()
    (d / "metrics.jsonl").write_bytes(b"\xff\xfe\n" + good)
    rc, out, err = call(capsys, _fill(RESUME, d))
    assert rc == 0, err
    steps = [line for line in (d / "metrics.jsonl").read_text().splitlines() if '"step"' in line]
    assert len(steps) >= 6
