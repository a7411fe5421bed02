"""Resolve `pkg.module:name` strings from the config to the user's own factories and functions."""
from __future__ import annotations

import importlib
import inspect
from typing import Any

from turbotrain.errors import UserError


def is_import_spec(name: str) -> bool:
    return ":" in name


def load_object(spec: str, key: str) -> Any:
    """`load_object("mypkg.models:build", "model.name")` → the callable; one-line UserError otherwise."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise UserError(f"{key} = {spec!r}: expected 'pkg.module:name'")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:  # includes ModuleNotFoundError
        raise UserError(f"{key} = {spec!r}: cannot import module {mod_name!r} ({e}); is it on PYTHONPATH?") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise UserError(f"{key} = {spec!r}: module {mod_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise UserError(f"{key} = {spec!r}: {attr!r} is not callable")
    return obj


def call_factory(fn: Any, key: str, *args: Any, **kwargs: Any) -> Any:
    """Call a user factory; a wrong keyword becomes a config error naming the section's args."""
    try:  # check the call against the signature only: a TypeError inside the user's code stays theirs
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        name = getattr(fn, "__name__", "factory")
        raise UserError(f"{key}: {name}() {e} (check [{key.split('.')[0]}.args])") from None
    except ValueError:  # no signature to check (some builtins)
        pass
    return fn(*args, **kwargs)
