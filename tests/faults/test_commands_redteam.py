"""Red team, `bench` / `scale` / `tune` / `report` / `watch`: what a user can get wrong is refused before the first
run with one `error:` line (exit 2), a bench that measured nothing says so, a run's own error line reaches the
table, and damaged run files are read leniently with a note.

- train.steps=1 (only the warm-up step: no throughput), an empty or repeated --strategies / --variants /
  --compare, a --compare framework that is not installed, a run.name whose derived names pass 128 characters,
  torchrun's environment (or a malformed WORLD_SIZE), a symbolic link where an output goes: refused up front.
- Each bad flag of tune / scale is named with its value.
- Every variant failing: bench.md holds each trial's own `error:` line (`|` escaped), then one error line, exit 2.
- report / watch over a damaged profile/report.json, a 400-digit loss, unreadable metrics.jsonl lines."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.faults.common import BASE_TOML, error_line, lit, run_cli
from tests.faults.test_redteam_cli import call, finished  # noqa: F401  (finished: a fixture)
from turbotrain import scale, tune
from turbotrain.bench import format_table, measured

BASE = str(BASE_TOML)
LONG_NAME = "a" * 125  # legal (the limit is 128), but NAME-tuned, NAME-bench-..., NAME-scale-... are not

pytestmark = pytest.mark.usefixtures("userpkg_importable")


# ---------------------------------------------------------------- refused before anything runs

# (id, argv after the config, environment, substrings of the error line)
REFUSED = [
    ("bench-one-step", ["bench", "train.steps=1", "--variants", "baseline,bf16"], {}, ["train.steps = 1", ">= 2"]),
    ("scale-one-step", ["scale", "train.steps=1", "--gpus", "1"], {}, ["train.steps = 1", ">= 2"]),
    ("scale-no-strategy", ["scale", "--gpus", "1", "--strategies", ""], {}, ["--strategies names no strategy"]),
    ("scale-strategy-twice", ["scale", "--gpus", "1", "--strategies", "ddp,ddp"], {}, ["--strategies", "ddp"]),
    ("bench-variant-twice", ["bench", "--variants", "baseline,baseline,bf16"], {}, ["--variants", "baseline"]),
    ("tune-long-name", ["tune", f"run.name={LONG_NAME!r}"], {}, ["run.name", "-tuned", "at most 122"]),
    ("bench-long-name", ["bench", f"run.name={LONG_NAME!r}", "--variants", "baseline"], {},
     ["run.name", "-bench-baseline", "at most 113"]),
    ("scale-long-name", ["scale", f"run.name={LONG_NAME!r}", "--gpus", "1"], {}, ["run.name", "-scale-ddp-1"]),
    ("tune-world-size-abc", ["tune"], {"WORLD_SIZE": "abc"}, ["WORLD_SIZE='abc' is not an integer"]),
    ("bench-world-size-abc", ["bench", "--variants", "baseline"], {"WORLD_SIZE": "abc"},
     ["WORLD_SIZE='abc' is not an integer"]),
    ("bench-under-torchrun", ["bench", "--variants", "baseline"], {"WORLD_SIZE": "2", "RANK": "0"},
     ["not under torchrun", "WORLD_SIZE=2"]),
]


@pytest.mark.parametrize("argv, env, expect", [pytest.param(*c[1:], id=c[0]) for c in REFUSED])
def test_refused_before_the_first_run(tmp_path, capsys, monkeypatch, argv, env, expect):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc, out, err = call(capsys, [argv[0], BASE, f"run.out_dir={lit(tmp_path)}", *argv[1:]])
    assert rc == 2, f"rc={rc}\n{out[-2000:]}\n{err[-2000:]}"
    line = error_line(err)
    for text in expect:
        assert text in line, f"{text!r} not in {line!r}"
    assert not any(tmp_path.iterdir()), "nothing may be written before the refusal"


def test_empty_strategies_keep_the_last_scale_table(tmp_path, capsys):
    out = tmp_path / "fault-scale"
    out.mkdir()
    (out / "scale.json").write_text('{"rows": ["the last call"]}')
    rc, _, err = call(capsys, ["scale", BASE, f"run.out_dir={lit(tmp_path)}", "--gpus", "1", "--strategies", " "])
    assert rc == 2 and "--strategies" in error_line(err)
    assert (out / "scale.json").read_text() == '{"rows": ["the last call"]}'


def test_a_compare_framework_not_installed_is_refused_before_any_variant(tmp_path, capsys, monkeypatch):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else find(name, *a))
    rc, _, err = call(capsys, ["bench", BASE, f"run.out_dir={lit(tmp_path)}", "--variants", "baseline",
                               "--compare", "accelerate"])
    line = error_line(err)
    assert rc == 2 and "--compare accelerate" in line and "pip install accelerate" in line
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("check, args, expect", [
    (tune.check_args, (0, 2, 1), "--budget-min must be a number of minutes > 0 (not inf or nan) and at most 10080 "
                                 "(one week), not 0"),
    (tune.check_args, (float("nan"), 2, 1), "--budget-min"),
    (tune.check_args, (10, -1, 1), "--repeats must be >= 0 (0: the finalists are not re-run), not -1"),
    (tune.check_args, (10, 2, 0), "--nproc must be >= 1 (processes per trial), not 0"),
    (scale.check_args, ([0], ["ddp"], 1), "--gpus 0: a world size is a positive integer"),
    (scale.check_args, ([], ["ddp"], 1), "--gpus names no world size"),
    (scale.check_args, ([1], ["hsdp"], 1), "--strategies hsdp: unknown strategy; choose ddp, fsdp"),
    (scale.check_args, ([1, 1], ["ddp"], 1), "--gpus: 1 given more than once"),
    (scale.check_args, ([1], ["ddp"], 0), "--repeats must be >= 1, not 0"),
])
def test_each_bad_flag_is_named_with_its_value(check, args, expect):
    from turbotrain.errors import UserError

    with pytest.raises(UserError) as e:
        check(*args)
    assert str(e.value).startswith(expect), str(e.value)


def _victim_link(where: Path, victim: Path) -> None:
    where.parent.mkdir(parents=True, exist_ok=True)
    where.symlink_to(victim)


@pytest.mark.parametrize("argv, link", [
    (["tune"], "fault/tune"),
    (["tune"], "fault/tune/tune.png"),
    (["bench", "--variants", "baseline"], "fault-bench/bench.md"),
    (["bench", "--variants", "baseline"], "fault-bench/fault-bench-baseline.log"),
    (["scale", "--gpus", "1"], "fault-scale/fault-scale-ddp-1.log"),
], ids=["tune-dir", "tune-png", "bench-md", "bench-log", "scale-log"])
def test_no_write_through_a_link(tmp_path, capsys, argv, link):
    out, victim = tmp_path / "runs", tmp_path / "victim"
    victim.mkdir()
    if link.endswith("/tune"):
        _victim_link(out / link, victim)
    else:
        _victim_link(out / link, victim / "file")
    rc, _, err = call(capsys, [argv[0], BASE, f"run.out_dir={lit(out)}", *argv[1:]])
    line = error_line(err)
    assert rc == 2 and "symbolic link" in line and Path(link).name in line
    assert not any(victim.iterdir())


# ---------------------------------------------------------------- bench rows

def test_every_variant_failing_is_an_error_with_each_trials_own_line(tmp_path):
    """A model whose loss is NaN: the row holds the trial's `error:` line, not its last progress lines; the table is
    written, then one error line and exit 2."""
    r = run_cli([sys.executable, "-m", "turbotrain", "bench", BASE, f"run.out_dir={lit(tmp_path)}",
                 'model.name="userpkg.models:nan_from_start"', "--variants", "baseline"], tmp_path)
    line = error_line(r.stderr)
    assert r.returncode == 2 and "no variant ran to the end" in line and "loss is nan" in line
    md = (tmp_path / "fault-bench" / "bench.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| baseline |"))
    assert "exit 2: loss is nan" in row and "step 3/4" not in row and row.count("|") == 12


def test_table_cells_escape_the_bar():
    rows = [{"variant": "baseline", "error": "exit 1: Traceback | RuntimeError: a|b"}]
    table = format_table({"device": "cpu", "torch": "x", "steps": 4, "synthetic_data": False, "repeats": 1,
                          "rows": rows})
    assert "Traceback \\| RuntimeError: a\\|b" in table
    assert len(re.findall(r"(?<!\\)\|", table.splitlines()[-1])) == 12  # 11 cells, none split
    result = {"rows": [{"strategy": "ddp", "world_size": 2, "error": "a | b"}], "note": None}
    assert "failed: a \\| b" in scale.format_table(result)


def test_a_run_without_timed_steps_is_a_row_not_a_crash(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"samples_per_s": None, "steps": 1}))
    assert measured(0, tmp_path / "log", tmp_path / "summary.json") == {
        "error": "no timed steps: the run ended within its warm-up"}
    (tmp_path / "log").write_text("step 1/2 | loss 4.2\n[rank0]: error: data: too few samples\nstep 2/2 | loss 4.1\n")
    assert measured(2, tmp_path / "log", tmp_path / "none.json") == {"error": "exit 2: data: too few samples"}


# ---------------------------------------------------------------- report / watch over damaged files

DAMAGED = [  # (id, file, bytes, what report.md and watch's frame say about it)
    ("share-a-list", "profile/report.json", b'{"breakdown_share": [1, 2]}', "breakdown_share is not a table"),
    ("share-a-word", "profile/report.json", b'{"breakdown_share": {"exposed_comm": "lots"}}',
     "exposed_comm is not a number"),
    ("profile-cut", "profile/report.json", b'{"breakdown_sh', "profile/report.json unreadable"),
    ("loss-400-digits", "metrics.jsonl", b'{"step": 6, "loss": 1' + b"0" * 400 + b"}\n", None),
    ("lines-damaged", "metrics.jsonl", b'\xff\xfe\x00garbage\n{"step": "x"}\n[1, 2]\n{"step": 7, "lo',
     "4 lines of metrics.jsonl unreadable (damaged or cut short)"),
]


@pytest.mark.parametrize("name, data, note", [pytest.param(*c[1:], id=c[0]) for c in DAMAGED])
def test_report_and_watch_read_damaged_files_leniently(tmp_path, capsys, finished, name, data, note):  # noqa: F811
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    (d / name).parent.mkdir(exist_ok=True)
    with open(d / name, "ab" if name == "metrics.jsonl" else "wb") as f:
        f.write(data)
    rc, frame, err = call(capsys, ["watch", str(d), "--once"])
    assert rc == 0 and "Traceback" not in err, err
    rc, _, err = call(capsys, ["report", str(d)])
    assert rc == 0 and "Traceback" not in err, err
    md = (d / "report.md").read_text()
    if note:
        assert note in frame and note in md
    assert "0" * 100 not in md + frame  # a 400-digit loss is no figure
