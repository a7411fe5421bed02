"""Built-in datasets. Each is a data factory `build(split, **args) -> Dataset` of `(inputs, targets)`,
the same contract as a user's `pkg.module:factory`.

The built-ins are in-memory `TensorDataset`s that gather a whole batch from an index tensor in one op
(`gather`). That lets the loader skip per-item Python and, on a GPU, keep the whole dataset in device
memory (`data.device_resident`), so feeding a step costs one index op and no host→device copy.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from turbotrain.contract import choice_arg, float_arg, int_arg
from turbotrain.data.fetch import checksums, fetch, file_sha256, read_idx, record_checksums, write_atomic
from turbotrain.errors import UserError
from turbotrain.log import say, say_once
from turbotrain.plugins import call_user


class TensorDataset(Dataset):
    """Samples stored as tensors; `gather(idx)` returns a batch, `to(device)` moves the storage."""

    def __len__(self) -> int:
        raise NotImplementedError

    def gather(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def to(self, device: torch.device) -> "TensorDataset":
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        raise NotImplementedError

    def __getitem__(self, i: int):
        x, y = self.gather(torch.tensor([i]))
        return x[0], y[0]

    def __getitems__(self, indices: list[int]):  # the DataLoader's batched fetch: one gather per batch
        return self.gather(torch.as_tensor(indices))


class Pairs(TensorDataset):
    """Inputs and targets indexed together (images/vectors with labels or regression targets)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, **meta):
        self.inputs, self.targets, self.meta = inputs, targets, meta
        for k, v in meta.items():
            setattr(self, k, v)

    def __len__(self) -> int:
        return len(self.inputs)

    def gather(self, idx):
        idx = idx.to(self.inputs.device)
        return self.inputs[idx], self.targets[idx]

    def to(self, device):
        return Pairs(self.inputs.to(device), self.targets.to(device), **self.meta)

    @property
    def nbytes(self):
        return self.inputs.nbytes + self.targets.nbytes


class TokenWindows(TensorDataset):
    """Next-token prediction over a token stream: sample i is the window starting at i·stride,
    inputs tokens[s : s+T], targets tokens[s+1 : s+T+1]."""

    def __init__(self, tokens: torch.Tensor, block_size: int, stride: int | None = None, vocab_size: int = 256):
        if len(tokens) < block_size + 1:  # a window takes block_size + 1 tokens (its targets are shifted by one)
            raise UserError(f"data: {len(tokens)} tokens are too few for block_size {block_size}")
        self.tokens, self.block_size, self.vocab_size = tokens, block_size, vocab_size
        self.stride = stride or block_size
        self._offsets = torch.arange(block_size + 1, device=tokens.device)

    def __len__(self) -> int:
        return (len(self.tokens) - self.block_size - 1) // self.stride + 1

    def gather(self, idx):
        idx = idx.to(self.tokens.device)
        win = self.tokens[(idx * self.stride)[:, None] + self._offsets].long()
        return win[:, :-1], win[:, 1:]

    def to(self, device):
        return TokenWindows(self.tokens.to(device), self.block_size, self.stride, self.vocab_size)

    @property
    def nbytes(self):
        return self.tokens.nbytes


def _tokenize(text: bytes, kind: str) -> tuple[np.ndarray, list[int]]:
    """Char-level: ids into the sorted characters present; byte-level: the bytes themselves (vocab 256)."""
    raw = np.frombuffer(text, dtype=np.uint8)
    if kind == "byte":
        return raw.copy(), list(range(256))
    vocab = np.flatnonzero(np.bincount(raw, minlength=256))
    table = np.zeros(256, dtype=np.uint8)
    table[vocab] = np.arange(len(vocab), dtype=np.uint8)
    return table[raw], vocab.tolist()


def _shakespeare_tokens(root: Path, kind: str) -> tuple[np.ndarray, int]:
    """The token ids (memory-mapped when the cached file verifies) and the vocabulary size.

    `{kind}.bin` / `{kind}.json` are derived from the verified shakespeare.txt and checked against the
    checksums in meta.json; missing, corrupt or unrecorded (a cache from before checksums) files are
    derived again (~0.1 s) and recorded; a read-only cache gets them in memory for this run."""
    names = (f"{kind}.bin", f"{kind}.json")
    sums = checksums(root)
    if all(sums.get(n) and (root / n).is_file() for n in names):
        bad = [n for n in names if file_sha256(root / n) != sums[n]]
        if not bad:
            vocab = json.loads((root / names[1]).read_text())["vocab"]
            return np.memmap(root / names[0], dtype=np.uint8, mode="r"), len(vocab)
        say(f"warning: data shakespeare: {root / bad[0]} does not match its recorded sha256; tokenising again "
            f"from the verified shakespeare.txt")
    ids, vocab = _tokenize((root / "shakespeare.txt").read_bytes(), kind)
    meta = json.dumps({"vocab": [chr(c) for c in vocab], "tokens": int(len(ids))}).encode()
    try:
        write_atomic(root / names[0], ids.tobytes())
        write_atomic(root / names[1], meta)
        written = record_checksums(root, {names[0]: hashlib.sha256(ids.tobytes()).hexdigest(),
                                          names[1]: hashlib.sha256(meta).hexdigest()})
    except OSError:
        written = False
    if not written and not all((root / n).is_file() for n in names):
        say(f"data shakespeare: the cache {root} is not writable; tokenised in memory for this run")
    return ids, len(vocab)


def shakespeare(split: str, block_size: int = 256, tokens: str = "char", val_fraction: float = 0.1,
                stride: int | None = None) -> TokenWindows:
    """Shakespeare's works as char- (vocab of the characters present) or byte-level (vocab 256) tokens,
    memory-mapped uint8; the last `val_fraction` of the text is the validation split."""
    check_window_args(block_size, val_fraction, stride)
    if tokens not in ("char", "byte"):
        raise UserError(f"data.args.tokens = {tokens!r}: expected 'char' or 'byte'")
    data, vocab_size = _shakespeare_tokens(fetch("shakespeare"), tokens)
    return split_windows(np.array(data), vocab_size, split, block_size, val_fraction, stride, "adjust val_fraction")


def check_window_args(block_size: int, val_fraction: float, stride: int | None) -> None:
    int_arg("data.args.block_size", block_size, 1)
    float_arg("data.args.val_fraction", val_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
    if stride is not None:
        int_arg("data.args.stride", stride, 1)
        if stride > block_size:  # a window predicts tokens s+1..s+block_size: the next stride - block_size go unseen
            say_once(f"warning: data.args.stride = {stride} > data.args.block_size = {block_size}: "
                     f"{stride - block_size} of every {stride} tokens are never a target, so never trained on; "
                     f"set stride <= block_size "
                     f"(or leave it out: it defaults to block_size)")


def split_windows(ids: np.ndarray, vocab_size: int, split: str, block_size: int, val_fraction: float,
                  stride: int | None, fix: str, where: str = "") -> TokenWindows:
    """Token windows over the train part (the first 1 - val_fraction of the stream) or the val part."""
    cut = int(len(ids) * (1 - val_fraction))
    part = ids[:cut] if split == "train" else ids[cut:]
    if len(part) < block_size + 1:
        which = "train" if split == "train" else "validation"
        raise UserError(f"data.args.block_size = {block_size}: the {which} split{where} has only {len(part)} tokens "
                        f"(data.args.val_fraction = {val_fraction}); lower block_size or {fix}")
    return TokenWindows(torch.from_numpy(part), block_size, stride, vocab_size)


FASHION_MEAN, FASHION_STD = 0.2860, 0.3530


def fashion_mnist(split: str) -> Pairs:
    """Fashion-MNIST, normalized float images (N, 1, 28, 28) and int64 labels; split "val" is the test set."""
    root = fetch("fashion_mnist")
    prefix = "train" if split == "train" else "t10k"
    img_path, lab_path = root / f"{prefix}-images-idx3-ubyte.gz", root / f"{prefix}-labels-idx1-ubyte.gz"
    images, labels = read_idx(img_path), read_idx(lab_path)
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.ndim != 1 or len(labels) != len(images) \
            or (len(labels) and labels.max() >= 10):
        raise UserError(f"data fashion_mnist: {img_path.name} {list(images.shape)} / {lab_path.name} "
                        f"{list(labels.shape)} are not 28x28 images with labels 0-9; delete {root} and run "
                        f"`turbotrain data fetch fashion_mnist`, "
                        f"or set TURBOTRAIN_CACHE to a folder holding a good copy")
    x = (torch.from_numpy(images.copy()).float().div_(255).sub_(FASHION_MEAN).div_(FASHION_STD)).unsqueeze(1)
    return Pairs(x, torch.from_numpy(labels.astype(np.int64)), num_classes=10, in_channels=1)


SYNTHETIC_ARGS = {"tokens": {"seq_len": 1024, "vocab_size": 50304},  # each kind's own args, with their defaults
                  "images": {"shape": (3, 224, 224), "num_classes": 1000},
                  "vectors": {"in_features": 1024, "num_classes": 1000}}
MAX_SEED = 2**62  # the val split seeds with seed + 1; torch's generator takes at most 2**64 - 1


def synthetic(split: str, kind: str = "tokens", size: int = 1024, seed: int = 1234, **kind_args) -> TensorDataset:
    """Random data for throughput work (reports mark it synthetic): `size` distinct samples of tokens (LM windows:
    seq_len, vocab_size), images (shape [C, H, W], num_classes) with labels, or vectors (in_features,
    num_classes) with labels."""
    choice_arg("data.args.kind", kind, tuple(SYNTHETIC_ARGS))
    int_arg("data.args.size", size, 1)
    int_arg("data.args.seed", seed, 0, MAX_SEED)
    known = {k for args in SYNTHETIC_ARGS.values() for k in args}
    unknown = [k for k in kind_args if k not in known]
    if unknown:
        raise UserError(f"data.args: the synthetic data takes no argument {unknown[0]!r}; valid data.args: kind, "
                        f"size, seed, {', '.join(sorted(known))}")
    unused = [k for k in kind_args if k not in SYNTHETIC_ARGS[kind]]
    if unused:  # a preset's args for another kind, or a typo of kind: said, as they shape nothing
        say_once(f"warning: data.args.{' and data.args.'.join(unused)} not used: data.args.kind = {kind!r} takes "
            f"{', '.join(SYNTHETIC_ARGS[kind])}")
    a = {**SYNTHETIC_ARGS[kind], **{k: v for k, v in kind_args.items() if k in SYNTHETIC_ARGS[kind]}}
    if "num_classes" in a:
        int_arg("data.args.num_classes", a["num_classes"], 1)
    g = torch.Generator().manual_seed(seed + (0 if split == "train" else 1))
    if kind == "tokens":
        int_arg("data.args.seq_len", a["seq_len"], 1)
        int_arg("data.args.vocab_size", a["vocab_size"], 1, 2**31 - 1)
        _fits_host("size x seq_len int32 tokens", "seq_len", 4 * (size * a["seq_len"] + 1))
        toks = torch.randint(0, a["vocab_size"], (size * a["seq_len"] + 1,), generator=g, dtype=torch.int32)
        return TokenWindows(toks, a["seq_len"], a["seq_len"], a["vocab_size"])
    if kind == "images":
        shape = a["shape"]
        if not isinstance(shape, (list, tuple)) or len(shape) != 3 \
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
            raise UserError(f"data.args.shape = {shape!r}: expected [channels, height, width], three integers >= 1")
        _fits_host("size x channels x height x width floats", "shape", 4 * size * math.prod(shape))
        x = torch.randn((size, *shape), generator=g)
        return Pairs(x, torch.randint(0, a["num_classes"], (size,), generator=g), num_classes=a["num_classes"],
                     in_channels=shape[0])
    int_arg("data.args.in_features", a["in_features"], 1)
    _fits_host("size x in_features floats", "in_features", 4 * size * a["in_features"])
    x = torch.randn((size, a["in_features"]), generator=g)
    return Pairs(x, torch.randint(0, a["num_classes"], (size,), generator=g), num_classes=a["num_classes"],
                 in_features=a["in_features"])


def host_memory_bytes() -> int | None:
    """This host's physical memory; None where it cannot be read (not a POSIX host: torch's own error stands)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _fits_host(what: str, arg: str, nbytes: int) -> None:
    """The synthetic data is made in host memory at once: more than the host holds is refused before torch tries
    (it would fail naming an allocation, overflow its int64 sizes, or end in the out-of-memory killer's SIGKILL
    without a word). Each split may take half the host: the val split is made as large again."""
    total = host_memory_bytes()
    if total is not None and nbytes > total // 2:
        raise UserError(f"data.args: synthetic data of {what} takes {nbytes / 2**30:,.1f} GiB a split, more than this "
                        f"host's {total / 2**30:,.0f} GiB of memory holds (half of it a split, as the val split is as "
                        f"large); lower data.args.size or data.args.{arg}")


# ---------------------------------------------------------------- dict items (HF `datasets` rows and the like)

INPUT_KEYS = ("input_ids", "pixel_values", "inputs")
TARGET_KEYS = ("labels", "label", "targets")


def dict_item_keys(item: dict, who: str = "data", index: int = 0) -> tuple[str, str]:
    """The (inputs key, targets key) of a dict item: one of INPUT_KEYS and one of TARGET_KEYS; other keys
    (attention_mask, token_type_ids, text, ...) are left out. One UserError naming the keys otherwise."""
    ins, tgts = [k for k in INPUT_KEYS if k in item], [k for k in TARGET_KEYS if k in item]
    if len(ins) != 1 or len(tgts) != 1:
        what, found = ("inputs", ins) if len(ins) != 1 else ("targets", tgts)
        raise UserError(f"{who}: item {index} is a dict with keys {list(item)[:8]}; dict items map to (inputs, "
                        f"targets) by exactly one of {'/'.join(INPUT_KEYS)} and one of {'/'.join(TARGET_KEYS)}, and "
                        f"its {what} keys are {' and '.join(found) if found else 'none of them'}: rename or drop "
                        f"columns so exactly one is left")
    return ins[0], tgts[0]


class DictItems(Dataset):
    """A dataset of dict items seen as (inputs, targets) pairs through `dict_item_keys`; lists and numbers
    become tensors. The data-derived model arguments of the wrapped dataset (vocab_size, ...) stay visible."""

    META = ("vocab_size", "block_size", "num_classes", "in_channels", "in_features")

    def __init__(self, ds: Dataset, keys: tuple[str, str], who: str = "data"):
        self.ds, self.keys, self.who = ds, keys, who
        for k in self.META:
            if getattr(ds, k, None) is not None:
                setattr(self, k, getattr(ds, k))
        features = getattr(ds, "features", None)
        label = features.get(keys[1]) if isinstance(features, dict) else None
        if getattr(self, "num_classes", None) is None and isinstance(getattr(label, "num_classes", None), int):
            self.num_classes = label.num_classes  # an HF `datasets` ClassLabel column: the classifier's size

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        item = self.ds[i]
        missing = [k for k in self.keys if not isinstance(item, Mapping) or k not in item]
        if missing:  # items must keep the first item's keys: the mapping was decided on it
            raise UserError(f"{self.who}: item {i}: KeyError {missing[0]!r} (it is {type(item).__name__}"
                            f"{' with keys ' + str(list(item)[:8]) if isinstance(item, Mapping) else ''}); every dict "
                            f"item needs the first item's keys {self.keys[0]!r} and {self.keys[1]!r}")
        return tuple(self._tensor(item[k], i, k) for k in self.keys)

    def _tensor(self, v, i: int, key: str) -> torch.Tensor:
        if isinstance(v, torch.Tensor):
            return v
        try:
            a = np.asarray(v)
            if a.dtype.kind in "biuf":
                return torch.as_tensor(a)
        except (ValueError, TypeError):  # lists of different lengths inside one item
            pass
        shown = " ".join(repr(v).split())[:60]
        if isinstance(v, str):
            fix = (f"encode string labels as class ids (HF datasets: ds.class_encode_column({key!r}))"
                   if key in TARGET_KEYS else "tokenize the text to ids")
        elif isinstance(v, (list, tuple)) and any(e is None for e in v):  # a tokenizer without a pad token pads so
            fix = ("it is padded with None, the pad id of a tokenizer without a pad token: set tokenizer.pad_token "
                   "(e.g. = tokenizer.eos_token) before tokenizing")
        else:
            fix = "give it numbers, lists of them padded to one length (-100 in labels)"
        raise UserError(f"{self.who}: item {i}'s {key!r} is {type(v).__name__} {shown}, not numbers of one shape; "
                        f"{fix}")


def _has_a_zero(v, nonzero: bool = False) -> bool:
    """Whether the numbers of `v` hold a zero (or with `nonzero`, a value that is not zero)."""
    if v is None:
        return False
    try:
        a = np.asarray(v.cpu() if isinstance(v, torch.Tensor) else v)
    except (ValueError, TypeError):
        return False
    return a.dtype.kind in "biuf" and a.size > 0 and bool(a.any() if nonzero else not a.all())


def _say_mask(mask, ids, who: str) -> None:
    """turbotrain passes the inputs alone: an HF bidirectional model (bert) derives its attention mask from its
    config's pad_token_id at the row ends (models.hf.padding_mask); say which id the data pads with, or that
    its mask cannot be derived so (a causal LM with padding on the right and -100 in its labels needs none)."""
    if not _has_a_zero(mask):
        return
    from turbotrain.models.hf import padding_mask

    try:
        m, x = (torch.as_tensor(np.asarray(v.cpu() if isinstance(v, torch.Tensor) else v)) for v in (mask, ids))
        pads = x[m == 0].unique() if m.shape == x.shape and not x.is_floating_point() else None
    except (ValueError, TypeError, RuntimeError):
        pads = None
    if pads is not None and len(pads) == 1 and torch.equal(padding_mask(x, int(pads[0])), m.long()):
        say(f"warning: {who}: 'attention_mask' is not passed to the model, and item 0 has padding (id "
            f"{int(pads[0])} at the row ends): an HF bidirectional model (bert) masks the ids equal to its "
            f"config.pad_token_id there, which must be {int(pads[0])}; a causal LM (gpt2, llama) needs the padding on "
            f"the right and -100 in its labels")
    else:
        say(f"warning: {who}: 'attention_mask' is not passed to the model, and item 0 has padding that is not one "
            f"pad id at the row ends: the model attends to it; pad each row at its end with the tokenizer's pad id")


def map_dict_items(ds: Dataset, who: str = "data") -> Dataset:
    """`ds` itself when its items are pairs; a `DictItems` view when they are dicts (the first item decides).
    `who` names the dataset in errors. Usage: `train_data = map_dict_items(hf_dataset)`."""
    if not hasattr(ds, "__getitem__") or not hasattr(ds, "__len__") or isinstance(ds, (str, bytes, torch.Tensor)):
        raise UserError(f"{who}: got {type(ds).__name__}, not a map-style Dataset (an object with __getitem__ and "
                        f"__len__ whose items are (inputs, targets)), e.g. torch.utils.data.TensorDataset(x, y)")
    if isinstance(ds, (tuple, list)) and len(ds) == 2 \
            and all(isinstance(t, (torch.Tensor, np.ndarray)) and t.ndim >= 1 for t in ds):
        # (x, y) itself: as a dataset it would be two items, each a whole tensor
        raise UserError(f"{who}: got a {type(ds).__name__} of two arrays of {len(ds[0])} and {len(ds[1])} rows, "
                        f"not a dataset of (inputs, targets) items; wrap them: torch.utils.data.TensorDataset(x, y)")
    if isinstance(ds, IterableDataset):  # its __getitem__ is Dataset's NotImplementedError, whatever its __len__ says
        raise UserError(f"{who}: got {type(ds).__name__}, an IterableDataset (a stream); turbotrain samples by index "
                        f"and needs a map-style Dataset (__getitem__ and __len__), e.g. HF datasets loaded without "
                        f"streaming=True, or the stream's items gathered into a list")
    if isinstance(ds, Mapping) and any(k in ds for k in INPUT_KEYS + TARGET_KEYS):
        # a tokenizer's BatchEncoding, or a dict of columns: its keys are columns, not splits
        ins = next((k for k in INPUT_KEYS if k in ds), "input_ids")
        tgts = next((k for k in TARGET_KEYS if k in ds), "labels")
        raise UserError(f"{who}: got a {type(ds).__name__} of whole columns ({', '.join(map(repr, list(ds)[:4]))}), "
                        f"not a dataset of items; wrap them, one row per item: "
                        f"torch.utils.data.TensorDataset(d[{ins!r}], d[{tgts!r}])")
    if isinstance(ds, Mapping):  # an HF DatasetDict or a dict of splits: ds[0] would be a KeyError
        raise UserError(f"{who}: got a {type(ds).__name__} of splits ({', '.join(map(repr, list(ds)[:4]))}), not one "
                        f"dataset; pass one split, e.g. train_data=ds['train'], val_data=ds['validation']")
    if isinstance(ds, (TensorDataset, DictItems)) or not call_user(len, f"{who}: len()", ds):
        return ds
    first = call_user(ds.__getitem__, f"{who}: __getitem__(0)", 0)
    if not isinstance(first, Mapping):  # a dict, or a tokenizer's BatchEncoding (a UserDict)
        return ds
    keys = dict_item_keys(first, who)
    left = [k for k in first if k not in keys]
    say(f"data: dict items mapped as inputs = {keys[0]!r}, targets = {keys[1]!r}"
        + (f" (not used: {', '.join(map(str, left[:6]))})" if left else ""))
    _say_mask(first.get("attention_mask"), first[keys[0]], who)
    if _has_a_zero(first.get("token_type_ids"), nonzero=True):  # bert embeds the segment of each token
        say(f"warning: {who}: 'token_type_ids' is not passed to the model, and item 0 has tokens of segment 1 (a "
            f"sentence pair): the model sees every token as segment 0; join the pair with its separator token, or "
            f"train on one sentence a row")
    mapped = DictItems(ds, keys, who)
    x, y = mapped[0]
    from turbotrain.models.hf import labels_are_inputs

    if labels_are_inputs(x, y):  # HF's causal-LM convention: the model shifts the labels
        say(f"data: {keys[1]!r} equal {keys[0]!r} (HF's causal-LM convention, -100 at padding): train an HF causal "
            f"LM with train.loss = \"model\", which shifts them; a plain loss would learn to copy its input")
    return mapped


from turbotrain.data.text import text  # noqa: E402  (text.py builds on TokenWindows above)

BUILTIN = {"shakespeare": shakespeare, "fashion_mnist": fashion_mnist, "synthetic": synthetic, "text": text}
