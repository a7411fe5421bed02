"""`data.name = "text"`: the user's own text files as next-token windows.

    [data]
    name = "text"
    [data.args]
    path = "corpus/"        # a file, or a folder searched recursively for .txt, .jsonl ("text" field), .parquet
    tokens = "char"         # "char" (the characters present) | "byte" (UTF-8 bytes, vocab 256) | "tok/tokenizer.json"
    block_size = 256        # tokens per sample
    val_fraction = 0.1      # the last 10 % of the tokens are the validation split

The files are read in sorted path order (any case of the suffixes; hidden entries, .name, left out and said;
a file reached again through a link read once),
joined by a newline (char/byte) or encoded one by one (a tokenizer.json of the HF `tokenizers` library; no special
tokens added, its truncation and padding off). The token ids are written once to
a memory-mapped file in turbotrain's cache (`$TURBOTRAIN_CACHE/text/<key>/`, key = the files' paths, sizes
and mtimes and the tokenizer), checksummed in its meta.json like the fetched datasets: a changed file makes a
new cache entry, a corrupt one is rebuilt. .parquet needs pyarrow (installed with `datasets`).
"""
from __future__ import annotations

import codecs
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from turbotrain.data.fetch import checksums, file_sha256, record_checksums, write_atomic
from turbotrain.errors import UserError
from turbotrain.files import cache_root, path_arg
from turbotrain.log import say, say_once

SUFFIXES = (".txt", ".jsonl", ".parquet")
UNKNOWN_SHARE = 0.05  # of the tokens the tokenizer's unknown token: its vocabulary is not this text's


def text(split: str, path: str | None = None, tokens: str = "char", block_size: int = 256, val_fraction: float = 0.1,
         stride: int | None = None):
    """Token windows over the files at `path` (see the module docstring); the last `val_fraction` is "val"."""
    from turbotrain.data.datasets import check_window_args, split_windows  # datasets.py registers this factory

    if not isinstance(path, str) or not path:
        raise UserError('data.args.path: data.name = "text" needs the path of a .txt/.jsonl file '
                        'or of a folder of them')
    check_window_args(block_size, val_fraction, stride)
    if not isinstance(tokens, str) or (tokens not in ("char", "byte") and not tokens.endswith(".json")):
        raise UserError(f"data.args.tokens = {tokens!r}: expected \"char\", \"byte\" or the path of a tokenizer.json")
    ids, vocab_size = token_ids(source_files(path), tokens)
    return split_windows(ids, vocab_size, split, block_size, val_fraction, stride, "add text", f" of {path}")


def source_files(path: str) -> list[Path]:
    root = path_arg("data.args.path", path)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        found, hidden = _walk(root)
        files = _once(sorted(p for p in found if _kind(p) in SUFFIXES), path)
        left = sorted(hidden + [p for p in found if _kind(p) not in SUFFIXES])
        if left and files:  # a .md, .csv or .txt.gz beside the text would be left out of training unseen
            say_once(f"data text: {len(left)} entries under {path} left out: hidden, or not {'/'.join(SUFFIXES)} "
                     f"(e.g. {left[0].relative_to(root)})")
    elif root.exists() or root.is_symlink():
        raise UserError(f"data.args.path = {path!r}: not a regular file or folder (a broken link, a pipe or a device)")
    else:
        raise UserError(f"data.args.path = {path!r}: no such file or folder")
    odd = [p for p in files if not p.is_file()]
    if odd:  # skipping it would leave its text out of the training data, unseen
        raise UserError(f"data.args.path = {path!r}: {odd[0]} is not a regular file (a broken link, a pipe or a "
                        "device); fix or remove it")
    bad = [p for p in files if _kind(p) not in SUFFIXES]
    if bad or not files:
        raise UserError(f"data.args.path = {path!r}: " + (f"{bad[0].name} is not {'/'.join(SUFFIXES)}" if bad else
                        f"no {', '.join(SUFFIXES)} files in the folder (hidden ones, .name, are left out)"))
    return files


def _once(files: list[Path], path: str) -> list[Path]:
    """Each file once, at its first path in sorted order: a link beside its target (latest.txt -> part3.txt)
    would train on the text twice and, with the copies on either side of the val cut, validate on trained text."""
    seen: dict[str, Path] = {}
    for p in files:
        seen.setdefault(os.path.realpath(p), p)
    if len(seen) < len(files):
        twice = next(p for p in files if seen[os.path.realpath(p)] is not p)
        say_once(f"data text: {len(files) - len(seen)} file(s) under {path} are links to files already read, read "
                 f"once (e.g. {twice.name} is {seen[os.path.realpath(twice)].name})")
    return list(seen.values())


def _kind(p: Path) -> str:
    return p.suffix.lower()  # NOTES.TXT is text too: left out, its text would be missing from training unseen


def _walk(root: Path) -> tuple[list[Path], list[Path]]:
    """(every non-folder entry under `root`, the hidden entries left out), through linked folders too (rglob skips
    those, and with them their text, unseen); a folder reached twice (a link back up the tree) is walked once.
    Hidden entries are tools' copies and locks, not the corpus: Jupyter's .ipynb_checkpoints/a-checkpoint.txt
    (the text twice, in the val split too), Emacs's .#a.txt lock (a dangling link), macOS's ._a.txt."""
    def unreadable(e: OSError) -> None:
        raise UserError(f"data.args.path: cannot list {e.filename} ({e.strerror or e}); make it readable or move it "
                        "out of the folder")

    out, hidden, seen = [], [], set()
    for top, dirs, names in os.walk(root, onerror=unreadable, followlinks=True):
        real = os.path.realpath(top)
        if real in seen:
            dirs.clear()
            continue
        seen.add(real)
        hidden += [Path(top) / n for n in dirs + names if n.startswith(".")]
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        out += [Path(top) / n for n in names if not n.startswith(".")]
    return out, hidden


def token_ids(files: list[Path], tokens: str) -> tuple[np.ndarray, int]:
    """(ids, vocab size): the cached memory-mapped token file when its checksum verifies, else tokenised
    and cached (in memory only when the cache is not writable)."""
    stamp = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    # "whole": tokenised with the file's truncation and padding off (tokens cached with them on are not the text's)
    tok_sum = f"{file_sha256(_tokenizer_path(tokens))} whole" if tokens not in ("char", "byte") else tokens
    # the decoding rules are part of the key: a cache tokenised under other rules is not this text's tokens
    key = hashlib.sha256(json.dumps([stamp, tok_sum, "utf-8 strict, no BOM"]).encode()).hexdigest()[:20]
    root = cache_root() / "text" / key
    cached = _cached(root, tokens)
    if cached is not None:
        return cached
    ids, vocab_size, vocab, unknown = _encode([_read(p) for p in files], tokens)
    if not len(ids):
        shown = ", ".join(str(p) for p in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise UserError(f"data.args.path: {shown} {'holds' if len(files) == 1 else 'hold'} no text (0 tokens); "
                        f"point data.args.path at a .txt/.jsonl file or folder with text in it")
    _say_unknown(unknown, tokens)
    meta = {"vocab_size": vocab_size, "dtype": ids.dtype.name, "tokens": tokens, "n_tokens": int(len(ids)),
            "files": [s[0] for s in stamp], "vocab": vocab, "unknown": unknown}
    try:
        root.mkdir(parents=True, exist_ok=True)
        write_atomic(root / "tokens.bin", ids.tobytes())
        write_atomic(root / "meta.json", json.dumps(meta).encode())
        record_checksums(root, {"tokens.bin": hashlib.sha256(ids.tobytes()).hexdigest()})
        say(f"data text: {len(files)} file(s), {len(ids):,} tokens ({tokens}, vocab {vocab_size}) cached in {root}")
        return np.memmap(root / "tokens.bin", dtype=ids.dtype, mode="c"), vocab_size
    except OSError:
        say(f"data text: the cache {root} is not writable; tokenised in memory for this run")
        return ids, vocab_size


def _cached(root: Path, tokens: str) -> tuple[np.ndarray, int] | None:
    """The cached (ids, vocab size) when tokens.bin verifies and meta.json agrees with it, else None (tokenise again).
    meta.json is not covered by the checksum: a damaged dtype reads the bytes as other ids, a damaged vocab_size
    sizes the model's embedding short of the ids (or past them, unseen)."""
    sums = checksums(root)
    if not (sums.get("tokens.bin") and (root / "tokens.bin").is_file()):
        return None
    meta = json.loads((root / "meta.json").read_text())
    dtype, vocab_size, n = meta.get("dtype"), meta.get("vocab_size"), meta.get("n_tokens")
    if file_sha256(root / "tokens.bin") != sums["tokens.bin"]:
        say(f"warning: data text: {root / 'tokens.bin'} does not match its recorded sha256; tokenising again")
        return None
    size = (root / "tokens.bin").stat().st_size
    # n_tokens may be absent (older caches); when present it must be the file's count
    sound = (dtype in ("uint8", "int16", "int32") and type(vocab_size) is int and vocab_size > 0
             and _dtype(vocab_size) == np.dtype(dtype) and size > 0 and size % np.dtype(dtype).itemsize == 0
             and (n is None or (type(n) is int and n * np.dtype(dtype).itemsize == size)))
    ids = np.memmap(root / "tokens.bin", dtype=dtype, mode="c") if sound else None
    vocab = meta.get("vocab")
    if not sound or int(ids.min()) < 0 or int(ids.max()) >= vocab_size or (tokens == "char" and (
            not isinstance(vocab, list) or len(vocab) != vocab_size)):
        say(f"warning: data text: {root / 'meta.json'} does not describe {root / 'tokens.bin'} (token dtype, count "
            "or vocab_size); tokenising again")
        return None
    _say_unknown(meta.get("unknown", 0.0), tokens)
    return ids, vocab_size


def _read(p: Path) -> str:
    if _kind(p) == ".txt":
        return _utf8(p)
    if _kind(p) == ".jsonl":
        out = []
        # JSON Lines end at "\n" alone: splitlines() would also cut inside strings at the U+2028, U+2029 and U+0085
        # that JSON leaves unescaped (json.dumps(..., ensure_ascii=False) writes them as they are)
        for n, line in enumerate(_utf8(p).split("\n"), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"data text: {p}:{n} is not a JSON line") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise UserError(f"data text: {p}:{n} has no \"text\" string field")
            out.append(row["text"])
        return "\n".join(out)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"data text: reading {p.name} needs pyarrow: pip install 'turbotrain[hf]' (datasets)") from None
    try:
        table = pq.read_table(p)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"data text: {p} is not a readable parquet file ({' '.join(str(e).split())[:160]})") from None
    if "text" not in table.column_names:
        raise UserError(f"data text: {p} has no \"text\" column (columns: {', '.join(table.column_names[:8])})")
    values = table.column("text").to_pylist()
    bad = next((v for v in values if v is not None and not isinstance(v, str)), None)
    if bad is not None:  # str() would train on a number's digits or a list's repr, as the jsonl path refuses
        raise UserError(f"data text: {p}'s \"text\" column holds {type(bad).__name__} values ({str(bad)[:40]!r}), "
                        f"not strings; point data.args.path at text")
    return "\n".join(t for t in values if t is not None)


# iconv's utf-16 / utf-32 read the byte-order mark and drop it
_BOMS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe", "utf-16"),
         (b"\xfe\xff", "utf-16"))


def _utf8(p: Path) -> str:
    """The file as UTF-8 text; a binary or differently encoded file is refused (decoding it with
    replacement characters would train on silently changed text)."""
    try:
        raw = p.read_bytes()
    except OSError as e:  # unreadable (permissions), or a link to a device or /proc file that fails on read
        raise UserError(f"data.args.path: cannot read {p} ({e.strerror or e}); make it readable or remove it from "
                        "the folder") from None
    skip = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0  # an editor's mark, not text
    try:
        text = raw[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        # a byte-order mark names the encoding; without one, latin-1 is the likeliest of the old 8-bit ones
        source = next((name for bom, name in _BOMS if raw.startswith(bom)), "latin1")
        at = e.start + skip
        raise UserError(f"data.args.path: {p} is not UTF-8 text (byte 0x{raw[at]:02x} at offset {at}); "
                        f"convert it to UTF-8 (e.g. iconv -f {source} -t utf-8) or remove it from the folder") from None
    if "\x00" in text:
        raise UserError(f"data.args.path: {p} holds NUL bytes, so it is binary, not text; remove it from the folder")
    return text


def _tokenizer_path(tokens: str) -> Path:
    p = path_arg("data.args.tokens", tokens)
    if not p.is_file():
        raise UserError(f"data.args.tokens = {tokens!r}: no such tokenizer.json file")
    return p


def _encode(docs: list[str], tokens: str) -> tuple[np.ndarray, int, list[str] | None, float]:
    """(ids in the smallest dtype that holds the vocabulary, vocab size, the characters for char, the share of
    the tokenizer's unknown token)."""
    if tokens == "byte":
        return np.frombuffer("\n".join(docs).encode("utf-8"), dtype=np.uint8).copy(), 256, None, 0.0
    if tokens == "char":
        codes = np.frombuffer("\n".join(docs).encode("utf-32-le"), dtype=np.uint32)
        vocab, ids = np.unique(codes, return_inverse=True)
        return ids.astype(_dtype(len(vocab))), len(vocab), [chr(c) for c in vocab], 0.0
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError("data.args.tokens = a tokenizer.json needs the tokenizers package: pip install "
                        "'turbotrain[hf]' (or pip install tokenizers)") from None
    try:
        tok = Tokenizer.from_file(str(_tokenizer_path(tokens)))
    except Exception as e:  # the library raises its own Exception type for a malformed file
        raise UserError(f"data.args.tokens = {tokens!r}: not a tokenizers tokenizer.json ({str(e)[:120]})") from None
    cut = [what for what, on in (("truncation", tok.truncation), ("padding", tok.padding)) if on]
    if cut:  # set for a model's inputs; on a file's whole text they would cut it short or pad it with pad tokens
        say_once(f"data text: {tokens}'s {' and '.join(cut)} turned off: the files are tokenised whole into one "
                 f"stream that data.args.block_size cuts into windows")
        tok.no_truncation()
        tok.no_padding()
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    try:
        enc = tok.encode_batch(docs, add_special_tokens=False)
    except Exception as e:  # e.g. a WordLevel model without an unk_token meeting a word outside its vocabulary
        raise UserError(f"data.args.tokens = {tokens!r}: the tokenizer cannot encode the text ({str(e)[:120]}); "
                        f"use a tokenizer.json made for this text (one with an unknown token, or a byte-level BPE)") \
            from None
    ids = np.fromiter((i for e in enc for i in e.ids), dtype=np.int64)
    unk = getattr(tok.model, "unk_token", None)
    unk_id = tok.token_to_id(unk) if isinstance(unk, str) else None
    unknown = float((ids == unk_id).mean()) if unk_id is not None and len(ids) else 0.0
    return ids.astype(_dtype(vocab_size)), vocab_size, None, unknown


def _say_unknown(unknown: float, tokens: str) -> None:
    """Text the tokenizer's vocabulary does not hold becomes its unknown token: a model trained on a stream of
    mostly [UNK] learns nothing of the text, with a fine loss."""
    if isinstance(unknown, float) and unknown > UNKNOWN_SHARE:  # a float: meta.json is not checksummed
        say_once(f"warning: data text: {unknown:.0%} of the tokens are {tokens}'s unknown token: its vocabulary "
                 f"does not cover this text; use a tokenizer.json trained on text like it (or tokens = \"byte\")")


def _dtype(vocab_size: int) -> np.dtype:
    # int16, not uint16: torch supports uint16 tensors only partly (no indexing kernels on every device)
    return np.dtype(np.uint8 if vocab_size <= 256 else np.int16 if vocab_size <= 32768 else np.int32)
