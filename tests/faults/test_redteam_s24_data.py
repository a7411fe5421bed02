"""Red-team cases of the data sources: a tokenizer.json saved with truncation or padding (each file cut to
max_length, or padded with pad tokens), text files whose suffix is upper case (left out unseen), JSON Lines whose
text holds U+2028 / U+0085 (cut mid-string by splitlines), an IterableDataset that states a __len__ (blamed on its
__getitem__), and a token stream of exactly one window (refused as too short). User code:
tests/userpkg/redteam_s24_data.py."""
from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import torch

from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.cli import main
from turbotrain.data.datasets import host_memory_bytes, map_dict_items, split_windows, synthetic
from turbotrain.data.text import text
from turbotrain.errors import UserError


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "cache"))


def _corpus(tmp_path, files: dict[str, str]):
    d = tmp_path / "corpus"
    d.mkdir()
    for name, body in files.items():
        (d / name).write_text(body, encoding="utf-8")
    return d


def test_a_tokenizer_json_saved_with_truncation_and_padding_tokenises_the_whole_text(tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator(["a b c d"], tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]"]))
    tok.save(str(tmp_path / "plain.json"))
    tok.enable_truncation(max_length=8)  # as a tokenizer saved from a model's input pipeline carries them
    tok.enable_padding(pad_id=1, pad_token="[PAD]", length=64)
    tok.save(str(tmp_path / "cut.json"))
    d = _corpus(tmp_path, {f"{i}.txt": " ".join("abcd"[(i + k) % 4] for k in range(100)) for i in range(3)})
    whole = text("train", path=str(d), tokens=str(tmp_path / "plain.json"), block_size=8, val_fraction=0.5)
    cut = text("train", path=str(d), tokens=str(tmp_path / "cut.json"), block_size=8, val_fraction=0.5)
    assert len(cut.tokens) == len(whole.tokens) == 150  # was 3 x 64: 8 tokens of each file, then pad tokens
    assert bool((cut.tokens == whole.tokens).all())
    assert "truncation and padding turned off" in capsys.readouterr().out


def test_text_files_with_upper_case_suffixes_are_trained_on_and_left_out_files_are_said(tmp_path, capsys):
    d = _corpus(tmp_path, {"a.txt": "aaaa " * 40, "B.TXT": "bbbb " * 40, "c.JSONL": json.dumps({"text": "cccc"}),
                           "notes.md": "not text data"})
    ds = text("train", path=str(d), block_size=8, val_fraction=0.1)
    assert ds.vocab_size == 5  # newline, space, a, b, c: B.TXT and c.JSONL were left out, unseen
    out = capsys.readouterr().out
    assert "3 file(s)" in out and "notes.md" in out, out


def test_hidden_entries_of_a_text_folder_are_left_out_and_said(tmp_path, capsys):
    d = _corpus(tmp_path, {"a.txt": "abcd " * 40})
    (d / ".ipynb_checkpoints").mkdir()  # Jupyter's copy: the text twice, and in the val split too
    (d / ".ipynb_checkpoints" / "a-checkpoint.txt").write_text("xyz " * 400)
    (d / ".#a.txt").symlink_to("user@host.1234")  # Emacs's lock while a.txt is open: a dangling link
    ds = text("train", path=str(d), block_size=8, val_fraction=0.5)
    assert len(ds.tokens) == 100 and ds.vocab_size == 5  # "abcd " alone (was: "not a regular file" for the lock)
    out = capsys.readouterr().out
    assert "2 entries" in out and "hidden" in out, out


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85"])
def test_jsonl_text_holding_unicode_line_separators_is_read_whole(tmp_path, sep):
    rows = [f"row {i}{sep}rest of row {i}" for i in range(20)]
    path = tmp_path / "rows.jsonl"
    path.write_text("\r\n".join(json.dumps({"text": r}, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    ds = text("train", path=str(path), tokens="byte", block_size=8, val_fraction=0.1)
    n = len("\n".join(rows).encode("utf-8"))  # was "rows.jsonl:1 is not a JSON line"
    assert len(ds.tokens) == int(n * 0.9)


def test_an_iterable_dataset_that_states_a_len_is_one_error_line(tmp_path, capsys, userpkg_importable):
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "data.eval_batches=0",
               'data.name="userpkg.redteam_s24_data:sized_stream"'])
    line = error_line(capsys.readouterr().err)
    assert rc == 2 and "IterableDataset" in line and "map-style" in line, line  # was "fix __getitem__ there"


def test_a_token_stream_of_exactly_one_window_is_one_sample():
    assert len(synthetic("train", kind="tokens", size=1, seq_len=16, vocab_size=8)) == 1  # was "too few tokens"
    ds = split_windows(np.arange(18), 18, "train", 8, 0.5, None, "add text")  # 9 train tokens: one window
    x, y = ds.gather(torch.zeros(1, dtype=torch.long))
    assert x.tolist() == [list(range(8))] and y.tolist() == [list(range(1, 9))]


def test_synthetic_data_whose_two_splits_outgrow_the_host_is_refused_before_allocating():
    """A split of 60 % of the host's memory passed (only more than all of it was refused): the train and val
    splits together then ended in the out-of-memory killer's SIGKILL, with no error line."""
    total = host_memory_bytes()
    if total is None:
        pytest.skip("the host's memory size cannot be read here")
    with pytest.raises(UserError, match="more than this host's"):
        synthetic("train", kind="vectors", in_features=1024, size=int(0.6 * total) // 4 // 1024)


@pytest.mark.parametrize("columns", [
    {"input_ids": torch.zeros(4, 8, dtype=torch.long), "labels": torch.zeros(4, 8, dtype=torch.long)},
    collections.UserDict(input_ids=[[1, 2], [3, 4]], attention_mask=[[1, 1], [1, 1]]),  # as a BatchEncoding is
], ids=["dict-of-tensors", "batch-encoding"])
def test_a_dict_of_whole_columns_as_train_data_says_to_wrap_them_not_to_pick_a_split(columns):
    with pytest.raises(UserError, match="whole columns .*TensorDataset") as e:  # was "a dict of splits"
        map_dict_items(columns, "train_data")
    assert "split" not in str(e.value)
