"""Typed config: one dataclass per TOML section (technique sections live beside their code), loaded from
a preset name or a .toml path, dotted KEY=VALUE overrides parsed as TOML literals, validated with
one-line errors, and written back out resolved.

Usage: `cfg = load_config("gpt-shakespeare", ["train.steps=30", "precision.dtype=bf16"])`.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
import sys
import tomllib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from turbotrain.accel.activation_ckpt import MemoryConfig
from turbotrain.accel.attention import KernelsConfig
from turbotrain.accel.compile import CompileConfig
from turbotrain.accel.precision import PrecisionConfig
from turbotrain.checkpoint import CheckpointConfig
from turbotrain.data.loader import DataConfig
from turbotrain.distributed.parallel import ParallelConfig
from turbotrain.errors import UserError
from turbotrain.files import path_arg
from turbotrain.log import say
from turbotrain.models import ModelConfig
from turbotrain.monitor.run_monitor import MonitorConfig
from turbotrain.rundir import RunConfig
from turbotrain.step import TrainConfig

DEFAULT_PRESET = "gpt-shakespeare"


@dataclass
class Config:
    """The whole config: one section per technique or part, each defined beside the code it configures."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


# ---------------------------------------------------------------- parsing and validation

MAX_EXTENDS = 16  # files in one `extends` chain


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(f'"{a}"' if isinstance(a, str) else str(a).lower() for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):  # None is the unset default: TOML cannot write it
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None))
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            dict: "a table", list: "a list", tuple: "a list"}.get(origin or tp, str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """(matches, value) — ints are accepted for floats; lists for tuples."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(tp)), value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, v = _coerce(value, arg)
            if ok:
                return True, v
        return False, value
    base = origin or tp
    if base is bool:
        return isinstance(value, bool), value
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        try:
            return ok, float(value) if ok else value
        except OverflowError:  # an integer beyond float range
            return False, value
    if base is str:
        return isinstance(value, str), value
    if base is dict:
        return isinstance(value, dict), value
    if base in (list, tuple):
        return isinstance(value, list), value
    return True, value


def show_value(value: Any) -> str:
    """A value as one line: strings quoted with control characters escaped."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (datetime.date, datetime.time)):  # as TOML wrote it, not datetime.date(2026, 1, 1)
        return value.isoformat()
    try:
        return " ".join(repr(value).split())
    except ValueError:  # an integer past Python's int-to-text limit (a long hex literal in TOML)
        return f"<a {type(value).__name__} too large to show>"


def _bad_text(value: str) -> str | None:
    """Why a config string cannot be used (control characters, lone surrogates), or None."""
    bad = sorted({c for c in value if ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF})
    return "contains " + ", ".join(show_value(c) for c in bad) if bad else None


def did_you_mean(word: Any, choices: list[str]) -> str:
    """" (did you mean X?)" for a misspelt or miscased key, section or preset name; "" when none is close."""
    import difflib

    def norm(x: str) -> str:  # case and _ vs - are the usual slips (mlp_seed, Train, grad-accum)
        return x.lower().replace("_", "-")

    by_norm = {norm(c): c for c in choices}
    close = difflib.get_close_matches(norm(word), list(by_norm), n=1) if isinstance(word, str) else []
    return f" (did you mean {by_norm[close[0]]}?)" if close else ""


def _sections_of(key: Any) -> list[str]:
    """The sections that have a key of this name (lr → [train]), for a key written in the wrong one."""
    return [name for name, cls in typing.get_type_hints(Config).items()
            if isinstance(key, str) and key in {f.name for f in dataclasses.fields(cls)}]


def _elsewhere(key: Any) -> str:
    """" (lr is a key of [train]: train.lr)" for a key that belongs to another section; "" when none has it."""
    if key == "extends":  # TOML puts every key after a [section] header into that section
        return " (extends goes at the top of the file, before any [section] header)"
    if key in typing.get_type_hints(Config):  # train.compile = true for compile.enabled = true
        first = dataclasses.fields(typing.get_type_hints(Config)[key])[0].name
        return f" ({key} is a section of its own: [{key}], e.g. {key}.{first})"
    homes = _sections_of(key)
    return f" ({key} is a key of {' and '.join(f'[{h}]' for h in homes)}: {homes[0]}.{key})" if homes else ""


def _retype_hint(value: Any, tp: Any) -> str:
    """How to write a value TOML read as the wrong type: a number in quotes ("1e-3"), an integer as 1e3."""
    if isinstance(value, float) and value.is_integer() and _coerce(int(value), tp)[0]:
        # 1e30 is whole, but as an integer past 64 bits it is refused next: no hint to write that
        return f"; write {int(value)}" if -2**63 <= value < 2**63 else "; it is out of range (a 64-bit integer at most)"
    if isinstance(value, str) and value.strip():
        try:
            parsed = tomllib.loads(f"v = {value.strip()}")["v"]
        except (tomllib.TOMLDecodeError, ValueError):
            return ""
        if not isinstance(parsed, str) and _coerce(parsed, tp)[0]:
            return f"; write it without quotes: {value.strip()}"
    return ""


def _build_section(cls: type, table: Any, section: str) -> Any:
    if not isinstance(table, dict):
        raise UserError(f"[{section}] must be a table, got {show_value(table)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in table.items():
        if key not in fields:
            raise UserError(f"unknown key {section}.{show_value(key) if _bad_text(key) else key}"
                            f"{_elsewhere(key) or did_you_mean(key, list(fields))}; "
                            f"valid keys in [{section}]: {', '.join(fields)}")
        ok, value = _coerce(value, hints[key])
        if not ok:
            scalar = isinstance(value, (int, float, datetime.date, datetime.time))  # TOML read 1, true, a date
            quote = f"; quote it to make it a string: \"{show_value(value)}\"" \
                if scalar and "a string" in _describe(hints[key]) else _retype_hint(value, hints[key])
            raise UserError(f"{section}.{key} = {show_value(value)}: expected {_describe(hints[key])}{quote}")
        # nan/inf pass every range check (nan < 0 is False): refused here for every float field, unless the
        # field says otherwise with dataclasses.field(metadata={"nonfinite": True})
        if isinstance(value, float) and not math.isfinite(value) and not fields[key].metadata.get("nonfinite"):
            raise UserError(f"{section}.{key} = {show_value(value)}: must be a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
            raise UserError(f"{section}.{key} = {show_value(value)}: out of range (a 64-bit integer at most)")
        if isinstance(value, str) and _bad_text(value):
            rule = getattr(cls, f"{key.upper()}_RULE", None)  # e.g. RunConfig.NAME_RULE
            raise UserError(f"{section}.{key} = {show_value(value)}: {_bad_text(value)}; {rule or 'remove it'}")
        kwargs[key] = value
    return cls(**kwargs)


def config_from_dict(raw: dict) -> Config:
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    hints = typing.get_type_hints(Config)
    kwargs = {}
    for name, table in raw.items():
        if name not in sections and not isinstance(table, dict):  # a key above every [section] header
            home = _sections_of(name)[:1]
            fix = f"write it under [{home[0]}] in the file, or as {home[0]}.{name}=... on the command line" if home \
                else f"keys go under a [section]; valid sections: {', '.join(sections)}"
            raise UserError(f"{show_value(name) if _bad_text(name) else name} = {show_value(table)[:60]} is outside "
                            f"any section{_elsewhere(name)}; {fix}")
        if name not in sections:
            raise UserError(f"unknown section [{show_value(name) if _bad_text(name) else name}]"
                            f"{did_you_mean(name, list(sections)) or _elsewhere(name)}; "
                            f"valid sections: {', '.join(sections)}")
        kwargs[name] = _build_section(hints[name], table, name)
    return Config(**kwargs)


def parse_value(text: str) -> Any:
    """A TOML literal (`3`, `1e-3`, `true`, `"x"`, `[1, 2]`); anything else is taken as a bare string."""
    try:
        doc = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError as e:
        if text[:1] in "\"'[{" and text:  # meant as a TOML string, list or table: as a bare string it would be
            # used with its quotes or brackets in (a folder named "'/a" for a broken quote)
            raise UserError(f"{show_value(text[:60])}: not a TOML value ({str(e).split(' (at')[0]}); close its "
                            "quotes or brackets (in a shell, wrap the whole KEY=VALUE in single quotes)") from None
        return text
    except ValueError:  # tomllib's int() past Python's int-to-text limit: a traceback otherwise
        raise UserError(f"{show_value(text[:40])}...: an integer of more than {sys.get_int_max_str_digits()} digits; "
                        "use a smaller number") from None
    if set(doc) != {"v"}:  # a line break let more TOML in ("0.5\ntrain.steps=99"): it would be dropped unseen
        raise UserError(f"{show_value(text[:60])}: a value with a line break and more TOML after it; give one "
                        "KEY=VALUE per argument")
    return doc["v"]


def _override_key(item: str) -> tuple[list[str], str] | None:
    """(dotted key's parts, value text) of KEY=VALUE, or None. A key with quotes is read as TOML reads it
    (`args."a b"` is the key `a b`, `args."x.y"` one key); the `=` is the first one that ends a whole key,
    since a quoted part may hold one. An unquoted key splits on dots, so non-ASCII names (not TOML bare keys)
    still work."""
    for i, c in enumerate(item):
        if c != "=":
            continue
        lhs, text = item[:i], item[i + 1:]
        if '"' not in lhs and "'" not in lhs:
            parts = [p.strip() for p in lhs.split(".")]
            return (parts, text) if all(parts) else None
        try:
            node: Any = tomllib.loads(f"{lhs} = 0")
        except tomllib.TOMLDecodeError:
            continue
        parts = []
        while isinstance(node, dict) and len(node) == 1:
            (key, node), = node.items()
            parts.append(key)
        return (parts, text) if node == 0 else None
    return None


def apply_override(raw: dict, item: str) -> None:
    split = _override_key(item)
    if split is None or len(split[0]) < 2:
        homes = _sections_of(split[0][0]) if split and len(split[0]) == 1 else []
        if homes:  # lr=1e-3: the key alone, its section left out
            raise UserError(f"override {show_value(item)}: no section given; did you mean {homes[0]}.{item.strip()}?")
        spaced = "; write KEY=VALUE as one argument, with no spaces around the =" if "=" not in item.strip(" =") else ""
        raise UserError(f"override {show_value(item)}: expected SECTION.KEY=VALUE, e.g. train.steps=30 "
                        f'(quote a key holding spaces or dots: model.args."a b"=1){spaced}')
    (*path, last), text = split
    node = raw
    for part in path:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UserError(f"override {show_value(item)}: {part} is not a table")
    node[last] = parse_value(text.strip())


def list_presets() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("turbotrain.presets").iterdir() if p.name.endswith(".toml"))


def _is_preset(name: str) -> bool:
    return bool(name) and not any(c in name for c in "/\\\0") and \
        (resources.files("turbotrain.presets") / f"{name}.toml").is_file()


def config_path(source: str, base: Path | None = None) -> Path | None:
    """The file a CONFIG argument (or an `extends` value) names, or None when it names a preset.

    A path is anything ending in .toml or holding a path separator, or an existing file; a relative one
    resolves against `base` (the folder of the file that extends it) or else the current directory."""
    path = path_arg("config", source)
    if base is not None and not path.is_absolute():
        path = base / path
    if source.endswith(".toml") or "/" in source or "\\" in source or path.is_file():
        return path
    if path.exists() and not _is_preset(source):  # a directory: refused by _read_text, naming it
        return path
    return None


def chain_folders(source: str) -> list[Path]:
    """The folders of the files in `source`'s extends chain, outermost first (a preset has none): user code named
    in a file is imported from beside it, wherever the chain is used from. A file that cannot be read ends the
    walk quietly; load_config says why."""
    folders: list[Path] = []
    base = None
    for _ in range(MAX_EXTENDS):
        try:
            path = config_path(source, base)
            raw = tomllib.loads(path.read_text(encoding="utf-8-sig")) if path is not None else {}
        except (UserError, OSError, ValueError):
            break
        if path is None or path.parent.absolute() in folders:
            break
        folders.append(path.parent.absolute())
        source, base = raw.get("extends"), path.parent
        if not isinstance(source, str) or not source.strip():
            break
        source = source.strip()
    return folders


def _read_text(path: Path, shown: str) -> str:
    if path.is_dir():
        raise UserError(f"config {shown} is a directory; pass a .toml file inside it or a preset name")
    if not path.exists() and path.is_symlink():
        raise UserError(f"config {shown} is a symbolic link to nothing (dangling, or a loop); point it at a .toml "
                        "file or pass the file itself")
    if not path.exists():
        preset = f" (the preset is {path.stem}, without .toml)" if _is_preset(path.stem) else ""
        raise UserError(f"config file {shown} not found{preset}")
    if not path.is_file():
        raise UserError(f"config {shown} is not a regular file; pass a .toml file or a preset name")
    try:
        data = path.read_bytes()
    except PermissionError:
        raise UserError(f"cannot read config {shown}: permission denied; make it readable (chmod u+r)") from None
    except OSError as e:
        raise UserError(f"cannot read config {shown}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8-sig")  # a byte-order mark is tolerated
    except UnicodeDecodeError as e:
        raise UserError(f"config {shown} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                        "save it as UTF-8") from None


@dataclass
class _Source:
    raw: dict  # merged over everything it extends
    own: dict  # the file's own tables, before the merge
    path: Path | None  # None: a preset


def _load_source(source: str, base: Path | None = None, chain: tuple[tuple[str, str], ...] = ()) -> _Source:
    """Read a preset or a file and the chain it `extends`; `chain` holds (identity, shown) of the files that
    extend this one, outermost first."""
    if _bad_text(source):
        raise UserError(f"config {show_value(source)}: {_bad_text(source)}; name a preset or a .toml file")
    via = f" (extended by {chain[-1][1]})" if chain else ""
    path = config_path(source, base)
    if path is not None:
        where = str(path)
        text = _read_text(path, where + via)  # first: it names a link that loops, where resolve() raises
        ident = f"file:{path.resolve()}"
    else:
        preset = resources.files("turbotrain.presets") / f"{source}.toml"
        if not _is_preset(source):
            hint = did_you_mean(source, list_presets())
            raise UserError(f"no preset or file named {show_value(source)}{via}{hint}; "
                            f"presets: {', '.join(list_presets())}")
        ident, where = f"preset:{source}", f"preset {source}"
        text = preset.read_text(encoding="utf-8")
    seen = [i for i, _ in chain]
    if ident in seen:
        cycle = [shown for _, shown in chain[seen.index(ident):]] + [where]
        what = f"{where} extends itself" if len(cycle) == 2 else "extends form a cycle: " + " -> ".join(cycle)
        raise UserError(f"{what}; remove one of these extends")
    if len(chain) >= MAX_EXTENDS:
        raise UserError(f"{where}: extends chain is longer than {MAX_EXTENDS} files "
                        f"({chain[0][1]} -> {chain[1][1]} -> ...); flatten it")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{where}: malformed TOML ({' '.join(str(e).split())})") from None
    except ValueError:  # tomllib's int() past Python's int-to-text limit: a traceback otherwise
        raise UserError(f"{where}: an integer of more than {sys.get_int_max_str_digits()} digits; "
                        "use a smaller number") from None
    if not raw and path is not None:  # legitimately usable, but most likely not the file meant
        say(f"warning: config {where}{via} sets nothing (empty, or comments only): every key takes its default")
    own = dict(raw)
    parent_name = raw.pop("extends", None)
    if parent_name is not None:  # a user TOML may start from a preset or another file: extends = "gpt-shakespeare"
        if not isinstance(parent_name, str) or not parent_name.strip():
            raise UserError(f"{where}: extends = {show_value(parent_name)}: expected a preset name or a .toml path "
                            'as a string, e.g. extends = "gpt-shakespeare"')
        parent = _load_source(parent_name.strip(), path.parent if path is not None else None,
                              (*chain, (ident, where)))
        raw = _merge(parent.raw, raw)
    return _Source(raw, own, path)


def _merge(base: dict, top: dict) -> dict:
    """Deep merge; a section that names another model/dataset starts its `args` afresh (the preset's
    args belong to the preset's factory)."""
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            parent = out[k]
            if "name" in v and v["name"] != parent.get("name"):
                parent = {key: val for key, val in parent.items() if key != "args"}
            out[k] = _merge(parent, v)
        else:
            out[k] = v
    return out


def name_from_stem(stem: str) -> str:
    """A valid run.name from a config file's stem: unsafe characters become '_'."""
    name = "".join(c if RunConfig.name_char_ok(c) else "_" for c in stem).strip(" ").lstrip("-")[:128].strip(" ")
    return name if RunConfig.name_problem(name) is None else "run"


def load_config(source: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """A preset or a .toml file (a str, or a Path), plus dotted overrides. A file's runs are named after it
    (`my.toml` → runs/my/) unless the file itself sets run.name (a preset it extends does not count) or an
    override does."""
    source = os.fspath(source) if isinstance(source, os.PathLike) else source
    if source is not None and not isinstance(source, str):
        raise UserError(f"load_config: source = {show_value(source)[:80]} ({type(source).__name__}); expected a "
                        'preset name or a .toml path (a str or a Path), e.g. load_config("gpt-shakespeare")')
    if not isinstance(overrides, (list, tuple, type(None))) or not all(isinstance(o, str) for o in overrides or ()):
        raise UserError(f"load_config: overrides = {show_value(overrides)[:80]}: expected a list of KEY=VALUE "
                        'strings, e.g. load_config("gpt-shakespeare", ["train.steps=30"])')
    overrides = overrides or ()
    src = _load_source(source or DEFAULT_PRESET)
    raw = src.raw
    own_run = src.own.get("run")
    if src.path is not None and not (isinstance(own_run, dict) and "name" in own_run) \
            and isinstance(raw.get("run", {}), dict):
        raw["run"] = {**raw.get("run", {}), "name": name_from_stem(src.path.stem)}
    given: dict = {}  # the command line's overrides alone, to see which factories it names
    for item in overrides:
        apply_override(given, item)
    for sec in ("model", "data"):  # another factory named: the old one's args go BEFORE the overrides apply,
        # so every args key the command line gives, in any form (args={..}, args.a.b=1, args."k"=1), stays
        section = raw.get(sec)
        if "name" in given.get(sec, {}) and isinstance(section, dict) and given[sec]["name"] != section.get("name"):
            raw[sec] = {k: v for k, v in section.items() if k != "args"}
    for item in overrides:
        apply_override(raw, item)
    return config_from_dict(raw)


# ---------------------------------------------------------------- writing

_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_str(s: str) -> str:
    """A TOML basic string: quote, backslash and every control character escaped; other Unicode as is."""
    return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 32 or ord(c) == 127 else c)
                         for c in s) + '"'


def _toml_key(k: Any) -> str:
    k = str(k)
    return k if _BARE_KEY.fullmatch(k) else _toml_str(k)


def literal(key: str, value: Any) -> str:
    """`data.num_workers=4` as a KEY=VALUE override for a child run (the config's own TOML writer: JSON would escape
    a character past U+FFFF as a surrogate pair, which TOML refuses)."""
    return f"{key}={_toml_value(value)}"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, int):
        try:
            return str(v)
        except ValueError:  # past Python's int-to-text limit: only a long hex literal (TOML reads it back) made it
            return hex(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    if isinstance(v, (datetime.date, datetime.time)):  # TOML's own date/time literals read back as the same value
        return v.isoformat()
    if hasattr(v, "item") and callable(v.item):  # numpy / torch scalars
        return _toml_value(v.item())
    return _toml_str(str(v))  # paths and the like


def to_toml(cfg: Config) -> str:
    """The resolved config as TOML (every key, defaults included); `load_config(path)` reads it back.
    TOML has no null: a None value is left out."""
    lines: list[str] = []

    def table(header: str, d: dict) -> None:
        lines.append(f"[{header}]")
        subs = {k: v for k, v in d.items() if isinstance(v, dict)}
        lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in d.items()
                     if not isinstance(v, dict) and v is not None)
        lines.append("")
        for k, v in subs.items():
            table(f"{header}.{_toml_key(k)}", v)

    for name, section in dataclasses.asdict(cfg).items():
        table(name, section)
    return "\n".join(lines)


def _walk() -> list[tuple[str, type]]:
    """(section name, its dataclass) in file order: the one walk behind the reference and the summary."""
    hints = typing.get_type_hints(Config)
    return [(section.name, hints[section.name]) for section in dataclasses.fields(Config)]


def config_summary(width: int = 100) -> str:
    """Every section and its keys, compactly (`turbotrain train --help`)."""
    import textwrap

    out = []
    for name, cls in _walk():
        head = f"  [{name}] "
        out.append(textwrap.fill(", ".join(f.name for f in dataclasses.fields(cls)), width, initial_indent=head,
                                 subsequent_indent=" " * len(head)))
    return "\n".join(out)


# ---------------------------------------------------------------- the reference (docs/config.md)

def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a section (the string literal after `name: type = default`)."""
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def config_reference() -> str:
    """Markdown reference of every section and key, generated from the dataclasses (docs/config.md)."""
    lines = ["# Config reference", "", "Generated from the config dataclasses by `turbotrain config --reference`; "
             "a test fails when this file drifts from them.", ""]
    for name, cls in _walk():
        docs, types_ = _field_docs(cls), typing.get_type_hints(cls)
        lines += [f"## [{name}]", "", "| key | type | default | what |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            shown = "{}" if isinstance(default, dict) else "unset" if default is None else _toml_value(default)
            cells = [f"`{f.name}`", _describe(types_[f.name]), f"`{shown}`", docs.get(f.name, "")]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)
