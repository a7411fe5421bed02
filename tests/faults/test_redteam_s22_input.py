"""Red-team cases of the inputs: paths whose `~user` names no account, synthetic data args that overflow, do not
fit in memory or belong to another kind, a RANK that is not a number before the run checks it, items on the meta
device, text folders with links, pipes and unreadable files, and DataLoader settings that cannot apply. Each ends in
one `error:` line (a UserError), or is said as a warning / a resolved change when the run can go on."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.faults.common import BASE_TOML, error_line
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.contract import first_batch
from turbotrain.data.datasets import synthetic
from turbotrain.data.text import source_files, text
from turbotrain.errors import UserError
from turbotrain.log import say
from turbotrain.resolve import Facts, resolve

NO_USER = "~turbotrain-no-such-user-s22"


# ---------------------------------------------------------------- `~user` that names no account

def test_config_path_of_unknown_home_is_one_error_line(capsys):
    assert main(["config", f"{NO_USER}/my.toml"]) == 2
    assert "names no home folder" in error_line(capsys.readouterr().err)


@pytest.mark.parametrize("override", [f"run.out_dir='{NO_USER}/runs'", f"checkpoint.resume='{NO_USER}/ck'",
                                      f"compile.cache_dir='{NO_USER}/cc'", "env"])
def test_run_paths_of_unknown_home_are_one_error_line(tmp_path, capsys, monkeypatch, override):
    """Every path a run reads from the config or the environment expands `~` alike: an unknown `~user` is one
    line naming its key (os.path kept it as a folder named "~user"; pathlib raised RuntimeError)."""
    if override == "env":
        monkeypatch.setenv("TURBOTRAIN_CACHE", f"{NO_USER}/cache")
        override, key = "data.name='shakespeare'", "TURBOTRAIN_CACHE"
    else:
        key = override.split("=")[0]
    argv = ["train", str(BASE_TOML), f"run.out_dir='{tmp_path}'", "train.steps=2", override]
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err)
    assert key in line and "names no home folder" in line, line
    assert not list(Path.cwd().glob("~turbotrain-no-such-user*"))


@pytest.mark.parametrize("key", ["path", "tokens"])
def test_text_paths_of_unknown_home_are_user_errors(tmp_path, key):
    corpus = tmp_path / "a.txt"
    corpus.write_text("hello " * 100)
    args = {"path": str(corpus), "block_size": 8, key: f"{NO_USER}/x.json"}
    with pytest.raises(UserError, match=f"data.args.{key} = .*names no home folder"):
        text("train", **args)


# ---------------------------------------------------------------- synthetic data args

@pytest.mark.parametrize("args,match", [
    ({"seed": 10**20}, "data.args.seed"),  # past int64: torch's generator overflowed
    ({"seed": 2**64 - 1}, "data.args.seed"),  # the val split's seed + 1 overflowed
    ({"size": 2**62, "seq_len": 8}, "data.args.size"),  # size x seq_len past int64
    ({"size": 2**40, "seq_len": 2**10}, "more than this host's"),  # a host-OOM naming batch_size before
    ({"kind": "images", "shape": [10**5, 10**5, 10**5], "size": 2}, "data.args.shape"),
    ({"kind": "vectors", "in_features": 10**12, "size": 2}, "data.args.in_features"),
    ({"bogus": 1}, "no argument 'bogus'"),  # taken by **kind_args, so checked there
])
def test_synthetic_args_past_what_can_be_made_are_user_errors(args, match):
    with pytest.raises(UserError, match=match):
        synthetic("train", **args)


def test_synthetic_args_of_another_kind_are_said_not_ignored(capsys):
    ds = synthetic("train", kind="tokens", size=2, seq_len=4, vocab_size=8, num_classes=0, in_features=3)
    assert len(ds) == 2
    out = capsys.readouterr().out
    assert "data.args.num_classes and data.args.in_features not used" in out and "'tokens'" in out


# ---------------------------------------------------------------- environment

def test_messages_before_the_rank_check_survive_a_non_numeric_rank(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "abc")
    say("data: fetching")  # raised ValueError, a traceback, before the run's own RANK check could say it
    assert "data: fetching" in capsys.readouterr().out


# ---------------------------------------------------------------- user data

def test_items_on_the_meta_device_are_one_user_error():
    items = [(torch.empty(4, device="meta"), torch.zeros(())) for _ in range(4)]
    with pytest.raises(UserError, match="meta device"):
        first_batch(items, torch.device("cpu"))


# ---------------------------------------------------------------- text folders

def _corpus(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text("hello " * 200)
    return d


def test_text_file_that_fails_on_read_is_one_user_error(tmp_path):
    if not Path("/proc/self/mem").exists():
        pytest.skip("needs Linux's /proc")
    d = _corpus(tmp_path)
    (d / "b.txt").symlink_to("/proc/self/mem")  # a regular file to stat, EIO to read
    with pytest.raises(UserError, match="cannot read .*b.txt"):
        text("train", path=str(d), block_size=8)


@pytest.mark.parametrize("make", ["broken_link", "fifo"])
def test_text_entries_that_are_not_files_are_refused_not_skipped(tmp_path, make):
    d = _corpus(tmp_path)
    odd = d / "b.txt"
    if make == "broken_link":
        odd.symlink_to(tmp_path / "gone.txt")
    else:
        os.mkfifo(odd)
    with pytest.raises(UserError, match="b.txt is not a regular file"):
        source_files(str(d))  # skipped before: its text left out of the training data unseen
    with pytest.raises(UserError, match="not a regular file or folder"):
        source_files(str(odd))  # named directly: was "no such file or folder"


def test_text_folder_walks_linked_subfolders_once(tmp_path):
    d = _corpus(tmp_path)
    more = tmp_path / "more"
    more.mkdir()
    (more / "b.txt").write_text("world " * 200)
    (d / "more").symlink_to(more)  # rglob left its files out, unseen
    (d / "loop").symlink_to(d)  # a link back up the tree: walked once, not forever
    assert [p.name for p in source_files(str(d))] == ["a.txt", "b.txt"]


# ---------------------------------------------------------------- DataLoader settings that cannot apply

@pytest.mark.usefixtures("userpkg_importable")
def test_loader_settings_that_cannot_apply_resolve_to_what_runs(capsys):
    cfg = load_config(str(BASE_TOML), ["data.num_workers=0", "data.persistent_workers=true",
                                       "data.pin_memory=true"])
    out = resolve(cfg, Facts(device=torch.device("cpu")))
    said = capsys.readouterr().out
    # config.toml said true for both while the loader ran without them
    assert out.data.persistent_workers is False and "data.persistent_workers: true → false" in said
    assert out.data.pin_memory is False and "data.pin_memory: true → false" in said


# ---------------------------------------------------------------- config files and data names

def test_empty_config_file_is_said_and_config_stdout_stays_toml(tmp_path, capsys):
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing yet\n")
    load_config(str(empty))
    assert "sets nothing" in capsys.readouterr().out  # every key silently at its default before
    assert main(["config", str(empty), "data.name=\"synthetic\"", "data.args.size=4", "data.args.seq_len=8",
                 "model.args.n_layer=1", "model.args.n_embd=8", "model.args.n_head=1"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("[run]") and "sets nothing" in err  # `turbotrain config X > my.toml` is TOML alone


@pytest.mark.parametrize("name,said", [("synthetic", "generated at run time"), ("text", "reads your files")])
def test_fetching_a_built_dataset_says_there_is_nothing_to_fetch(capsys, name, said):
    assert main(["data", "fetch", name]) == 2  # `data list` lists synthetic: "no such dataset" contradicted it
    assert said in error_line(capsys.readouterr().err)


def test_a_ctrl_c_out_of_exec_code_still_exits_130(tmp_path):
    """A KeyboardInterrupt raised inside exec()'d code (dataclass methods, built at import) and handled by the CLI
    used to end the process by SIGINT all the same (CPython's unhandled-interrupt mark, checked at exit after
    `python -m`, as `python -m turbotrain` runs): exit -2, not 130."""
    import os
    import subprocess
    import sys

    from tests.faults.common import subprocess_env

    (tmp_path / "ctrlc_main.py").write_text(
        "import sys\nfrom turbotrain import cli\n"
        "def run(args):\n    exec('raise KeyboardInterrupt')\n"
        "cli.run = run\nraise SystemExit(cli.main(['env']))\n")
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(tmp_path), env.get("PYTHONPATH"))))
    p = subprocess.run([sys.executable, "-m", "ctrlc_main"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 130, (p.returncode, p.stderr[-2000:])
    assert p.stderr.strip().splitlines()[-1] == "error: interrupted"


@pytest.mark.parametrize("value", ["'/a\\'b'", '"runs', "[1, 2", "{a = 1"])
def test_a_broken_toml_literal_in_an_override_is_one_error_line(tmp_path, capsys, value):
    """A value that opens a TOML string, list or table and does not close it was taken as a bare string, quotes
    included: `run.out_dir='/a\\'b'` made a folder named "'" where the command ran."""
    assert main(["config", str(BASE_TOML), f"run.out_dir={value}"]) == 2
    assert "not a TOML value" in error_line(capsys.readouterr().err)
