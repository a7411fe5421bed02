"""Red-team cases of the data path: a dataset that raises StopIteration or calls sys.exit in __getitem__, a
DataLoader worker that dies (SIGKILL, a segfault, an exit), items that start requiring grad, a __len__ that
promises more items than __getitem__ serves or than the host can order; an empty dataset, (x, y) passed as
train_data, a factory without a val split when evaluation is off, a UTF-8 byte-order mark in a text file. Each
error is one `error:` line naming the dataset and the fix, exit code 2, at whatever moment the worker dies. User
code: tests/userpkg/redteam_s23_data.py."""
from __future__ import annotations

import codecs
import os

import pytest
import torch
from userpkg.models import linear

import turbotrain
from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.cli import main
from turbotrain.config import load_config
from turbotrain.data.loader import MAX_ITEMS, StepSampler
from turbotrain.data.text import text
from turbotrain.errors import UserError

D = "userpkg.redteam_s23_data:"
EPOCH = ["train.steps=8", "data.eval_batches=0"]  # 8 steps x 8 items: every index of the 64 is read


def _train(tmp_path, capsys, *overrides) -> tuple[int, str]:
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *EPOCH, *overrides])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("args, words", [
    ('{mode="stop", at=20}', ["StopIteration", "every index below its __len__"]),
    ('{mode="grad_later", at=20}', ["require", "detach()"]),
    ("{length=80}", ["IndexError", "__len__ says 80"]),
], ids=["stop-iteration", "grad-later", "len-lies"])
def test_a_later_item_that_breaks_the_contract_is_one_error_line(tmp_path, capsys, args, words, workers):
    rc, err = _train(tmp_path, capsys, f'data.name="{D}pairs"', f"data.args={args}", f"data.num_workers={workers}")
    line = error_line(err)
    assert rc == 2, err
    assert "redteam_s23_data:pairs" in line, line
    for w in words:
        assert w in line, line


def test_sys_exit_in_getitem_is_one_error_line_not_a_silent_exit(tmp_path, capsys):
    rc, err = _train(tmp_path, capsys, f'data.name="{D}pairs"', 'data.args={mode="exit", at=20}',
                     "data.num_workers=0")
    assert rc == 2 and "sys.exit(3)" in error_line(err), err


@pytest.mark.parametrize("mode, words", [
    ("kill", ["killed by SIGKILL", "out-of-memory"]),
    ("segv", ["killed by signal 11", "native code"]),
    ("exit", ["exited with code 3"]),
])
def test_a_dead_worker_is_one_error_line_naming_how_it_ended(tmp_path, capsys, mode, words):
    rc, err = _train(tmp_path, capsys, f'data.name="{D}pairs"', f'data.args={{mode="{mode}", at=20}}',
                     "data.num_workers=2")
    line = error_line(err)
    assert rc == 2, err
    for w in [*words, "redteam_s23_data:pairs", "data.num_workers = 0"]:
        assert w in line, line


def test_an_empty_dataset_is_said_empty_not_too_small_for_the_batch(tmp_path, capsys):
    rc, err = _train(tmp_path, capsys, "data.args.n=0")
    line = error_line(err)
    assert rc == 2 and "empty" in line and "lower data.batch_size" not in line, line


def test_a_pair_of_tensors_as_train_data_says_to_wrap_them(tmp_path):
    x, y = torch.randn(64, 8), torch.randn(64)
    cfg = load_config(str(BASE_TOML), [f"run.out_dir={lit(tmp_path)}", "train.steps=2"])
    with pytest.raises(UserError, match=r"TensorDataset\(x, y\)"):
        turbotrain.train(cfg, model=linear(8), train_data=(x, y))


def test_no_val_split_is_built_when_evaluation_is_off(tmp_path, capsys):
    rc, err = _train(tmp_path, capsys, f'data.name="{D}val_none"', "data.eval_batches=1")
    assert rc == 2 and "for split 'val'" in error_line(err), err
    assert _train(tmp_path, capsys, f'data.name="{D}val_none"', "data.eval_batches=0")[0] == 0


def test_a_utf8_byte_order_mark_is_not_trained_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a.txt").write_bytes(codecs.BOM_UTF8 + b"to be or not to be " * 20)
    (tmp_path / "b.jsonl").write_bytes(codecs.BOM_UTF8 + b'{"text": "that is the question"}\n' * 20)
    ds = text("train", path=str(tmp_path), block_size=8)
    assert ds.vocab_size == len(set("to be or not to be that is the question\n"))


def test_a_len_whose_epoch_order_outgrows_the_host_is_refused_before_allocating():
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    n = host // 16 + 1  # an 8-byte index each: more than half the host's memory, fewer than MAX_ITEMS
    assert n < MAX_ITEMS
    with pytest.raises(UserError, match="check its __len__"):
        StepSampler(n, 8, 1)
