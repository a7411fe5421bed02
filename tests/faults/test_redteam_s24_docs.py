"""Red team, session 24: the user's first hour and switching from the peers. HF's causal-LM labels
(labels = input_ids) under the built-in cross-entropy are refused (the run learned to copy its input and
reported a near-perfect val_acc); an HF model whose config has return_dict=False trains (its tuples had no
.logits); a factory importing transformers leaves no torchao log lines around the CLI's one error line."""
from __future__ import annotations

import logging

import pytest
import torch

import turbotrain
from tests.helpers import tiny_gpt
from turbotrain.config import load_config
from turbotrain.errors import UserError
from turbotrain.models import ModelConfig, adapt, build_model

FAST = ["train.steps=2", "train.warmup_steps=0", "train.log_every=1", "data.batch_size=4", "precision.dtype=fp32",
        "compile.enabled=false", 'run.device="cpu"']


def _cfg(tmp_path, *overrides):
    return load_config("mlp-seed", [*FAST, f"run.out_dir={str(tmp_path)!r}", *overrides])


@pytest.mark.parametrize("model", ["hf_gpt2", "builtin_gpt"])
def test_labels_equal_to_the_inputs_under_cross_entropy_are_refused(tmp_path, model):
    """HF's convention (the model shifts labels = input_ids) under train.loss = "cross_entropy": output t was
    trained to predict token t, which it sees; the run 'succeeded' with val_acc near 100 %."""
    from userpkg.redteam_s24_docs import same_tokens

    if model == "hf_gpt2":
        pytest.importorskip("transformers")
        from userpkg.hf_models import tiny_gpt2

        cfg, net = _cfg(tmp_path), tiny_gpt2(vocab_size=64)
    else:
        cfg, net = tiny_gpt(tmp_path, *FAST), None
    with pytest.raises(UserError, match=r"targets equal the inputs.*copy its input.*train\.loss = \"model\""):
        turbotrain.train(cfg, model=net, train_data=same_tokens("train"))


def test_hf_labels_equal_to_the_inputs_train_with_the_models_own_loss(tmp_path):
    pytest.importorskip("transformers")
    from userpkg.hf_models import tiny_gpt2
    from userpkg.redteam_s24_docs import same_tokens

    summary = turbotrain.train(_cfg(tmp_path, 'train.loss="model"'), model=tiny_gpt2(vocab_size=64),
                               train_data=same_tokens("train"))
    assert summary["steps"] == 2


def test_an_hf_model_configured_to_return_tuples_trains():
    """config.return_dict=False (set by some scripts and saved configs): forward gave a tuple, and gpt2's own head
    failed reading .last_hidden_state from it: 'AttributeError' on the first batch."""
    pytest.importorskip("transformers")
    from userpkg.hf_models import tiny_gpt2

    hf = tiny_gpt2(vocab_size=64)
    hf.config.return_dict = False
    model = adapt(hf)
    x = torch.randint(0, 64, (2, 8))
    assert model(x).shape == (2, 8, 64)
    assert model(x, x).dim() == 0


def test_a_factory_importing_transformers_leaves_no_log_lines(caplog):
    """The CLI's stderr carried torchao's 'Failed to load ...' and torch's pytree warnings (four lines before the
    one error line) when a model.name factory built a transformers model on a machine without torchao's kernels."""
    with caplog.at_level(logging.WARNING):
        model = build_model(ModelConfig(name="userpkg.redteam_s24_docs:noisy_factory"))
    assert isinstance(model, torch.nn.Linear)
    assert not [r for r in caplog.records if r.name in ("torchao", "torch.utils._pytree")], caplog.text


def test_a_forward_taking_labels_after_the_attention_mask_is_one_line_naming_it(tmp_path):
    """forward(input_ids, attention_mask=None, labels=None) under train.loss = "model": the targets went in as the
    attention mask; the message said 'reduce it to one number (.mean())', a fix that trains the wrong thing."""
    from userpkg.redteam_s24_docs import HFStyleForward, shifted_tokens

    with pytest.raises(UserError, match=r"second argument.*forward\(input_ids, attention_mask, labels\) takes as "
                                        r"'attention_mask', not 'labels'"):
        turbotrain.train(_cfg(tmp_path, 'train.loss="model"'), model=HFStyleForward(),
                         train_data=shifted_tokens("train"))


def test_an_hf_model_past_the_hosts_memory_is_refused_before_it_is_built(tmp_path):
    """hf:llama with the config's defaults is 6.7B parameters: it was built for real (27 GB in fp32 on a 20 GB
    machine), where a built-in llama of that size is one line naming its size."""
    pytest.importorskip("transformers")
    from turbotrain.models import estimate_params

    tiny = ModelConfig(name="hf:llama", args={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                              "num_attention_heads": 2, "vocab_size": 64})
    assert estimate_params(tiny) == sum(p.numel() for p in build_model(tiny).parameters())
    cfg = _cfg(tmp_path, 'model.name="hf:llama"', "model.args={hidden_size=131072, num_hidden_layers=1}",
               'data.args={kind="tokens", seq_len=8, vocab_size=64, size=16}')
    with pytest.raises(UserError, match=r"hf:llama with these arguments has ~[\d,]+ parameters.*more than this "):
        turbotrain.train(cfg)


def test_the_package_docstrings_example_imports_every_name_it_calls():
    """`help(turbotrain)`'s example called load(...) having imported only load_config and train: a NameError."""
    import ast

    lines = [ln[4:] for ln in turbotrain.__doc__.splitlines() if ln.startswith("    ")]
    tree = ast.parse("\n".join(lines))
    imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names}
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert called and called <= imported | set(dir(__builtins__)), called - imported
    assert imported <= set(turbotrain.__all__)


def test_the_readmes_preset_list_is_what_turbotrain_presets_prints():
    """The README's list left out llama-8b, which `turbotrain presets` prints (and docs/scale-out.md trains)."""
    import re
    from pathlib import Path

    from turbotrain.config import list_presets

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    listed = text.split("Presets (`turbotrain presets`):", 1)[1].split(". ", 1)[0]
    assert sorted(re.findall(r"`([\w.-]+)`", listed)) == sorted(list_presets())
