"""Red team, session 25: a user bringing their own Hugging Face model and data. A bidirectional model (bert)
attended to its padding (the attention mask was dropped); a tokenizer's BatchEncoding item was not a dict item;
per-item return_tensors="pt" rows, a half-precision model, a decoder classifier
without a pad id, frozen parameters and dropped segment ids were a traceback, a NaN or said nothing."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.faults.common import BASE_TOML, error_line, lit
from turbotrain.contract import Names, check_model
from turbotrain.data.datasets import map_dict_items
from turbotrain.errors import UserError
from turbotrain.models import adapt

PKG = "userpkg.redteam_s25_hf"


def _run(capsys, tmp_path, *overrides) -> tuple[int, str, str]:
    from turbotrain.cli import main

    capsys.readouterr()
    rc = main(["train", str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", "train.steps=2", "data.eval_batches=0",
               "data.args={}", *overrides])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_bidirectional_model_does_not_attend_to_its_padding(side):
    """BertForSequenceClassification got input_ids alone: every token attended to the pads, so a padded row's
    logits differed from the same row unpadded (a classifier trained on noise from the padding)."""
    pytest.importorskip("transformers")
    from userpkg.redteam_s25_hf import bert_classifier

    torch.manual_seed(0)
    model = adapt(bert_classifier()).eval()
    with torch.no_grad():
        nn.init.normal_(model.hf.bert.embeddings.word_embeddings.weight)  # attention far from uniform
        row = torch.tensor([[5, 6, 7]])
        pads = torch.zeros(1, 4, dtype=torch.long)
        padded = torch.cat([row, pads] if side == "right" else [pads, row], 1)
        mask = (torch.arange(7) < 3 if side == "right" else torch.arange(7) >= 4).long()[None]
        torch.testing.assert_close(model(padded), model.hf(input_ids=padded, attention_mask=mask).logits)
        if side == "right":  # bert's positions count from the row's start: left padding moves them, as in HF
            torch.testing.assert_close(model(padded), model(row))
        inner = torch.tensor([[5, 0, 7]])  # the pad id between real tokens is text: attended, as a tokenizer masks
        torch.testing.assert_close(model(inner), model.hf(input_ids=inner).logits)


def test_a_causal_lm_gets_no_derived_mask():
    """Its pad id is often its eos, a real token in packed text; right padding needs no mask."""
    pytest.importorskip("transformers")
    from userpkg.redteam_s25_hf import gpt2_lm

    model = gpt2_lm()
    model.config.pad_token_id = 0
    assert adapt(model).pad_id is None


def test_the_derived_mask_leaves_a_meta_model_countable():
    """parallel.meta_init counts FLOPs on meta inputs: HF's mask code reads the mask's values (.item())."""
    transformers = pytest.importorskip("transformers")
    from userpkg.redteam_s25_hf import TINY_BERT

    with torch.device("meta"):
        model = adapt(transformers.BertForSequenceClassification(transformers.BertConfig(**TINY_BERT, num_labels=3)))
    assert model.pad_id == 0 and model(torch.zeros(2, 8, dtype=torch.long, device="meta")).shape == (2, 3)


def test_the_data_s_pad_id_is_named_and_a_mask_it_cannot_give_is_said(capsys):
    from userpkg.redteam_s25_hf import labelled_rows

    map_dict_items(labelled_rows("train", pad=7, side="left"), "train_data")
    assert "item 0 has padding (id 7 at the row ends)" in capsys.readouterr().out
    rows = labelled_rows("train")
    rows.rows[0]["attention_mask"] = [1, 0] + [1] * 8  # a hole in the middle: no pad id gives it back
    map_dict_items(rows, "train_data")
    assert "padding that is not one pad id at the row ends: the model attends to it" in capsys.readouterr().out


def test_sentence_pair_segment_ids_that_are_dropped_are_said(capsys):
    from userpkg.redteam_s25_hf import labelled_rows

    rows = labelled_rows("train")
    map_dict_items(rows, "train_data")  # all segment 0: nothing lost
    assert "token_type_ids' is not passed" not in capsys.readouterr().out
    rows.rows[0]["token_type_ids"] = [0] * 5 + [1] * 5
    map_dict_items(rows, "train_data")
    assert "warning: train_data: 'token_type_ids' is not passed to the model" in capsys.readouterr().out


def test_a_tokenizers_batch_encoding_item_is_a_dict_item():
    """tokenizer(text) returns a BatchEncoding (a UserDict, not a dict): refused as 'not an (inputs, targets)
    pair'."""
    transformers = pytest.importorskip("transformers")
    from userpkg.hf_models import Rows

    rows = Rows([transformers.BatchEncoding({"input_ids": [1, 2, 3], "labels": 1})] * 4, 50)
    x, y = map_dict_items(rows, "train_data")[0]
    assert x.tolist() == [1, 2, 3] and int(y) == 1


def test_items_tokenized_with_return_tensors_pt_name_the_extra_dimension(capsys, tmp_path):
    """Each item's input_ids of shape (1, T) batched to (B, 1, T): 'too many values to unpack' deep in the model."""
    pytest.importorskip("transformers")
    rc, _, err = _run(capsys, tmp_path, f'model.name="{PKG}:bert_classifier"', "model.args={}",
                      f'data.name="{PKG}:pt_rows"', 'train.loss="cross_entropy"')
    assert rc == 2 and "return_tensors='pt'" in error_line(err)


def test_frozen_parameters_are_said(capsys):
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    check_model(model, Names())
    assert "model: 20 of 30 parameters are frozen (requires_grad=False, 2 tensors, e.g. 0.weight)" \
        in capsys.readouterr().out


def test_a_half_precision_hf_model_trains_in_float32(capsys, tmp_path):
    """model.half() from the factory: AdamW's eps is 0 in fp16, so step 2's loss was NaN (blaming the lr)."""
    pytest.importorskip("transformers")
    rc, out, err = _run(capsys, tmp_path, f'model.name="{PKG}:bert_classifier"', "model.args={half=true}",
                        f'data.name="{PKG}:labelled_rows"', 'train.loss="cross_entropy"')
    assert rc == 0, err
    assert "model: BertForSequenceClassification came in float16; turbotrain trains its weights in float32" in out


def test_a_decoder_classifier_without_a_pad_id_is_one_line():
    """GPT2ForSequenceClassification from the user's code without config.pad_token_id failed each batch in HF."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=50, n_layer=1, n_embd=16, n_head=2, n_positions=32, num_labels=3)
    with pytest.raises(UserError, match=r"config.pad_token_id, which is not set: set model.config.pad_token_id"):
        adapt(transformers.GPT2ForSequenceClassification(cfg))
    cfg.pad_token_id = 0
    adapt(transformers.GPT2ForSequenceClassification(cfg))



def _word_tokenizer(path, unk: bool) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"hello": 0, "world": 1, **({"[UNK]": 2} if unk else {})}
    tok = Tokenizer(models.WordLevel(vocab=vocab, **({"unk_token": "[UNK]"} if unk else {})))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return str(path)


def test_a_tokenizer_that_cannot_encode_the_text_is_one_line(tmp_path, monkeypatch):
    """A WordLevel tokenizer without an unk_token raised its own Exception from encode_batch: a traceback."""
    pytest.importorskip("tokenizers")
    from turbotrain.data.text import text

    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a.txt").write_text("hello world foo bar " * 50)
    with pytest.raises(UserError, match=r"the tokenizer cannot encode the text \(WordLevel error: Missing \[UNK\]"):
        text("train", str(tmp_path / "a.txt"), _word_tokenizer(tmp_path / "tok.json", unk=False), block_size=8)


def test_a_tokenizer_that_turns_the_text_into_unknown_tokens_is_said_from_the_cache_too(tmp_path, monkeypatch,
                                                                                          capsys):
    """Half the words outside the vocabulary: a stream of [UNK] trained with a fine loss, not a word said."""
    pytest.importorskip("tokenizers")
    from turbotrain import log
    from turbotrain.data.text import text

    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a.txt").write_text("hello world foo bar " * 50)
    tok = _word_tokenizer(tmp_path / "tok.json", unk=True)
    for _ in range(2):  # tokenised, then read from the cache
        monkeypatch.setattr(log, "_said", set())
        text("train", str(tmp_path / "a.txt"), tok, block_size=8)
        assert "warning: data text: 50% of the tokens are" in capsys.readouterr().out


@pytest.mark.parametrize("name, words", [
    ("hf:openai-community/gpt2", r"no such folder, and turbotrain downloads nothing: save the Hub model"),
    ("hf:bert-base-uncased", r"looks like a checkpoint's name: 'hf:bert' builds that architecture"),
])
def test_a_hub_checkpoint_name_says_nothing_is_downloaded_and_what_to_do(name, words, tmp_path, monkeypatch):
    """A Hub id was 'not a saved HF model directory; save one with model.save_pretrained(dir)', a checkpoint name
    'use a type such as gpt2': neither said that the name is the Hub's, which turbotrain does not download."""
    pytest.importorskip("transformers")
    from turbotrain.models import ModelConfig, build_model

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=words):
        build_model(ModelConfig(name=name, args={}))


def test_rows_padded_with_a_missing_pad_id_name_the_tokenizer_s_pad_token():
    """A tokenizer without a pad token (gpt2's) pads with None: 'not numbers of one shape' named no cause."""
    from userpkg.hf_models import Rows

    with pytest.raises(UserError, match=r"padded with None, .*set tokenizer.pad_token"):
        map_dict_items(Rows([{"input_ids": [1, 2, None], "labels": 1}] * 4, 50), "train_data")


def test_what_transformers_logs_while_the_factory_builds_goes_to_stdout(capsys, tmp_path):
    """GPT2Config's default bos/eos ids past a small vocabulary: transformers' two log lines on stderr above the
    run's error line (three lines where the contract is one). A message of its own (vocab 47): HF logs each once."""
    pytest.importorskip("transformers")
    rc, out, err = _run(capsys, tmp_path, f'model.name="{PKG}:gpt2_cls"', "model.args={vocab_size=47}",
                        f'data.name="{PKG}:labelled_rows"', 'train.loss="cross_entropy"')
    assert rc == 2 and "config.pad_token_id, which is not set" in error_line(err)
    assert "model: Model config: bos_token_id must be `None` or an integer within the vocabulary (between 0 and 46)" \
        in out
