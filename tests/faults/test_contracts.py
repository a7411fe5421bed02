"""The trainer's contract with the code it calls, checked at its boundary (turbotrain.contract and the
built-in factories): every violation is ONE UserError naming the config key of the culprit
(`model.args.X`, `data.args.X`, `data.name = ...`, `train.loss = ...`) and the fix — never a traceback
from deep inside torch, never a silently wrong run.

Classes:
  TestFactoryArgs       built-in model/data factories validate their own arguments (unit)
  TestUnknownArgument   a wrong keyword lists the valid ones (unit)
  TestItemsAndBatch     contract.first_batch / check_item on bad user datasets (unit)
  TestModelAlone        contract.check_model (unit)
  TestModelData         contract.check_model_data: model × data × loss on the first batch (unit)
  TestArgsThroughCLI    factory-argument errors through `turbotrain train` (work now)
  TestThroughTrain      end to end through `turbotrain train`: pass only once build() calls the contract
                        functions (see the wiring in contract.py's docstring)
User code: tests/userpkg/contracts.py, imported as `userpkg.contracts` (tests/ is on sys.path).
"""
from __future__ import annotations

import pytest
import torch
import userpkg.contracts as uc
from torch import nn

from tests.faults.common import BASE_TOML, error_line, lit
from tests.helpers import TINY_GPT
from turbotrain.contract import Names, check_model, check_model_data, first_batch
from turbotrain.data.datasets import shakespeare, synthetic
from turbotrain.data.loader import DataConfig, build_dataset
from turbotrain.errors import UserError
from turbotrain.losses import cross_entropy, mse
from turbotrain.models import ModelConfig, build_model, cnn, gpt, mlp, resnet

CPU = torch.device("cpu")


def user_names(model="userpkg.contracts:classifier", data="userpkg.contracts:labels", loss="cross_entropy") -> Names:
    return Names(model=f"model.name = {model!r}", data=f"data.name = {data!r}", loss=f"train.loss = {loss!r}")


def refused(fn, *args, **kwargs) -> str:
    with pytest.raises(UserError) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# ---------------------------------------------------------------- built-in factories' own arguments

class TestFactoryArgs:
    @pytest.mark.parametrize("factory, kwargs, expect", [
        (gpt.build, {"n_head": 0}, ["model.args.n_head", ">= 1"]),
        (gpt.build, {"n_layer": 2.5}, ["model.args.n_layer", "integer"]),
        (gpt.build, {"n_layer": True}, ["model.args.n_layer", "integer"]),
        (gpt.build, {"dropout": 1.5}, ["model.args.dropout", "[0.0, 1.0)"]),
        (gpt.build, {"dropout": -0.1}, ["model.args.dropout"]),
        (gpt.build, {"vocab_size": -5}, ["model.args.vocab_size", "-5"]),
        (gpt.build, {"block_size": 0}, ["model.args.block_size"]),
        (gpt.build, {"n_embd": "768"}, ["model.args.n_embd", "'768'"]),
        (gpt.build, {"bias": 1}, ["model.args.bias", "true or false"]),
        (cnn.build, {"in_channels": -1}, ["model.args.in_channels"]),
        (cnn.build, {"num_classes": 0}, ["model.args.num_classes"]),
        (cnn.build, {"dropout": float("nan")}, ["model.args.dropout"]),
        (mlp.build, {"depth": -1}, ["model.args.depth", ">= 0"]),
        (mlp.build, {"width": 0.5}, ["model.args.width", "integer"]),
        (mlp.build, {"in_features": 0}, ["model.args.in_features"]),
        (resnet.build, {"depth": "50"}, ["model.args.depth", "50, 101, 152"]),
        (resnet.build, {"in_channels": 0}, ["model.args.in_channels"]),
        (resnet.build, {"num_classes": -10}, ["model.args.num_classes"]),
    ])
    def test_model_factory_refuses(self, factory, kwargs, expect):
        msg = refused(factory, **kwargs)
        for text in expect:
            assert text in msg, msg

    @pytest.mark.parametrize("kwargs, expect", [
        ({"size": 0}, ["data.args.size", ">= 1"]),
        ({"seq_len": 0}, ["data.args.seq_len"]),
        ({"seq_len": 2.5}, ["data.args.seq_len", "integer"]),
        ({"vocab_size": 0}, ["data.args.vocab_size"]),
        ({"kind": "audio"}, ["data.args.kind", "'tokens'"]),
        ({"kind": "images", "shape": [3, 32]}, ["data.args.shape", "[channels, height, width]"]),
        ({"kind": "images", "shape": [3, 0, 8]}, ["data.args.shape"]),
        ({"kind": "images", "num_classes": 0}, ["data.args.num_classes"]),
        ({"kind": "vectors", "in_features": -3}, ["data.args.in_features"]),
        ({"size": True}, ["data.args.size", "integer"]),
    ])
    def test_synthetic_refuses(self, kwargs, expect):
        msg = refused(synthetic, "train", **kwargs)
        for text in expect:
            assert text in msg, msg

    @pytest.mark.parametrize("kwargs, expect", [
        ({"block_size": 0}, ["data.args.block_size"]),
        ({"block_size": 64.0}, ["data.args.block_size", "integer"]),
        ({"val_fraction": 1.0}, ["data.args.val_fraction", "(0.0, 1.0)"]),
        ({"val_fraction": 0}, ["data.args.val_fraction"]),
        ({"stride": 0}, ["data.args.stride"]),
        ({"tokens": "word"}, ["data.args.tokens", "'char'"]),
    ])
    def test_shakespeare_refuses_before_fetching(self, kwargs, expect, monkeypatch):
        monkeypatch.setattr("turbotrain.data.datasets.fetch", lambda name: pytest.fail("fetched before checking"))
        msg = refused(shakespeare, "train", **kwargs)
        for text in expect:
            assert text in msg, msg

    def test_valid_arguments_still_build(self):
        assert isinstance(gpt.build(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8), nn.Module)
        assert cnn.build(width=4).image_size == 28
        assert mlp.build(in_features=4, width=4, depth=0, num_classes=2).in_features == 4
        assert len(synthetic("train", kind="images", shape=(1, 4, 4), size=2, num_classes=3)) == 2


class TestUnknownArgument:
    def test_builtin_model_names_the_valid_arguments(self):
        msg = refused(build_model, ModelConfig("gpt", {"n_heads": 4}))
        assert "model.args" in msg and "'n_heads'" in msg
        assert "valid model.args: vocab_size, block_size, n_layer, n_head, n_embd" in msg

    def test_builtin_data_names_the_valid_arguments(self):
        msg = refused(build_dataset, DataConfig("synthetic", args={"seqlen": 8}), "train")
        assert "'seqlen'" in msg and "seq_len" in msg and "vocab_size" in msg
        assert "split" not in msg.split("valid data.args:")[1]  # the positional split is not an argument

    def test_user_factory_missing_argument_names_it(self):
        msg = refused(build_model, ModelConfig("userpkg.models:needs_width", {}))
        assert "width" in msg and "userpkg.models:needs_width" in msg


# ---------------------------------------------------------------- items and the first batch

class TestItemsAndBatch:
    @pytest.mark.parametrize("factory, expect", [
        ("single_tensor", ["item 0 is a float32 tensor of shape (8,)", "(inputs, targets)"]),
        ("dict_items", ["item 0 is a dict with keys ['x', 'y']"]),
        ("triple", ["a tuple of 3 items"]),
        ("none_items", ["item 0 is None"]),
        ("string_targets", ["the targets of item 0", "str"]),
        ("ragged", ["cannot be batched", "same shape"]),
    ])
    def test_bad_items_are_refused_naming_the_factory(self, factory, expect):
        spec = f"userpkg.contracts:{factory}"
        ds = getattr(uc, factory)("train")
        msg = refused(first_batch, ds, CPU, user_names(data=spec))
        assert f"data.name = {spec!r}" in msg, msg
        for text in expect:
            assert text in msg, msg

    def test_val_split_is_named(self):
        msg = refused(first_batch, uc.triple("val"), CPU, user_names(data="userpkg.contracts:triple"), split="val")
        assert "data.name = 'userpkg.contracts:triple' (val split): item 0" in msg

    def test_numpy_and_number_items_are_fine(self):
        x, y = first_batch(uc.numpy_pairs("train"), CPU, user_names())
        assert x.shape == (2, 8) and y.shape == (2,)

    def test_builtin_dataset_batch_as_before(self):
        x, y = first_batch(synthetic("train", size=4, seq_len=8, vocab_size=16), CPU)
        assert x.shape == (2, 8) and torch.equal(x[:, 1:], y[:, :-1])


# ---------------------------------------------------------------- the model alone

class TestModelAlone:
    @pytest.mark.parametrize("factory", ["no_params", "frozen"])
    def test_nothing_to_train(self, factory):
        msg = refused(check_model, getattr(uc, factory)(), user_names(model=f"userpkg.contracts:{factory}"))
        assert f"userpkg.contracts:{factory}" in msg and "no trainable parameters" in msg

    def test_not_a_module(self):
        assert "not a torch.nn.Module" in refused(check_model, lambda x: x, Names())


# ---------------------------------------------------------------- model × data × loss

def tiny_gpt_model(**kw):
    return gpt.build(**{"vocab_size": 32, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16, **kw})


def tokens(seq_len=16, vocab=32):
    return first_batch(synthetic("train", size=4, seq_len=seq_len, vocab_size=vocab), CPU)


BUILTIN = Names(model="model.name = 'gpt'", data="data.name = 'synthetic'", loss="train.loss = 'cross_entropy'")


class TestModelData:
    def test_fitting_pairs_pass_and_leave_no_trace(self):
        model = cnn.build(width=4)
        x = torch.randn(2, 1, 28, 28)
        y = torch.tensor([1, 9])
        before = {k: v.clone() for k, v in model.state_dict().items()}
        rng = torch.get_rng_state()
        check_model_data(model, (x, y), cross_entropy, BUILTIN)
        assert torch.equal(torch.get_rng_state(), rng)  # dropout drew from a forked RNG
        after = model.state_dict()
        assert all(torch.equal(before[k], after[k]) for k in before)  # BatchNorm statistics restored
        assert all(p.grad is None for p in model.parameters())
        assert not model._forward_pre_hooks and not any(m._forward_pre_hooks for m in model.modules())

    def test_gpt_and_fitting_tokens_pass(self):
        check_model_data(tiny_gpt_model(), tokens(), cross_entropy, BUILTIN)

    def test_sequence_longer_than_block_size(self):
        msg = refused(check_model_data, tiny_gpt_model(), tokens(seq_len=32), cross_entropy, BUILTIN)
        assert "32 tokens" in msg and "model.args.block_size = 16" in msg and "data.args.seq_len" in msg
        assert "model.name = 'gpt'" in msg and "data.name = 'synthetic'" in msg

    def test_data_vocabulary_larger_than_model(self):
        msg = refused(check_model_data, tiny_gpt_model(), tokens(vocab=64), cross_entropy, BUILTIN)
        assert "token id" in msg and "model.args.vocab_size = 32" in msg

    def test_undeclared_embedding_checked_where_it_is_used(self):
        """A user LM without vocab_size/block_size attributes, its positional embedding registered first:
        fitting data passes (no false alarm), too-large token ids are caught at the token embedding."""
        names = user_names(model="userpkg.contracts:pos_first_lm", data="synthetic")
        check_model_data(uc.pos_first_lm(vocab=32, block=16), tokens(), cross_entropy, names)
        msg = refused(check_model_data, uc.pos_first_lm(vocab=16, block=16), tokens(vocab=32), cross_entropy, names)
        assert "layer `tok` (Embedding of 16 rows)" in msg and "userpkg.contracts:pos_first_lm" in msg
        msg = refused(check_model_data, uc.pos_first_lm(vocab=32, block=8), tokens(), cross_entropy, names)
        assert "layer `pos` (Embedding of 8 rows) is given index 15" in msg

    def test_user_attribute_names_are_not_taken_for_sizes(self):
        """A user model whose `in_features` means something else (an nn.Linear subclass fed (B, T, 8)): no
        false alarm; only the layers' actual inputs are checked."""
        class SeqLinear(nn.Linear):
            def forward(self, x):
                return super().forward(x).mean(1)
        x, y = torch.randn(2, 5, 8), torch.tensor([0, 1])
        check_model_data(SeqLinear(8, 3), (x, y), cross_entropy, user_names())

    def test_mlp_in_features_mismatch(self):
        ds = synthetic("train", kind="vectors", in_features=12, num_classes=4, size=4)
        msg = refused(check_model_data, mlp.build(in_features=16, width=8, depth=1, num_classes=4),
                      first_batch(ds, CPU), cross_entropy, BUILTIN)
        assert "12 features" in msg and "model.args.in_features = 16" in msg

    @pytest.mark.parametrize("build", [lambda: cnn.build(in_channels=1, width=4),
                                       lambda: resnet.build(in_channels=1, base_width=4, num_classes=10)],
                             ids=["cnn", "resnet"])
    def test_in_channels_mismatch(self, build):
        ds = synthetic("train", kind="images", shape=(3, 28, 28), num_classes=10, size=4)
        msg = refused(check_model_data, build(), first_batch(ds, CPU), cross_entropy, BUILTIN)
        assert "3 channels" in msg and "model.args.in_channels = 1" in msg

    def test_cnn_image_size(self):
        ds = synthetic("train", kind="images", shape=(1, 32, 32), num_classes=10, size=4)
        msg = refused(check_model_data, cnn.build(width=4), first_batch(ds, CPU), cross_entropy, BUILTIN)
        assert "32x32" in msg and "28x28" in msg

    def test_more_label_classes_than_model_outputs(self):
        ds = synthetic("train", kind="vectors", in_features=8, num_classes=1000, size=64, seed=3)
        sample = first_batch(ds, CPU)
        assert int(sample[1].max()) >= 10
        msg = refused(check_model_data, mlp.build(in_features=8, width=8, depth=1, num_classes=10), sample,
                      cross_entropy, BUILTIN)
        assert "10 classes" in msg and "model.args.num_classes" in msg

    def test_user_labels_out_of_range(self):
        names = user_names()
        sample = first_batch(uc.labels("train", classes=5), CPU)  # labels 4, 0
        msg = refused(check_model_data, uc.classifier(classes=3), sample, cross_entropy, names)
        assert "has label 4" in msg and "3 classes" in msg and "userpkg.contracts:labels" in msg

    def test_float_targets_with_cross_entropy(self):
        sample = first_batch(uc.numpy_pairs("train"), CPU)
        msg = refused(check_model_data, uc.classifier(), sample, cross_entropy, user_names())
        assert "train.loss = 'cross_entropy' needs integer class labels" in msg and "mse" in msg

    def test_mse_output_and_targets_differ_in_size(self):
        """(B, 3) outputs against (B,) targets would broadcast silently in F.mse_loss."""
        sample = first_batch(uc.numpy_pairs("train"), CPU)
        msg = refused(check_model_data, uc.classifier(classes=3), sample, mse, user_names(loss="mse"))
        assert "same size" in msg and "(2, 3)" in msg

    def test_user_linear_mismatch_by_layer(self):
        sample = first_batch(uc.numpy_pairs("train", dim=8), CPU)
        msg = refused(check_model_data, uc.classifier(dim=6), sample, mse, user_names(loss="mse"))
        assert "layer `fc` (Linear) expects 6 input features, its input has 8" in msg

    def test_float64_inputs_get_a_hint(self):
        sample = first_batch(uc.float64_inputs("train"), CPU)
        msg = refused(check_model_data, uc.Head(8), sample, mse, user_names(data="userpkg.contracts:float64_inputs"))
        assert "fails on the first batch" in msg and "float64" in msg and "return float32 inputs" in msg

    @pytest.mark.parametrize("factory", ["returns_tuple", "returns_list"])
    def test_model_output_not_a_tensor(self, factory):
        sample = first_batch(uc.numpy_pairs("train"), CPU)
        msg = refused(check_model_data, getattr(uc, factory)(), sample, mse,
                      user_names(model=f"userpkg.contracts:{factory}", loss="mse"))
        assert f"userpkg.contracts:{factory}" in msg and "not a tensor" in msg and 'train.loss = "model"' in msg

    @pytest.mark.parametrize("loss, expect", [
        ("per_element", "not a scalar"),
        ("python_float", "a float"),
        ("returns_none", "returned None"),
        ("detached", "does not depend on the model's trainable parameters"),
        ("integer_loss", "floating-point"),
        ("shape_error", "fails on the output"),
    ])
    def test_bad_loss(self, loss, expect):
        spec = f"userpkg.contracts:{loss}"
        sample = first_batch(uc.numpy_pairs("train"), CPU)
        msg = refused(check_model_data, uc.Head(8), sample, getattr(uc, loss), user_names(loss=spec))
        assert f"train.loss = {spec!r}" in msg and expect in msg, msg

    def test_loss_model_contract(self):
        sample = first_batch(uc.numpy_pairs("train"), CPU)
        check_model_data(uc.loss_model(), sample, None, user_names(loss="model"))
        msg = refused(check_model_data, uc.loss_model_vector(), sample, None,
                      user_names(model="userpkg.contracts:loss_model_vector", loss="model"))
        assert "loss_model_vector" in msg and 'train.loss = "model"' in msg and "not a scalar" in msg
        msg = refused(check_model_data, uc.classifier(), sample, None, user_names(loss="model"))
        assert "forward(inputs, targets)" in msg and "TypeError" in msg

    def test_good_user_loss_passes(self):
        check_model_data(uc.Head(8), first_batch(uc.numpy_pairs("train"), CPU), uc.mean_l1, user_names())


# ---------------------------------------------------------------- through `turbotrain train`

BASE = str(BASE_TOML)
GPT = ["gpt2-124m", *TINY_GPT, 'run.device="cpu"', "train.log_every=1", "train.steps=2", "data.eval_batches=0"]
MLP = ["mlp-seed", "model.args.in_features=8", "model.args.width=8", "model.args.depth=1", "model.args.num_classes=10",
       "data.args.in_features=8", "data.args.num_classes=10", "data.args.size=64", "data.batch_size=8",
       "precision.dtype=fp32", 'run.device="cpu"', "train.steps=2", "data.eval_batches=0", "data.num_workers=0"]


def train_error(capsys, tmp_path, argv) -> str:
    from turbotrain.cli import main

    capsys.readouterr()
    rc = main(["train", *argv, f"run.out_dir={lit(tmp_path)}"])
    out, err = capsys.readouterr()
    assert rc == 2, f"rc={rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}"
    assert not list(tmp_path.rglob("summary.json"))
    return error_line(err)


class TestArgsThroughCLI:
    @pytest.mark.parametrize("argv, expect", [
        ([*GPT, "model.args.n_head=0"], ["model.args.n_head"]),
        ([*GPT, "model.args.n_layer=2.5"], ["model.args.n_layer", "integer"]),
        ([*GPT, "model.args.dropout=1.5"], ["model.args.dropout"]),
        ([*GPT, "data.args.size=0"], ["data.args.size"]),
        ([*GPT, "model.args.n_heads=2"], ["n_heads", "valid model.args:", "n_head"]),
    ], ids=["n_head-0", "n_layer-float", "dropout", "size-0", "unknown-arg"])
    def test_refused(self, capsys, tmp_path, argv, expect):
        line = train_error(capsys, tmp_path, argv)
        for text in expect:
            assert text in line, line


class TestThroughTrain:
    """End to end: needs build() to call contract.check_model / first_batch / check_model_data."""

    @pytest.mark.parametrize("argv, expect", [
        ([*GPT, "data.args.seq_len=64"], ["block_size = 32", "64 tokens"]),
        ([*GPT, "data.args.vocab_size=128"], ["model.args.vocab_size = 64"]),
        ([*MLP, "data.args.num_classes=50"], ["10 classes", "model.args.num_classes"]),
        ([*MLP, "data.args.in_features=6"], ["6 features", "model.args.in_features = 8"]),
        ([BASE, 'data.name="userpkg.contracts:single_tensor"'], ["contracts:single_tensor", "(inputs, targets)"]),
        ([BASE, 'data.name="userpkg.contracts:dict_items"'], ["userpkg.contracts:dict_items", "dict"]),
        ([BASE, 'model.name="userpkg.contracts:frozen"'], ["userpkg.contracts:frozen", "no trainable parameters"]),
        ([BASE, 'model.name="userpkg.contracts:returns_tuple"'], ["returns_tuple", "not a tensor"]),
        ([BASE, 'train.loss="userpkg.contracts:per_element"'], ["userpkg.contracts:per_element", "not a scalar"]),
        ([BASE, 'train.loss="userpkg.contracts:python_float"'], ["userpkg.contracts:python_float", "not a tensor"]),
        ([BASE, 'model.name="userpkg.contracts:loss_model_vector"', 'train.loss="model"'], ["not a scalar"]),
        ([BASE, "model.args.dim=6"], ["userpkg.models:linear", "userpkg.data:regression", "expects 6 input features"]),
    ], ids=["seq-gt-block", "vocab", "classes", "in-features", "single-tensor", "dict", "frozen", "tuple-out",
            "per-element-loss", "float-loss", "loss-model-vector", "user-dim"])
    def test_refused_at_build(self, capsys, tmp_path, argv, expect):
        line = train_error(capsys, tmp_path, argv)
        for text in expect:
            assert text in line, line
