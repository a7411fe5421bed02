"""File helpers: checksums, folders made with one-line errors, turbotrain's cache folder."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


def path_arg(key: str, value: str | os.PathLike) -> Path:
    """`value` as a Path with `~` expanded; a `~user` that names no account (or `~` without a home folder)
    is one UserError naming `key`, where pathlib raises RuntimeError (and os.path would keep "~user" as a
    folder name)."""
    from turbotrain.errors import UserError

    try:
        return Path(value).expanduser()
    except RuntimeError:
        raise UserError(f"{key} = {str(value)!r}: {str(value).split('/')[0]!r} names no home folder here; write "
                        "the path out in full") from None


def cache_root() -> Path:
    """turbotrain's cache folder (datasets, text tokens, compile artifacts): $TURBOTRAIN_CACHE, absolute (a
    relative one is taken from the current folder, once: tools that change folder must not move it), or
    ~/.cache/turbotrain when unset or empty."""
    return path_arg("TURBOTRAIN_CACHE", os.environ.get("TURBOTRAIN_CACHE") or "~/.cache/turbotrain").absolute()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make_dir(path: Path) -> Path:
    """`path` and its parents, created; a file in the way or a read-only parent is one UserError line."""
    from turbotrain.errors import UserError

    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the folder {path} ({e.strerror or e}); check run.out_dir and run.name") \
            from None
    return path


def room_left(path: Path) -> str:
    """"; N MiB free there" for the disk holding `path` (or its nearest existing folder), with "but no free
    inodes" when files, not bytes, ran out (ENOSPC says the same for both); "" when it cannot be read."""
    try:
        where = next(p for p in (path, *path.parents) if p.exists())
        st = os.statvfs(where)
    except (OSError, StopIteration, AttributeError):
        return ""
    inodes = " but no free inodes (too many files)" if st.f_files and not st.f_favail else ""
    return f"; {st.f_bavail * st.f_frsize / 2**20:.0f} MiB free there{inodes}"

