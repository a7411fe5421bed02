"""Hugging Face `transformers` models as turbotrain models (the optional `hf` extra).

    model.name = "hf:gpt2"          + [model.args] = the HF config's keyword arguments (no download)
    model.name = "hf:/path/to/dir"  a `save_pretrained` directory, weights included ("hf:./dir" for relative)
    a user factory returning a `PreTrainedModel`: wrapped the same way by `models.build_model`

Which head `hf:<model_type>` builds: sequence classification (`AutoModelForSequenceClassification`) when
`num_labels` is given or the data has classes (`num_classes`) and the type has that head (bert, ...); else
the causal LM (`AutoModelForCausalLM`) where the type has one (gpt2, llama, bert as a decoder, ...); else
image classification (vit, ...: num_labels from the data's classes); else sequence classification; else the
bare `AutoModel` (its `last_hidden_state` is the output; no loss of its own). Encoder-decoder (seq2seq)
models are refused: turbotrain's (inputs, targets) items carry no decoder inputs.

`HFModel` adapts an HF model to turbotrain's contract: forward(x) returns a tensor (`.logits`, else
`.last_hidden_state`), forward(x, y) (`train.loss = "model"`) returns HF's own `.loss`, with the targets
passed by keyword as `labels`. Label shifting, decided so the math equals `cross_entropy` on turbotrain's
targets: turbotrain's token targets are already aligned with the outputs (y[t] is the token after x[t]), so
a causal LM gets them as `shift_labels` too, and HF does not shift them again. Targets equal to the inputs
(HF's own convention: `labels = input_ids`, e.g. dict data) are passed as plain `labels` and HF shifts
them, padding (-100 in labels) included. The choice is made once, on the first forward (the contract
check), never per step. A bidirectional model (bert) gets the attention mask of its padding, derived from the
inputs as its tokenizer's mask would be (the config's pad_token_id at a row's ends), else every token attends to
the pads; a causal LM needs none (padding on the right, -100 in its labels).
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from turbotrain.errors import UserError
from turbotrain.files import path_arg
from turbotrain.log import say

PREFIX = "hf:"


def require_transformers(what: str):
    """The `transformers` module, or one UserError saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise UserError(f"{what} needs the Hugging Face transformers package: pip install 'turbotrain[hf]' "
                        f"(or pip install transformers)") from None
    return transformers


@contextlib.contextmanager
def quiet_torchao_import():
    """torchao's import logs a warning for each native kernel library this machine cannot load (a CPU-only or
    other-GPU build) and torch one for each Enum torchao registers: lines on stderr around turbotrain's own,
    none the user can act on. transformers imports torchao with its model classes when it is installed.
    What transformers logs meanwhile, and Python warnings (a config's token ids past its vocabulary, a
    deprecated call in a factory), are said on stdout: stderr holds a failing run's one error line alone."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with _said_on_stdout():
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class _Say(logging.Handler):
    def __init__(self, said: list):
        super().__init__(logging.WARNING)
        self.said = said

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())


class _Held(list):
    """The transformers logger's handler list meanwhile: the stderr handler transformers adds on its first log
    call (addHandler appends) is held back until the block ends."""
    def __init__(self, handlers: list):
        super().__init__(handlers)
        self.added: list = []

    def append(self, handler) -> None:
        self.added.append(handler)


@contextlib.contextmanager
def _said_on_stdout():
    """transformers' log records (its handler writes to stderr) and Python warnings, said as `model: ...` lines
    once the block ends, each once."""
    import warnings

    lib, said = logging.getLogger("transformers"), []
    held = _Held([_Say(said)])
    handlers, lib.handlers = lib.handlers, held
    try:
        with warnings.catch_warnings(record=True) as caught:
            yield
    finally:
        lib.handlers = handlers + held.added
        said += [f"{w.category.__name__}: {w.message}" for w in caught]
        for text in dict.fromkeys(" ".join(str(t).split())[:300] for t in said):
            say(f"model: {text}")


def _import_model_classes() -> None:
    """transformers' model classes (they import torchao, when installed), once, without its log lines."""
    with quiet_torchao_import():
        importlib.import_module("transformers.modeling_utils")


def is_hf_name(name: str) -> bool:
    return name.startswith(PREFIX)


def hf_target(name: str) -> tuple[str, Path | None]:
    """("gpt2", None) for `hf:gpt2`; ("", path) for a saved directory (a name with "/" or a leading "." or "~")."""
    rest = name[len(PREFIX):]
    if "/" in rest or rest.startswith((".", "~")) or os.sep in rest:
        return "", path_arg("model.name", rest)
    return rest, None


def check_name(name: str) -> None:
    """Config-time check of `model.name = "hf:..."` (no import of transformers)."""
    model_type, path = hf_target(name)
    if path is None and not model_type.replace("_", "").replace("-", "").isalnum():
        raise UserError(f"model.name = {name!r}: expected 'hf:<model_type>' (e.g. 'hf:gpt2') "
                        "or 'hf:/path/to/saved/dir'")


def head_of(model_type: str, args: dict | None = None) -> str:
    """Which Auto class `hf:<model_type>` builds with `args`: "causal_lm" | "sequence_classification" |
    "image_classification" | "base" (see the module docstring)."""
    from transformers.models.auto import modeling_auto as ma

    seq = model_type in ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES
    if seq and "num_labels" in (args or {}):  # a classifier asked for: bert is a causal LM type too
        return "sequence_classification"
    if model_type in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "causal_lm"
    if model_type in ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
        return "image_classification"
    return "sequence_classification" if seq else "base"


def data_args(name: str, meta: dict, given: dict) -> dict:
    """Data-derived HF config arguments for `hf:<model_type>`: vocab_size from token data, num_labels from the
    data's classes where the type has a classifier head (which then builds it), num_channels from images'
    channels. A saved directory takes nothing from the data."""
    model_type, path = hf_target(name)
    if path is not None:
        return {}
    require_transformers(f"model.name = {name!r}")
    from transformers.models.auto import modeling_auto as ma

    out = {}
    classifier = model_type in ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES \
        or model_type in ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES
    if classifier and "num_classes" in meta and "num_labels" not in given:
        out["num_labels"] = meta["num_classes"]
    head = head_of(model_type, {**given, **out})
    if "vocab_size" in meta and "vocab_size" not in given and head != "image_classification":
        out["vocab_size"] = meta["vocab_size"]
    if head == "image_classification" and "in_channels" in meta and "num_channels" not in given:
        out["num_channels"] = meta["in_channels"]
    return out


def _config(model_type: str, args: dict):
    transformers = require_transformers(f"model.name = 'hf:{model_type}'")
    try:
        default = transformers.AutoConfig.for_model(model_type)
    except (ValueError, KeyError):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        base = max((t for t in CONFIG_MAPPING_NAMES if model_type.startswith(f"{t}-")), key=len, default=None)
        hint = (f"; {model_type!r} looks like a checkpoint's name: 'hf:{base}' builds that architecture from "
                f"model.args with random weights, and pretrained weights load from a folder saved with "
                f"from_pretrained({model_type!r}).save_pretrained('dir'), as 'hf:./dir'" if base else
                _type_hint(model_type, CONFIG_MAPPING_NAMES))
        raise UserError(f"model.name = 'hf:{model_type}': transformers {transformers.__version__} knows no model "
                        f"type {model_type!r}; use a type such as gpt2, llama, bert (AutoConfig model_type){hint}") \
            from None
    dtype = next((k for k in ("dtype", "torch_dtype") if k in args), None)
    if dtype:  # from_config would build the weights in it: half-precision weights under any precision.dtype
        raise UserError(f"model.args.{dtype} = {args[dtype]!r}: turbotrain keeps the weights in float32 and computes "
                        f"in precision.dtype; remove model.args.{dtype} and set precision.dtype (e.g. \"bf16\")")
    known = set(default.to_dict()) | set(getattr(default, "attribute_map", {})) | {"num_labels"}
    unknown = sorted(k for k in args if k not in known)
    if unknown:  # HF configs take any keyword silently: a typo (n_layers) would train the default model
        raise UserError(f"model.args.{unknown[0]}: not a field of {type(default).__name__}; valid model.args: "
                        f"{', '.join(sorted(k for k in default.to_dict() if not k.startswith('_'))[:40])}, ...")
    sizes = [k for k, v in args.items() if isinstance(v, int) and not isinstance(v, bool) and v < 1
             and isinstance(getattr(default, k, None), int) and getattr(default, k) >= 1
             and (k.startswith(("n_", "num_")) or k.endswith(("_size", "_layers", "_heads", "positions", "_dim")))]
    if sizes:  # e.g. n_layer = -1 builds a model with no blocks, silently
        raise UserError(f"model.args.{sizes[0]} = {args[sizes[0]]}: must be an integer >= 1")
    vocab, special = args.get("vocab_size"), {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # defaults past a small data vocabulary: none
        tok = getattr(default, key, None)
        if key not in args and isinstance(tok, int) and isinstance(vocab, int) and tok >= vocab:
            special[key] = None
    special.update(_head_args(model_type, args, default, special))
    return transformers.AutoConfig.for_model(model_type, **args, **special)


def _type_hint(model_type: str, known) -> str:
    """'; did you mean 'hf:gpt2'?' for a model type spelled otherwise (GPT2, gpt-2, Llama, gtp2), else ''."""
    import difflib

    def plain(t: str) -> str:
        return t.lower().replace("-", "").replace("_", "")

    same = [t for t in known if plain(t) == plain(model_type)]
    close = same or difflib.get_close_matches(model_type.lower(), list(known), n=1, cutoff=0.75)
    return f"; did you mean 'hf:{close[0]}'?" if close else ""


def _head_args(model_type: str, args: dict, default, special: dict) -> dict:
    """What the head built for `args` needs of the config: bert & co. as an LM are made causal (bidirectional
    attention would see the token to predict); a decoder as a classifier needs its pad id."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    head = head_of(model_type, args)
    encoder = default.to_dict().get("is_decoder") is False  # bert & co.; decoders' configs have no is_decoder
    if head == "causal_lm" and encoder and "is_decoder" not in args:
        return {"is_decoder": True}
    pad = args.get("pad_token_id", special.get("pad_token_id", getattr(default, "pad_token_id", None)))
    if head == "sequence_classification" and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not encoder \
            and pad is None:
        raise UserError(f"model.name = 'hf:{model_type}' as a classifier reads each item's last token before "
                        f"model.args.pad_token_id, which is not set: set it to the id the data pads with")
    return {}


def build_hf(name: str, args: dict) -> nn.Module:
    """`build_hf("hf:gpt2", {"n_layer": 2, ...})` or `build_hf("hf:/dir", {})` → `HFModel`, on the CPU."""
    transformers = require_transformers(f"model.name = {name!r}")
    _import_model_classes()
    model_type, path = hf_target(name)
    if path is not None:
        if not (path / "config.json").is_file():
            rest = name[len(PREFIX):]
            hub = not path.exists() and rest.count("/") == 1 and not rest.startswith((".", "/", "~"))
            why = (f"no such folder, and turbotrain downloads nothing: save the Hub model {rest!r} first, "
                   f"AutoModelForCausalLM.from_pretrained({rest!r}).save_pretrained('dir'), then use 'hf:./dir'"
                   if hub else "save one with model.save_pretrained(dir) or `turbotrain export RUN --format hf`")
            raise UserError(f"model.name = {name!r}: {path} is not a saved HF model directory (no config.json); {why}")
        _check_remote_code(name, path, args)
        cfg = _hf_call(name, "its config.json", transformers.AutoConfig.from_pretrained, path, **args)
        auto = _auto_class(transformers, head_of(cfg.model_type, args), cfg)
        remote = {"trust_remote_code": True} if args.get("trust_remote_code") is True else {}
        if auto is transformers.AutoModelForCausalLM and getattr(cfg, "is_decoder", None) is False:
            cfg.is_decoder = True  # a saved bert (ForMaskedLM) as an LM: causal attention, as for hf:bert
        saved = getattr(cfg, "dtype", None)
        if saved not in (None, torch.float32, "float32"):  # hub checkpoints, mostly bf16: AdamW on bf16 loses updates
            say(f"model: {path} is saved in {str(saved).removeprefix('torch.')}; its weights are loaded in float32 "
                f"and computed in precision.dtype")
        major, minor = (int(v) for v in transformers.__version__.split(".")[:2])
        as_fp32 = {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": torch.float32}  # renamed in 4.56
        return HFModel(_hf_call(name, "its weights", auto.from_pretrained, path, config=cfg, **as_fp32, **remote))
    cfg = _hf_call(name, "model.args", _config, model_type, args)
    auto = _auto_class(transformers, head_of(model_type, args), cfg)
    return HFModel(_hf_call(name, "model.args", auto.from_config, cfg))


def _check_remote_code(name: str, path: Path, args: dict) -> None:
    """A saved folder whose config.json maps the Auto classes to its own Python files (auto_map) runs that code
    only on the user's word, model.args.trust_remote_code = true; transformers' own refusal says to save it again."""
    import json

    try:
        auto_map = json.loads((path / "config.json").read_text(encoding="utf-8")).get("auto_map")
    except (OSError, ValueError, AttributeError):
        return  # transformers says what is wrong with the file
    flag = args.get("trust_remote_code")
    if flag is not None and not isinstance(flag, bool):
        raise UserError(f"model.args.trust_remote_code = {flag!r}: expected true or false")
    if auto_map and flag is not True:
        files = sorted({str(v).split(".")[0] + ".py" for v in auto_map.values() if isinstance(v, str)})
        raise UserError(f"model.name = {name!r}: {path} holds its own modelling code ({', '.join(files)}, named by "
                        f"config.json's auto_map), which runs only if you trust it: read it, then set "
                        f"model.args.trust_remote_code = true")


def estimate_params(name: str, args: dict) -> int | None:
    """`hf:<model_type>`'s parameter count, built on the meta device (nothing allocated): hf:llama's defaults are
    a 7B model, which built for real would swap the machine to a halt. None for a saved directory, and for
    arguments that build_hf refuses with its own message."""
    if hf_target(name)[1] is not None:
        return None
    try:
        with torch.device("meta"):
            return sum(p.numel() for p in build_hf(name, args).parameters())
    except UserError:
        return None


def _hf_call(name: str, what: str, fn, *args, **kwargs):
    """transformers refusing a config or a saved directory (bad JSON, missing weights, a value of the wrong
    type, sizes that do not divide) is one UserError naming model.name and what it refused."""
    try:
        return fn(*args, **kwargs)
    except (UserError, torch.OutOfMemoryError, MemoryError):
        raise
    except Exception as e:  # OSError, ValueError, TypeError, its own validation errors
        text = " ".join(str(e).split())[:240] or type(e).__name__
        fix = "fix model.args" if what == "model.args" else "save the model again with save_pretrained(dir)"
        raise UserError(f"model.name = {name!r}: transformers refused {what}: {type(e).__name__}: {text}; {fix}") \
            from None


def _auto_class(transformers, head: str, cfg):
    arch = (getattr(cfg, "architectures", None) or [""])[0]
    auto_map = getattr(cfg, "auto_map", None) or {}
    if auto_map and head == "base":  # a model type of its own code: the head its auto_map offers
        for auto in ("AutoModelForCausalLM", "AutoModelForSequenceClassification", "AutoModelForImageClassification"):
            if auto in auto_map:
                return getattr(transformers, auto)
    if arch.endswith("ForSequenceClassification"):  # a saved classifier keeps its head
        return transformers.AutoModelForSequenceClassification
    if arch.endswith("ForImageClassification"):
        return transformers.AutoModelForImageClassification
    return {"causal_lm": transformers.AutoModelForCausalLM,
            "sequence_classification": transformers.AutoModelForSequenceClassification,
            "image_classification": transformers.AutoModelForImageClassification}.get(
                head, transformers.AutoModel)


def is_hf_model(model: Any) -> bool:
    """A `transformers.PreTrainedModel` (checked without importing transformers when it is not loaded)."""
    import sys

    if "transformers" not in sys.modules:
        return False
    return isinstance(model, sys.modules["transformers"].PreTrainedModel)


class HFModel(nn.Module):
    """An HF model under turbotrain's contract (see the module docstring). `.hf` is the HF model itself:
    `turbotrain.load(run).hf.save_pretrained(dir)`, `.generate(...)`."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        if getattr(hf.config, "is_encoder_decoder", False):  # forward(x) alone has no decoder inputs to run
            raise UserError(f"{type(hf).__name__} is an encoder-decoder (seq2seq) model, which turbotrain does not "
                            f"train: its (inputs, targets) items carry no decoder inputs; use a decoder-only "
                            f"causal LM (hf:gpt2, hf:llama) or an encoder classifier (hf:bert with num_labels)")
        _check_pad_for_classifier(hf)
        self.hf = _float32(hf)
        if hasattr(hf.config, "use_cache"):
            hf.config.use_cache = False  # training: a KV cache is memory for nothing (and clashes with act-ckpt)
        # .logits / .loss are read by name; a config with return_dict=False gives tuples, through which some
        # transformers models (gpt2) cannot even run their own head
        hf.config.return_dict = True
        self.input_name = getattr(hf, "main_input_name", "input_ids")
        self.causal = type(hf).__name__ in _causal_names()
        if self.causal:
            hf.loss_type = "ForCausalLM"  # HF warns on every model whose config names no loss type
        self.targets_are_inputs: bool | None = None  # decided on the first forward(x, y); see the docstring
        self.pad_id = None if self.causal else _mask_pad_id(hf)

    @property
    def vocab_size(self) -> int | None:
        """Checked against the data's token ids before the first forward (contract.py)."""
        v = getattr(self.hf.config, "vocab_size", None)
        return v if self.input_name == "input_ids" and isinstance(v, int) else None

    @property
    def blocks(self) -> nn.Module | None:
        """The repeated blocks (act-ckpt, per-block compile, FSDP2 units): the longest ModuleList inside."""
        lists = [m for m in self.hf.modules() if isinstance(m, nn.ModuleList) and len(m) > 1]
        return max(lists, key=len, default=None)

    def inputs(self, x: torch.Tensor) -> dict:
        """The keyword arguments of the HF forward for inputs `x`: a bidirectional model (bert) gets the
        attention mask of its padding, as its tokenizer would give it, else every token attends to the pads."""
        kwargs = {self.input_name: x}
        # on the meta device (the FLOP count of a meta-init model) HF's mask code reads values: none to read
        if self.pad_id is not None and not x.is_floating_point() and not x.is_meta:
            kwargs["attention_mask"] = padding_mask(x, self.pad_id)
        return kwargs

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        if y is None:
            out = self.hf(**self.inputs(x))
            logits = getattr(out, "logits", None)
            return logits if logits is not None else out.last_hidden_state
        y = y.contiguous()  # HF flattens labels with .view; token windows' targets are a strided slice
        kwargs = {**self.inputs(x), "labels": y}
        if self.causal:
            if self.targets_are_inputs is None:  # once, at the contract check: a host sync is fine there
                self.targets_are_inputs = labels_are_inputs(x, y)
            if not self.targets_are_inputs:
                kwargs["shift_labels"] = y  # already aligned with the outputs: no second shift
        loss = self.hf(**kwargs).loss
        if loss is None:
            raise UserError(f"{type(self.hf).__name__} computes no loss of its own (a bare AutoModel); set "
                            f"train.loss = \"cross_entropy\" or \"mse\", or use a model type with a head")
        return loss


def _check_pad_for_classifier(hf: nn.Module) -> None:
    """A decoder's classification head (GPT2ForSequenceClassification) reads each row's last token before the
    config's pad_token_id; without one HF fails every batch of more than one row (as hf:<type> is refused)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cfg = hf.config
    if type(hf).__name__.endswith("ForSequenceClassification") and cfg.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES \
            and cfg.to_dict().get("is_decoder") is not False and getattr(cfg, "pad_token_id", None) is None:
        raise UserError(f"{type(hf).__name__} reads each row's last token before config.pad_token_id, which is not "
                        f"set: set model.config.pad_token_id to the id the data pads with (tokenizer.pad_token_id)")


def _float32(hf: nn.Module) -> nn.Module:
    """An HF model given in half precision (`.half()`, `dtype=torch.bfloat16`), in float32, as hf:/dir loads one:
    AdamW's steps on fp16/bf16 weights are lost or overflow (eps 1e-8 is 0 in fp16: inf at the second step);
    precision.dtype runs the matmuls in half precision."""
    half = next((p.dtype for p in hf.parameters() if p.dtype in (torch.float16, torch.bfloat16)), None)
    if half is not None:
        say(f"model: {type(hf).__name__} came in {str(half).removeprefix('torch.')}; turbotrain trains its weights "
            f"in float32 and computes in precision.dtype")
        hf.float()
    return hf


def _mask_pad_id(hf: nn.Module) -> int | None:
    """The pad id whose runs at a row's ends a bidirectional model's attention mask leaves out: its config's
    pad_token_id, where its forward takes an attention_mask over input_ids; else None (nothing masked)."""
    pad = getattr(hf.config, "pad_token_id", None)
    if isinstance(pad, bool) or not isinstance(pad, int) or getattr(hf, "main_input_name", "input_ids") != "input_ids":
        return None
    try:
        takes = "attention_mask" in inspect.signature(hf.forward).parameters
    except (TypeError, ValueError):
        return None
    return pad if takes else None


def padding_mask(x: torch.Tensor, pad: int) -> torch.Tensor:
    """1 at real tokens, 0 at the padding: the run of `pad` ids at a row's end (padding side right) or start
    (left). A pad id between real tokens is a token of the text, as a tokenizer's mask has it."""
    is_pad = (x == pad).long()
    right = is_pad.flip(-1).cumprod(-1).flip(-1)
    left = is_pad.cumprod(-1)
    return 1 - (right | left)


def labels_are_inputs(x: torch.Tensor, y: torch.Tensor) -> bool:
    """HF's causal-LM labels: the inputs themselves, -100 (ignored by the loss) at padding; the model shifts
    them. Targets already aligned with the outputs (y[t] = x[t + 1]) differ from x at real tokens."""
    if y.shape != x.shape or x.is_floating_point():
        return False
    real = y != -100
    return bool(real.any() and torch.equal(y[real], x[real]))


def _causal_names() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return {v for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() if isinstance(v, str)}
