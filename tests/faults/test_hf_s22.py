"""Red team, session 22, the Hugging Face side: HF-convention labels padded with -100 are shifted by the
model (not taken as already aligned, which trains a copy task); hf:bert as an LM is causal; a classifier
head is built when num_labels is given or the data has classes (bert, vit); seq2seq models are one line;
a dict of splits (DatasetDict) and a DataParallel-wrapped model are handled as the user meant."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from turbotrain.data.datasets import map_dict_items
from turbotrain.errors import UserError
from turbotrain.models import ModelConfig, adapt, build_model

TINY_BERT = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
             "max_position_embeddings": 32, "vocab_size": 50}


def test_a_dict_of_splits_is_one_line_naming_the_split():
    """An HF DatasetDict (a dict) has __getitem__ and __len__: ds[0] was a KeyError 'fix it there'."""
    rows = [(torch.zeros(2), torch.zeros(()))] * 4
    with pytest.raises(UserError, match=r"dict of splits \('train', 'validation'\).*train_data=ds\['train'\]"):
        map_dict_items({"train": rows, "validation": rows}, "train_data")


def test_a_data_parallel_wrapped_model_trains_the_module_inside():
    inner = nn.Linear(3, 2)
    assert adapt(nn.DataParallel(inner)) is inner


def test_padded_hf_labels_are_shifted_by_the_model_as_hf_does():
    """labels = input_ids with -100 at the padding is HF's convention; it was passed as shift_labels (no shift),
    so train.loss = "model" trained each position to copy its own input."""
    pytest.importorskip("transformers")
    from userpkg.hf_models import tiny_gpt2
    from userpkg.hf_s22 import padded_rows

    rows = map_dict_items(padded_rows("train"))
    x, y = (torch.stack(t) for t in zip(*(rows[i] for i in range(4))))
    assert (y == -100).any()
    model = adapt(tiny_gpt2(vocab_size=50))
    with torch.no_grad():
        ours, hf_own = model(x, y), model.hf(input_ids=x, labels=y).loss
    assert model.targets_are_inputs is True
    torch.testing.assert_close(ours, hf_own)


def test_bert_as_a_language_model_does_not_see_the_next_token():
    pytest.importorskip("transformers")
    model = build_model(ModelConfig(name="hf:bert", args=TINY_BERT)).eval()
    x = torch.randint(0, 50, (1, 8))
    later = x.clone()
    later[0, -1] = (x[0, -1] + 1) % 50
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0, :-1], model(later)[0, :-1])


def test_classifier_heads_for_bert_with_num_labels_and_vit_on_image_classes():
    pytest.importorskip("transformers")
    from turbotrain.models import args_from_data

    bert = build_model(ModelConfig(name="hf:bert", args={**TINY_BERT, "num_labels": 3}))
    assert type(bert.hf).__name__ == "BertForSequenceClassification"
    assert bert(torch.randint(0, 50, (2, 8))).shape == (2, 3)
    vit_cfg = ModelConfig(name="hf:vit", args={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                                "num_attention_heads": 2, "image_size": 8, "patch_size": 4})
    derived = args_from_data(vit_cfg, {"num_classes": 5, "in_channels": 1})
    assert derived == {"num_labels": 5, "num_channels": 1}
    vit = build_model(ModelConfig(name="hf:vit", args={**vit_cfg.args, **derived}))
    assert vit(torch.randn(2, 1, 8, 8)).shape == (2, 5)


def test_an_encoder_decoder_model_is_one_line():
    pytest.importorskip("transformers")
    with pytest.raises(UserError, match="encoder-decoder \\(seq2seq\\) model") as e:
        build_model(ModelConfig(name="hf:t5", args={"d_model": 16, "d_ff": 32, "num_layers": 1, "num_heads": 2,
                                                    "d_kv": 8, "vocab_size": 50}))
    assert "\n" not in str(e.value)


class Items(torch.utils.data.Dataset):
    def __init__(self, rows: list):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        return self.rows[i]


@pytest.mark.parametrize("rows, words", [
    ([{"input_ids": [1, 2], "label": "positive"}] * 4, r"item 0's 'label' is str 'positive'.*class_encode_column"),
    ([{"input_ids": "some text", "labels": 1}] * 4, r"item 0's 'input_ids' is str .*tokenize the text to ids"),
    ([{"input_ids": [[1, 2], [3]], "labels": 1}] * 4, r"item 0's 'input_ids' is list .*padded to one length"),
])
def test_dict_values_that_are_not_numbers_are_one_line(rows, words):
    """np.asarray of a string or a ragged list gave torch's TypeError / numpy's ValueError: a traceback."""
    with pytest.raises(UserError, match=words) as e:
        map_dict_items(Items(rows), "train_data")
    assert "\n" not in str(e.value)


def test_a_later_dict_item_without_the_first_items_keys_is_one_line():
    ds = map_dict_items(Items([{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [1, 2], "label": [1, 2]}]))
    with pytest.raises(UserError, match=r"item 1: KeyError 'labels' \(it is dict with keys \['input_ids', 'label'\]"):
        ds[1]


def test_an_attention_mask_with_padding_warns_that_it_is_not_passed(capsys):
    map_dict_items(Items([{"input_ids": [1, 2, 0], "labels": [1, 2, -100], "attention_mask": [1, 1, 0]}] * 2))
    out = capsys.readouterr().out
    assert "warning: data: 'attention_mask' is not passed to the model, and item 0 has padding" in out
    map_dict_items(Items([{"input_ids": [1, 2, 3], "labels": [1, 2, 3], "attention_mask": [1, 1, 1]}] * 2))
    assert "warning" not in capsys.readouterr().out


def test_a_saved_bert_is_a_causal_lm_or_with_num_labels_a_classifier(tmp_path):
    """hf:/dir of a pretrained BERT (BertForMaskedLM) built a bidirectional BertLMHeadModel: an LM seeing the
    next token; with num_labels it stayed an LM (num_labels ignored)."""
    pytest.importorskip("transformers")
    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(BertConfig(**TINY_BERT)).save_pretrained(tmp_path / "bert")
    lm = build_model(ModelConfig(name=f"hf:{tmp_path / 'bert'}")).eval()
    x = torch.randint(0, 50, (1, 8))
    later = x.clone()
    later[0, -1] = (x[0, -1] + 1) % 50
    with torch.no_grad():
        torch.testing.assert_close(lm(x)[0, :-1], lm(later)[0, :-1])
    classifier = build_model(ModelConfig(name=f"hf:{tmp_path / 'bert'}", args={"num_labels": 4}))
    assert classifier(x).shape == (1, 4)


def test_an_accelerate_prepared_model_runs_its_own_forward():
    """accelerator.prepare (mixed_precision="bf16") patches forward into bf16 autocast: under precision.dtype
    = "fp32" turbotrain trained in bf16, silently."""
    accelerate = pytest.importorskip("accelerate")
    linear = nn.Linear(3, 2)
    prepared = accelerate.Accelerator(cpu=True, mixed_precision="bf16").prepare(linear)
    x = torch.randn(4, 3)
    exact = x @ linear.weight.T + linear.bias
    assert not torch.equal(prepared(x), exact)  # the patch is there: bf16 matmul
    assert adapt(prepared) is linear and torch.equal(linear(x), exact)


class LitLike(nn.Linear):
    """Lightning's API on an nn.Module (LightningModule's own is a subclass of nn.Module with these)."""

    def training_step(self, batch, batch_idx):
        return self(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_lightning_style_module_warns_that_training_step_is_not_called(capsys):
    model = LitLike(3, 2)
    assert adapt(model) is model
    assert "LitLike has Lightning's training_step and configure_optimizers, which turbotrain does not call" \
        in capsys.readouterr().out


def test_a_saved_bf16_model_trains_float32_weights_and_model_args_dtype_is_refused(tmp_path, capsys):
    """transformers 5 loads a saved model in its saved dtype (hub checkpoints: mostly bf16): AdamW then
    stepped bf16 weights under any precision.dtype, losing small updates; model.args.dtype did the same."""
    pytest.importorskip("transformers")
    from userpkg.hf_models import tiny_gpt2

    tiny_gpt2(vocab_size=50).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model = build_model(ModelConfig(name=f"hf:{tmp_path / 'bf16'}"))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert "is saved in bfloat16; its weights are loaded in float32" in capsys.readouterr().out
    with pytest.raises(UserError, match=r"model.args.dtype = 'bfloat16': .*set precision.dtype"):
        build_model(ModelConfig(name="hf:gpt2", args={"n_layer": 1, "n_head": 2, "n_embd": 16, "dtype": "bfloat16"}))


def test_load_into_the_bare_hf_model_a_run_was_trained_on(tmp_path):
    """train(model=<GPT2LMHeadModel>) saves HFModel's `hf.` names; load(run, model=<GPT2LMHeadModel>) refused
    the very instance its error told the user to pass (missing 'lm_head.weight', unexpected 'hf.lm_head.weight')."""
    pytest.importorskip("transformers")
    from userpkg.hf_models import tiny_gpt2

    from turbotrain import load, train
    from turbotrain.config import load_config

    cfg = load_config(None, ['model.name="gpt"', 'data.name="synthetic"', "data.args={seq_len=16, vocab_size=50, "
                             "size=16}", "data.batch_size=4", "data.eval_batches=0", "train.steps=1",
                             'train.loss="model"', f"run.out_dir={str(tmp_path)!r}", 'run.name="bare"',
                             'run.device="cpu"', "precision.dtype=fp32"])
    train(cfg, model=tiny_gpt2(vocab_size=50))
    loaded = load(tmp_path / "bare", "cpu", model=tiny_gpt2(vocab_size=50))
    assert type(loaded.hf).__name__ == "GPT2LMHeadModel" and loaded(torch.randint(0, 50, (1, 5))).shape == (1, 5, 50)


def test_a_decoder_classifier_without_a_pad_id_is_one_line_naming_it():
    """hf:gpt2 with num_labels failed in the first forward with HF's "Cannot handle batch sizes > 1 if no
    padding token is defined", naming no config key."""
    pytest.importorskip("transformers")
    gpt = {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 50, "num_labels": 3}
    with pytest.raises(UserError, match="as a classifier reads each item's last token before model.args.pad_token_id"):
        build_model(ModelConfig(name="hf:gpt2", args=gpt))
    assert build_model(ModelConfig(name="hf:gpt2", args={**gpt, "pad_token_id": 0}))(torch.ones(2, 4).long()).shape \
        == (2, 3)


def test_an_hf_dataset_with_a_class_label_column_gives_num_classes_and_a_dataset_dict_is_refused():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]] * 4, "label": [0, 1, 2, 0], "text": ["a"] * 4})
    ds = ds.cast_column("label", datasets.ClassLabel(num_classes=3))
    mapped = map_dict_items(ds.with_format("torch"), "train_data")
    assert mapped.num_classes == 3 and mapped[1][1].item() == 1
    with pytest.raises(UserError, match=r"got a DatasetDict of splits \('train'\)"):
        map_dict_items(datasets.DatasetDict({"train": ds}), "train_data")
