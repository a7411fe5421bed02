"""Resolve `pkg.module:name` strings from the config to the user's own factories and functions."""
from __future__ import annotations

import importlib
import inspect
import os
import site
import sys
import sysconfig
import traceback
from typing import Any

from turbotrain.errors import UserError


def is_import_spec(name: str) -> bool:
    return ":" in name


def load_object(spec: str, key: str) -> Any:
    """`load_object("mypkg.models:build", "model.name")` → the callable; one-line UserError otherwise."""
    mod_name, _, attr = spec.partition(":")
    problem = _spec_problem(mod_name, attr)
    if problem:
        raise UserError(f"{key} = {spec!r}: {problem}")
    cwd = _cwd()
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:  # includes ModuleNotFoundError
        raise UserError(f"{key} = {spec!r}: cannot import module {mod_name!r} ({e})"
                        f"{_not_users(mod_name) or '; is it on PYTHONPATH?'}") from None
    except (UserError, MemoryError):
        raise
    except SystemExit as e:  # else the run would end here with that code and not a word
        raise UserError(f"{key} = {spec!r}: importing {mod_name!r} called sys.exit({e.code!r}){where(e)}; a module "
                        "must not exit the process when imported (put that code under `if __name__ == "
                        "\"__main__\":`)") from None
    except Exception as e:  # a SyntaxError, or the module's own code failing as it is imported
        text = " ".join(str(e).split())[:200] or "(no message)"
        raise UserError(f"{key} = {spec!r}: importing {mod_name!r} raised {type(e).__name__}: {text}"
                        f"{'' if isinstance(e, SyntaxError) else where(e)}; fix it there") from e  # it names its line
    finally:
        _keep_cwd(cwd, mod_name)
    _note_user_package(mod_name)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise UserError(f"{key} = {spec!r}: module {mod_name!r} has no attribute {attr!r}{_not_users(mod_name)}") \
            from None
    if not callable(obj):
        raise UserError(f"{key} = {spec!r}: {attr!r} is not callable")
    return obj


def _spec_problem(mod_name: str, attr: str) -> str | None:
    """What makes `module:name` not a spec importlib can take (it would blame the user's module for it), or None."""
    if not mod_name or not attr:
        return "expected 'pkg.module:name'"
    if mod_name != mod_name.strip() or attr != attr.strip():
        return "spaces around the module or the name; remove them"
    if "/" in mod_name or "\\" in mod_name or mod_name.endswith(".py"):
        return ("a file path, not a module name; put the file's folder on PYTHONPATH (or run from it) and name the "
                "module without .py, e.g. 'models:build' for models.py")
    if mod_name.startswith("."):
        return "a relative module name; give its full dotted name from a folder on PYTHONPATH, e.g. 'pkg.module:name'"
    if not all(part.isidentifier() for part in mod_name.split(".")):
        return f"{mod_name!r} is not a dotted module name (Python identifiers joined by '.'), e.g. 'pkg.module'"
    if not attr.isidentifier():
        return f"{attr!r} is not a name defined in the module (one Python identifier after the ':'), e.g. 'build'"
    return None


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the folder was removed under the process
        return None


def _keep_cwd(cwd: str | None, mod_name: str) -> None:
    """A module that changes the working directory as it is imported would move every relative path of the run
    (run.out_dir, data files) somewhere the user does not look: changed back, with a warning."""
    from turbotrain.log import say

    now = _cwd()
    if cwd is None or now == cwd:
        return
    try:
        os.chdir(cwd)
    except OSError:
        return
    else:
        say(f"warning: importing {mod_name!r} changed the working directory to {now}; turbotrain changed it back "
            f"to {cwd}, which relative paths in the config are read from")


def _not_users(mod_name: str) -> str:
    """"; 'json' is imported from .../json/__init__.py, not your ./json.py ...": the user's module shadowed by one
    of the standard library or an installed package of the same name (imported first, or already), or ""."""
    top = sys.modules.get(mod_name.partition(".")[0])
    if top is None or (getattr(top, "__file__", None) is None and hasattr(top, "__path__")):  # a namespace package
        return ""
    file = getattr(top, "__file__", None)
    file = os.path.realpath(file) if file else None  # real paths: one file reached through a link is no other
    for folder in sys.path:
        for mine in (os.path.join(folder or ".", f"{top.__name__}.py"),
                     os.path.join(folder or ".", top.__name__, "__init__.py")):
            if os.path.isfile(mine) and os.path.realpath(mine) != file:
                return (f"; {top.__name__!r} is {f'imported from {file}' if file else 'built into Python'}, not your "
                        f"{mine}: a module of the standard library or an installed package has that name, rename "
                        "yours")
    return ""


def factory_label(fn: Any) -> str:
    """`turbotrain.models.gpt:build`, `userpkg.data:regression`: how a message names a factory."""
    return (f"{getattr(fn, '__module__', None) or '?'}:"
            f"{getattr(fn, '__qualname__', None) or getattr(fn, '__name__', 'factory')}")


def argument_names(fn: Any, n_positional: int = 0) -> list[str] | None:
    """The keyword arguments `fn` accepts after its first `n_positional`; None if it takes **kwargs or has
    no signature."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    names, skipped = [], 0
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and skipped < n_positional:
            skipped += 1
            continue
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names.append(p.name)
    return names


def _check_positional(fn: Any, key: str, args: tuple, kwargs: dict) -> None:
    """A factory that cannot take the positional arguments it is always called with (an optimizer factory without
    its param_groups), or whose first parameters, taking them, are also given by keyword: said as such, not as
    "too many positional arguments; it takes no {key}" or "multiple values for argument 'lr'", which blame the
    config's keywords."""
    if not args:
        return
    try:
        bound = inspect.signature(fn).bind_partial(*args)
    except TypeError as e:
        problem = f"cannot take {'them' if len(args) > 1 else 'it'} ({e})"
    except ValueError:  # no signature to check (some builtins)
        return
    else:
        taken = [name for name in bound.arguments if name in kwargs]
        if not taken:
            return
        goes = "they go" if len(args) > 1 else "it goes"
        problem = f"{goes} to {', '.join(map(repr, taken))}, which {key} sets too"
    given = ", ".join(type(a).__name__ for a in args)
    raise UserError(f"{key}: {factory_label(fn)}() is called with {len(args)} positional argument"
                    f"{'s' * (len(args) > 1)} first ({given}) and {problem}; give it "
                    f"{'those first parameters' if len(args) > 1 else 'a first parameter for it'}")


def _check_declared_numbers(fn: Any, key: str, kwargs: dict) -> None:
    """A config value of another kind than the number the user's factory declares (`dim: int` given 8.0 or true,
    `p: float` given true): else it fails deep in their code ("empty(): argument 'size' ... got float", "fix it
    there") or passes unseen (True taken as 1), where the fix is the config's value."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    for name, value in kwargs.items():
        p = params.get(name)
        declared = p.annotation if p is not None else None
        declared = {"int": int, "float": float}.get(declared, declared) if isinstance(declared, str) else declared
        if declared not in (int, float):
            continue
        shown = str(value).lower() if isinstance(value, bool) else repr(value)
        if isinstance(value, (bool, str)):  # other kinds (a dataset's numpy integer filled in) are left to the call
            raise UserError(f"{key}.{name} = {shown}: {factory_label(fn)}() declares {name}: {declared.__name__}; "
                            f"give a number")
        if declared is int and isinstance(value, float):
            fix = ("give a whole number" if not value.is_integer() else f"write {int(value)}"
                   if -2**63 <= value < 2**63 else "give a whole number of 64 bits at most")
            raise UserError(f"{key}.{name} = {shown}: {factory_label(fn)}() declares {name}: int; {fix}")


def call_factory(fn: Any, key: str, *args: Any, **kwargs: Any) -> Any:
    """Call a user or built-in factory; a wrong or missing keyword becomes one config error that names the
    factory and lists the arguments it takes (`key` is the section, e.g. "model.args")."""
    _check_positional(fn, key, args, kwargs)
    try:  # check the call against the signature only: a TypeError inside the user's code stays theirs
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        valid = argument_names(fn, len(args))
        takes = f"valid {key}: {', '.join(valid)}" if valid else f"it takes no {key}" if valid == [] else ""
        from turbotrain.config import did_you_mean

        wrong = next((k for k in kwargs if valid and k not in valid), None)
        if wrong is not None and (close := did_you_mean(wrong, valid)):
            takes = f"{key}.{wrong}{close}; {takes}"
        raise UserError(f"{key}: {factory_label(fn)}() {e}" + (f"; {takes}" if takes else "")) from None
    except ValueError:  # no signature to check (some builtins)
        pass
    if (getattr(fn, "__module__", None) or "").startswith("turbotrain."):
        return fn(*args, **kwargs)  # a built-in factory raises its own UserErrors; anything else is a bug of ours
    _check_declared_numbers(fn, key, kwargs)
    return call_user(fn, f"{key.replace('.args', '.name')} = {factory_label(fn)!r}", *args, **kwargs)


_OURS = os.path.dirname(os.path.abspath(__file__))
_USER_ROOTS: set[str] = set()  # folders of the packages a config named ("mypkg" of "mypkg.models:build")


def _note_user_package(mod_name: str) -> None:
    """Remember where the package of a config's `pkg.module:name` lives, installed or not: a frame there is the
    user's even inside site-packages (a pip-installed package of their own)."""
    top = sys.modules.get(mod_name.partition(".")[0])
    if top is None or top.__name__ in ("turbotrain", "torch"):
        return
    paths = list(getattr(top, "__path__", None) or []) or [getattr(top, "__file__", None) or ""]
    _USER_ROOTS.update(os.path.abspath(p) for p in paths if p)


def _installed_roots() -> tuple[str, ...]:
    """The interpreter's library folders: the standard library and every site/dist-packages folder (Debian's
    and NVIDIA's containers install torch under dist-packages)."""
    roots = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= set(getattr(site, "getsitepackages", lambda: [])())
    roots.add(getattr(site, "getusersitepackages", lambda: "")())
    roots.add(os.path.dirname(os.__file__))
    return tuple(os.path.abspath(r) for r in roots if r)


def _users_frame(filename: str) -> bool:
    path = os.path.abspath(filename)
    if any(path.startswith(root + os.sep) or path == root for root in _USER_ROOTS):
        return True
    if filename.startswith("<") or path.startswith(_OURS + os.sep):
        return False
    parts = path.split(os.sep)
    return "site-packages" not in parts and "dist-packages" not in parts and not path.startswith(_installed_roots())


def where(e: BaseException) -> str:
    """" (at file.py:LINE)": the innermost frame of the traceback in the user's own code (a package the config
    names, or any file outside turbotrain, the standard library and installed packages), or "" when there is
    none."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if _users_frame(f.filename)]
    return f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""


def users_exit(e: SystemExit, command: str = "train") -> str | None:
    """The one line for a sys.exit() that the user's own code called where turbotrain did not guard the call (their
    model's forward, their loss or metric, a dataset read), or None for an exit of turbotrain's own (a signal stop's
    128 + signum): unsaid, it would end the run early with that code, 0 reading as a finished run."""
    if not any(_users_frame(f.filename) for f in traceback.extract_tb(e.__traceback__)):
        return None
    return (f"your code called sys.exit({e.code!r}){where(e)}: `turbotrain {command}` did not finish (checkpoints "
            "saved so far are kept); your code must return or raise, not exit the process")


def call_user(fn: Any, who: str, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` where fn is the user's code: an exception raised in it becomes one UserError
    naming `who` (e.g. "train.callbacks: mypkg.cbs:Log.on_log"), the exception and the line of the user's
    file it came from. UserError and out-of-memory pass through (the CLI reports those itself)."""
    import torch

    try:
        return fn(*args, **kwargs)
    except (UserError, torch.OutOfMemoryError, MemoryError):
        raise
    except SystemExit as e:  # else it would pass for the signal stop's exit: a run ending early without a word
        raise UserError(f"{who} called sys.exit({e.code!r}){where(e)}: the run is not finished (checkpoints saved "
                        "so far are kept); your code must return or raise, not exit the process") from None
    except Exception as e:
        text = " ".join(str(e).split())[:200] or "(no message)"
        raise UserError(f"{who} raised {type(e).__name__}: {text}{where(e)}; fix it there") from e
