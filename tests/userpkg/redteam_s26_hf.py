"""HF red-team fixtures (session 26): tiny HF models a user builds in code and passes to `turbotrain.train(cfg,
model=...)`, sized unlike any `hf:<type>` default so that a rebuild from config.toml cannot fit their weights."""
from __future__ import annotations


def tiny_llama(tied: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                                        tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, pad_token_id=0))


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=50, n_layer=1, n_embd=16, n_head=2, n_positions=32,
                                      bos_token_id=None, eos_token_id=None))


CONFIG_PY = '''from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tinyremote"

    def __init__(self, vocab_size=50, hidden=16, **kw):
        self.vocab_size, self.hidden = vocab_size, hidden
        super().__init__(**kw)
'''

MODELING_PY = '''from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_tiny import TinyConfig


class TinyLM(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.emb = nn.Embedding(config.vocab_size, config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab_size)
        self.post_init()

    def forward(self, input_ids, labels=None, **kw):
        logits = self.head(self.emb(input_ids))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                               labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)
'''


def save_remote_code_model(folder) -> None:
    """A saved HF model of its own modelling code (config.json's auto_map), as a Hub repo with custom code is."""
    import json
    from pathlib import Path

    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "configuration_tiny.py").write_text(CONFIG_PY)
    (folder / "modeling_tiny.py").write_text(MODELING_PY)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "tinyremote", "vocab_size": 50, "hidden": 16, "architectures": ["TinyLM"],
        "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModelForCausalLM": "modeling_tiny.TinyLM"}}))
    cfg = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
    transformers.AutoModelForCausalLM.from_config(cfg, trust_remote_code=True).save_pretrained(folder)


def labelled_rows_ignored(split: str):
    """Classification rows where some items carry label -100 (HF's ignore index), e.g. unlabelled examples."""
    from userpkg.hf_models import Rows
    from userpkg.redteam_s25_hf import labelled_rows

    rows = [dict(r) for r in labelled_rows(split, extra=False)]
    for r in rows[::4]:
        r["label"] = -100
    return Rows(rows, 50)



def classifier_from_lm_config():
    """A classifier built from a causal LM's config, as `GPT2Config.from_pretrained("gpt2")` gives it: the config's
    `architectures` still names the LM class."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    cfg = GPT2Config(vocab_size=50, n_layer=1, n_embd=16, n_head=2, n_positions=32, num_labels=3, pad_token_id=0,
                     architectures=["GPT2LMHeadModel"])
    return GPT2ForSequenceClassification(cfg)
