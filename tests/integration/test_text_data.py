"""data.name = "text": the user's own folder of .txt (and .jsonl) trains with char, byte and tokenizer.json
tokens; the token file is cached memory-mapped, checksummed, rebuilt when corrupt or when a file changes."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from turbotrain import train
from turbotrain.config import load_config
from turbotrain.data.loader import build_dataset
from turbotrain.data.text import source_files, token_ids
from turbotrain.errors import UserError

WORDS = ("the quick brown fox jumps over a lazy dog while zwölf boxkämpfer jagen viktor quer über den sylter "
         "deich").split()


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "cache"))
    rng = random.Random(0)
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    for i in range(2):
        (root / f"part{i}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(1500)), encoding="utf-8")
    rows = [json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(40))}) for _ in range(20)]
    (root / "sub" / "rows.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (root / "notes.md").write_text("not read")
    return root


def text_cfg(tmp_path, path, tokens, *overrides):
    return load_config(None, ['data.name="text"', f"data.args.path={str(path)!r}", f"data.args.tokens={str(tokens)!r}",
                              "data.args.block_size=32", "data.batch_size=8", "data.eval_batches=2",
                              "model.args.n_layer=1", "model.args.n_head=2", "model.args.n_embd=32", "train.steps=3",
                              "train.log_every=1", 'precision.dtype="fp32"', f"run.out_dir={str(tmp_path / 'runs')!r}",
                              *overrides])


def tokenizer_json(tmp_path, corpus) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([p.read_text(encoding="utf-8") for p in corpus.glob("*.txt")],
                            trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]"], show_progress=False))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.mark.parametrize("tokens", ["char", "byte", "tokenizer.json"])
def test_a_text_folder_trains(tmp_path, corpus, tokens):
    if tokens == "tokenizer.json":
        pytest.importorskip("tokenizers")
        tokens = tokenizer_json(tmp_path, corpus)
    cfg = text_cfg(tmp_path, corpus, tokens, f"run.name={'tok' if tokens.endswith('.json') else tokens}")
    ds = build_dataset(cfg.data, "train")
    ids, _ = token_ids(source_files(str(corpus)), tokens)
    assert isinstance(ids, np.memmap)  # the cached token file, mapped, not read into memory
    expect = {"char": None, "byte": 256}.get(tokens)
    if tokens.endswith(".json"):
        from tokenizers import Tokenizer

        assert ds.vocab_size == Tokenizer.from_file(tokens).get_vocab_size() > 60
    elif expect:
        assert ds.vocab_size == expect
    else:  # the characters present, ö and ü included (code points, not bytes)
        assert ds.vocab_size == len(set(" ".join(WORDS) + "\n"))
    summary = train(cfg)
    assert summary["steps"] == 3 and summary["val_loss"] is not None
    resolved = (tmp_path / "runs" / cfg.run.name / "config.toml").read_text()
    assert f"vocab_size = {ds.vocab_size}" in resolved


def test_cache_is_reused_and_a_corrupt_one_is_rebuilt(tmp_path, corpus, capsys):
    cfg = text_cfg(tmp_path, corpus, "char")
    first = build_dataset(cfg.data, "train")
    want = first.tokens.clone()  # first.tokens maps the file that is corrupted below
    assert "cached in" in capsys.readouterr().out
    again = build_dataset(cfg.data, "val")
    assert "cached in" not in capsys.readouterr().out  # read from the cache
    assert len(first) > len(again) > 0
    (cached,) = (tmp_path / "cache" / "text").glob("*/tokens.bin")
    cached.write_bytes(b"\x00" * cached.stat().st_size)
    from turbotrain.data import fetch

    fetch._digests.clear()  # a new process would hash the file again
    rebuilt = build_dataset(cfg.data, "train")
    assert "does not match its recorded sha256" in capsys.readouterr().out
    assert (rebuilt.tokens == want).all()
    (corpus / "part0.txt").write_text("changed " * 400, encoding="utf-8")
    build_dataset(cfg.data, "train")
    assert len(list((tmp_path / "cache" / "text").iterdir())) == 2  # a changed file: a new cache entry


@pytest.mark.parametrize("args, words", [
    (["data.args.path='/no/such/dir'"], "no such file or folder"),
    (["data.args.tokens='word'"], "expected \"char\", \"byte\" or the path of a tokenizer.json"),
    (["data.args.tokens='/no/tokenizer.json'"], "no such tokenizer.json file"),
    (["data.args.block_size=100000"], "the train split of"),
])
def test_bad_arguments_are_one_line(tmp_path, corpus, args, words):
    with pytest.raises(UserError, match=words) as e:
        build_dataset(text_cfg(tmp_path, corpus, "char", *args).data, "train")
    assert "\n" not in str(e.value)


def test_missing_path_is_named(tmp_path):
    cfg = load_config(None, ['data.name="text"'])
    with pytest.raises(UserError, match='data.args.path: data.name = "text" needs'):
        build_dataset(cfg.data, "train")


def test_hf_model_on_a_tokenizer_exports_with_its_tokenizer(tmp_path, corpus):
    """hf:gpt2 on the user's text through their tokenizer.json: export --format hf carries the tokenizer."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from turbotrain.export import export

    tok = tokenizer_json(tmp_path, corpus)
    cfg = text_cfg(tmp_path, corpus, tok, 'model.name="hf:gpt2"', "model.args={n_layer=1, n_head=2, n_embd=32}",
                   "run.name=hftok", "train.steps=2")
    train(cfg)
    out = export(tmp_path / "runs" / "hftok", "hf")
    tokenizer, model = AutoTokenizer.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out)
    ids = tokenizer("the quick brown fox", return_tensors="pt")["input_ids"]
    assert model.config.vocab_size == len(tokenizer) and model(input_ids=ids).logits.shape[:2] == ids.shape
