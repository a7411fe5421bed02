"""Red-team cases of the data sources, wave 26: a text cache whose tokens.bin verifies but whose meta.json (not
covered by the checksum) no longer describes it: a damaged dtype read the bytes as other ids, a damaged
vocab_size sized the model's embedding short of the ids (an IndexError mid-run) or past them, unseen; and a
data.args.stride above block_size, whose windows leave tokens between them that are never a target, unsaid; a
link to a file of the corpus beside it (latest.txt -> part1.txt), whose text was trained on twice and validated on."""
from __future__ import annotations

import json

import numpy as np
import pytest

from turbotrain.data.text import text


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("damage", [{"vocab_size": 3}, {"vocab_size": 0}, {"vocab_size": 300}, {"dtype": "int16"},
                                    {"dtype": "int32"}, {"n_tokens": 5}, {"vocab": ["a"]}, {"vocab_size": 20.0}])
def test_a_cached_token_file_whose_meta_no_longer_describes_it_is_tokenised_again(tmp_path, capsys, damage):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text("hello world, the text of this corpus.\n" * 30, encoding="utf-8")
    first = text("train", path=str(d), block_size=16)
    want = np.asarray(first.tokens).copy()
    (meta_path,) = (tmp_path / "cache" / "text").glob("*/meta.json")
    meta = json.loads(meta_path.read_text())
    meta.update(damage)  # tokens.bin and its recorded sha256 untouched: only the description is wrong
    meta_path.write_text(json.dumps(meta))
    capsys.readouterr()
    again = text("train", path=str(d), block_size=16)
    assert again.vocab_size == first.vocab_size and len(again) == len(first)
    assert np.array_equal(np.asarray(again.tokens), want) and int(np.asarray(again.tokens).max()) < again.vocab_size
    assert "does not describe" in capsys.readouterr().out


def test_a_stride_past_block_size_says_the_tokens_it_never_trains_on(tmp_path, capsys):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text("abcdefghij" * 100, encoding="utf-8")
    ds = text("train", path=str(d), block_size=8, stride=80)
    seen = set()
    for i in range(len(ds)):  # every target position the windows cover
        seen.update(range(i * ds.stride + 1, i * ds.stride + ds.block_size + 1))
    assert len(seen) < len(ds.tokens) // 5  # 72 of every 80 tokens never a target: 10x short of the text
    out = capsys.readouterr().out
    assert "data.args.stride = 80 > data.args.block_size = 8: 72 of every 80 tokens are never a target" in out, out
    text("train", path=str(d), block_size=8, stride=8)  # windows that tile the stream: nothing to say
    text("train", path=str(d), block_size=8, stride=4)
    assert "never a target" not in capsys.readouterr().out


def test_a_link_to_a_file_of_the_corpus_is_read_once(tmp_path, capsys):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "part0.txt").write_text("abab " * 200, encoding="utf-8")
    (d / "part1.txt").write_text("cdcd " * 200, encoding="utf-8")
    (d / "zz-latest.txt").symlink_to(d / "part1.txt")  # last in sorted order: its copy lands in the val split
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("part0.txt", "part1.txt"):
        (plain / name).write_text((d / name).read_text(encoding="utf-8"), encoding="utf-8")
    linked = text("val", path=str(d), block_size=8, val_fraction=0.4)
    want = text("val", path=str(plain), block_size=8, val_fraction=0.4)
    assert np.array_equal(np.asarray(linked.tokens), np.asarray(want.tokens))  # was: the val split all of part1
    assert "zz-latest.txt is part1.txt" in capsys.readouterr().out
