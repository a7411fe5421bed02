"""The run: its name, where its directory lives, its seed and device (the `[run]` section)."""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from turbotrain.errors import UserError
from turbotrain.files import path_arg


@dataclass
class RunConfig:
    name: str = "run"
    """Run directory name under out_dir."""
    out_dir: str = "runs"
    """Folder that holds the run directories."""
    seed: int = 0
    """Seed of every generator: same seed, same initial weights and data order."""
    device: str = "auto"
    """"auto" (a GPU when there is one) | "cpu" | "cuda" | "cuda:N"."""

    def __post_init__(self) -> None:
        ok = self.device in ("auto", "cpu", "cuda") or (self.device.startswith("cuda:") and self.device[5:].isdigit())
        if not ok:
            raise UserError(f"run.device = {self.device!r}: expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"")
        problem = self.name_problem(self.name)
        if problem:
            raise UserError(f"run.name = {self.name!r}: {problem}; {self.NAME_RULE}")
        if not self.out_dir.strip():
            raise UserError('run.out_dir = "": must name a folder ("." for the current one)')
        if any(ord(c) < 32 or ord(c) == 127 for c in self.out_dir):
            raise UserError(f"run.out_dir = {self.out_dir!r}: must be a path without control characters")
        if (problem := fs_name_problem(self.out_dir)) is not None:
            raise UserError(f"run.out_dir = {self.out_dir!r}: {problem}")
        self.out_dir = str(path_arg("run.out_dir", self.out_dir))  # "~/runs" is the home's, not a folder "~"
        if not 0 <= self.seed < 2**32:
            raise UserError(f"run.seed = {self.seed}: must be in 0 .. 2**32-1 (numpy's seed range)")

    NAME_MAX = 128  # a folder name, with room for what bench, scale and tune append to it
    NAME_RULE = (f"a run name is 1-{NAME_MAX} letters, digits, spaces and ._-+=@, characters, "
                 f"not '.' or '..', not starting with '-' or a space, at most {NAME_MAX} bytes as a file name")
    NAME_PUNCT = " ._-+=@,"

    @classmethod
    def name_char_ok(cls, c: str) -> bool:
        return (c.isalnum() and c.isprintable()) or c in cls.NAME_PUNCT

    @classmethod
    def name_problem(cls, name: str) -> str | None:
        """Why `name` cannot name a run directory (None: it can); the rule is NAME_RULE."""
        if not name:
            return "is empty"
        if name in (".", ".."):
            return "names a parent or current folder"
        if len(name) > cls.NAME_MAX:
            return f"is {len(name)} characters long"
        if name[0] in "- " or name[-1] == " ":
            return "starts with '-' or starts/ends with a space"
        bad = sorted({c for c in name if not cls.name_char_ok(c)})
        if bad:
            return "contains " + ", ".join(repr(c) for c in bad)
        return fs_name_problem(name, cls.NAME_MAX)


def fs_name_problem(text: str, max_bytes: int | None = None) -> str | None:
    """Why `text` cannot be a file name on this system though its characters are fine: the file system counts
    bytes in its own encoding (a 100-character CJK name is 300 bytes, past the 255 a folder name may have) and
    an ASCII locale cannot spell "é" at all (mkdir would raise UnicodeEncodeError)."""
    enc = sys.getfilesystemencoding()
    try:
        size = len(text.encode(enc, "surrogateescape"))
    except UnicodeEncodeError:
        return (f"cannot be spelt in this system's file-name encoding ({enc}); use ASCII characters, or run under "
                "a UTF-8 locale (LANG=C.UTF-8)")
    if max_bytes is not None and size > max_bytes:
        return f"is {size} bytes long in {enc}"
    return None


# ---------------------------------------------------------------- the run directory

# what a run writes into its directory (a fresh run sets an earlier run's aside, whole), and `turbotrain export`'s
# default export/ of its weights: left beside a fresh run's final/, it would hand out the earlier run's model
RUN_FILES = ("config.toml", "hf_config.json", "metrics.jsonl", "summary.json", "alerts.jsonl",
             "alerts_undelivered.jsonl", "tb", "checkpoints", "final", "metrics.csv", "wandb", "mlflow", "report.png",
             "report.md", "export")


def open_run_file(path: Path, mode: str = "w"):
    """Open a file of the run directory for writing without following a symlink: a link planted (or left)
    there must never redirect a write to a file outside the run. Modes "w" and "a" (text)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    try:
        fd = regular_fd(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserError(f"{path} is a symbolic link; turbotrain does not write through links in a run "
                            f"directory: remove it or choose another run.name") from None
        raise UserError(f"cannot write {path} ({e.strerror}); {write_fix(e)}") from None
    return os.fdopen(fd, mode, encoding="utf-8")  # read back as UTF-8 (tomllib, json) whatever the locale


def regular_fd(path: Path, flags: int) -> int:
    """`os.open(path, flags)` of a regular file: a FIFO, socket or device planted where a run file goes is
    refused (OSError EINVAL) instead of blocking the open forever (a FIFO without a reader) or failing later."""
    import stat

    fd = os.open(path, flags | os.O_NONBLOCK, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return fd


def write_fix(e: OSError) -> str:
    """The fix for a write that failed with `e`: a file-size limit is not cured by freeing space."""
    if e.errno == errno.EFBIG:
        return "that is the session's file-size limit, not a lack of free space: raise it (ulimit -f unlimited)"
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return "too many open files: raise the limit (ulimit -n 4096) or lower data.num_workers"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "set run.out_dir to a folder you can write"
    return "free space under run.out_dir or choose another one"


@contextlib.contextmanager
def moving_aside(what: str, dest: Path):
    """A block that moves an earlier run's files into `dest`: a move the filesystem refuses (a full disk for the new
    folder, a read-only or foreign-owned folder) is one UserError; the renames are atomic, so each file is whole in
    one place or the other, nothing deleted."""
    try:
        yield
    except OSError as e:
        raise UserError(f"cannot move {what} aside to {dest} ({e.strerror or e}; nothing was deleted: each file is in "
                        f"its old place or there); {write_fix(e)}") from None


def write_run_file(path: Path, text: str) -> None:
    """Write a whole file of the run directory atomically (temp file, then rename), never through a link."""
    tmp = path.with_name(f".{path.name}.tmp")
    if tmp.is_symlink():
        tmp.unlink()
    try:
        with open_run_file(tmp) as f:
            f.write(text)
    except OSError as e:  # a full disk (ENOSPC at write or at close): the old file stays whole
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {path} ({e.strerror or e}); {write_fix(e)}") from None
    if path.is_symlink():
        raise UserError(f"{path} is a symbolic link; turbotrain does not write through links in a run "
                        f"directory: remove it or choose another run.name")
    try:
        os.replace(tmp, path)
    except OSError as e:  # e.g. a folder where the file goes
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {path} ({e.strerror or e}); remove what is there or choose another "
                        "run.name") from None


_HELD_LOCKS: set[int] = set()  # this process's run-directory lock descriptors


def _drop_locks_in_child() -> None:
    """A forked child (a DataLoader worker) shares the lock's open file, and the kernel drops a flock only when
    every copy is closed: a worker orphaned by a killed run would hold the directory until it noticed."""
    for fd in _HELD_LOCKS:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_drop_locks_in_child)


class RunDir:
    """`{out_dir}/{name}/`, held by one run at a time: rank 0 takes an exclusive lock (flock) that the
    kernel drops when the process ends (forked children keep no copy), so a crashed run never leaves the
    directory stuck."""

    def __init__(self, cfg: RunConfig, is_main: bool):
        self.path, self.is_main, self._lock = Path(cfg.out_dir) / cfg.name, is_main, None

    def open(self) -> "RunDir":
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            fix = {errno.EEXIST: f"{self.path} is a file or a link, not a folder: move it aside or choose another "
                                 f"run.name",
                   errno.ENOTDIR: "a file in run.out_dir's path is in the way: choose another run.out_dir",
                   errno.ENOSPC: "free space there or choose another run.out_dir"}.get(
                e.errno, "set run.out_dir to a folder you can write")
            raise UserError(f"run.out_dir: cannot create {self.path} ({e.strerror or e}); {fix}") from None
        for name in ("tb", "checkpoints", "final"):
            if (self.path / name).is_symlink():
                raise UserError(f"{self.path / name} is a symbolic link; turbotrain does not write through links "
                                f"in a run directory: remove it or choose another run.name")
        if self.is_main:
            self._take_lock()
        return self

    def _take_lock(self) -> None:
        import fcntl

        try:
            fd = regular_fd(self.path / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
        except OSError as e:  # a folder, a link or an unwritable directory where the lock goes
            fix = ("set run.out_dir to a writable folder" if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
                   else "remove it or choose another run.name")
            raise UserError(f"cannot take the lock {self.path / '.lock'} ({e.strerror or e}); {fix}") from None
        for attempt in range(4):  # `watch` and `report` hold a shared lock for an instant: not another run
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if attempt == 3:
                    os.close(fd)
                    raise UserError(f"run directory {self.path} is in use by another run; wait for it, or choose "
                                    f"another run.name") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self._lock = fd
        _HELD_LOCKS.add(fd)

    def release(self) -> None:
        if self._lock is not None:
            _HELD_LOCKS.discard(self._lock)
            os.close(self._lock)  # closing the descriptor drops the flock
            self._lock = None

    @staticmethod
    def lock_held(path: Path) -> bool | None:
        """Whether a live run holds the lock of the run directory `path` (for watch and report): True, False, or
        None when it cannot be told (the lock unreadable, no lock support on the filesystem). Creates and writes
        nothing: it tries a shared flock on a read-only descriptor and drops it at once (the kernel, or NFS's
        lock manager for a run on another machine, answers for the live holder)."""
        import fcntl

        try:  # O_NONBLOCK: a FIFO planted as .lock must not hang the open
            fd = os.open(path / ".lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:  # none, or a link (_take_lock refuses links: no run can hold it)
            return False if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR) else None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        except OSError as e:
            return True if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
        finally:
            os.close(fd)

    @staticmethod
    def lock_holder(path: Path) -> str:
        """" (pid N on HOST)" of the run holding the lock of `path`, as it wrote itself there, or "" (unreadable).
        Read without following a link or blocking on a FIFO."""
        try:
            fd = os.open(path / ".lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd) as f:
                pid, host = (f.read(300).split() + ["", ""])[:2]
        except (OSError, ValueError):
            return ""
        if not pid.isdigit():
            return ""
        return f" (pid {pid}" + (f" on {host}" if host and host != socket.gethostname() else "") + ")"

    def holds_earlier_run(self) -> bool:
        return any((self.path / name).exists() for name in RUN_FILES)

    def set_aside(self) -> Path | None:
        """A fresh run in a directory that holds an earlier run: move the earlier run's files into
        `previous-N/` (kept whole, never deleted or mixed with the new run's)."""
        if not self.holds_earlier_run():
            return None
        n = 1
        while (dest := self.path / f"previous-{n}").exists():
            n += 1
        with moving_aside("the earlier run", dest):
            dest.mkdir()
            for name in RUN_FILES:
                if (self.path / name).exists() or (self.path / name).is_symlink():
                    os.replace(self.path / name, dest / name)
        return dest

    def trim_metrics(self, step: int) -> None:
        """On resume keep the rows up to the checkpoint's step: the steps after it are redone."""
        path = self.path / "metrics.jsonl"
        if not path.exists() or path.is_symlink():
            return
        try:
            with os.fdopen(regular_fd(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                data = f.read()
        except OSError as e:  # a folder where metrics.jsonl goes; a FIFO, whose read would wait for a writer
            raise UserError(f"cannot read {path} ({e.strerror or e}); move it aside to resume this run") from None
        kept = []
        for line in data.splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a line cut short by a crash mid-write, or damaged bytes
                continue
            if isinstance(row, dict) and isinstance(row.get("step", 0), (int, float)) and row.get("step", 0) <= step:
                kept.append(strict_json(row))  # strict JSON again: an older run's rows may hold a bare NaN
        write_run_file(path, "".join(r + "\n" for r in kept))


# ---------------------------------------------------------------- strict JSON

def finite_json(obj: dict) -> dict:
    """`obj` as strict JSON holds it: every NaN/inf float (at any depth) becomes null, and the top-level ones are
    named in "nonfinite" (`{"loss": null, "nonfinite": {"loss": "NaN"}}`), so a reader (report and watch: see
    report._restored) still tells a loss that went NaN from one not logged. Python's json would write a bare `NaN` or
    `Infinity`, which jq, JavaScript and strict parsers refuse: one such row would make the whole file unreadable."""
    marks = {k: _spelling(v) for k, v in obj.items() if isinstance(v, float) and not math.isfinite(v)}
    out = {k: _nulled(v) for k, v in obj.items()}
    if marks:
        out["nonfinite"] = marks
    return out


def strict_json(obj: dict, indent: int | None = None) -> str:
    """A JSON object of a run file (metrics.jsonl, alerts.jsonl, summary.json, a webhook's body), strict: no NaN/inf."""
    return json.dumps(finite_json(obj), indent=indent, allow_nan=False)


def _spelling(v: float) -> str:
    return "NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity"  # what float() reads back


def _nulled(v):
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _nulled(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_nulled(x) for x in v]
    return v


# ---------------------------------------------------------------- multi-node: one run directory for all ranks

SHARED_FS_TOKEN = ".shared-fs-check"


def check_shared_run_dir(path: Path, rank: int, world_size: int, wait_s: float = 3.0) -> None:
    """Refuse a run whose ranks do not all see the same run directory (multi-node with run.out_dir on each
    node's local disk): checkpoints and the resume would silently split between disks. Rank 0 writes a token
    holding a random nonce and broadcasts the nonce; every rank reads the token; if any rank does not see it,
    every rank raises the same one-line UserError. Rank 0 removes the token either way: nothing is left behind.
    Collective (every rank calls it) after `RunDir.open()` and before anything else is written; a no-op
    without a process group. Usage: `check_shared_run_dir(rundir.path, env.rank, env.world_size)`."""
    import secrets
    import time

    import torch.distributed as dist

    if world_size <= 1 or not dist.is_initialized():
        return
    token = path / SHARED_FS_TOKEN
    head = [secrets.token_hex(16), str(path.resolve()), socket.gethostname()] if rank == 0 else [None, None, None]
    try:
        if rank == 0:
            with open_run_file(token) as f:
                f.write(head[0])
        dist.broadcast_object_list(head, src=0)  # rank 0 wrote the token before this returns anywhere
        nonce, where, head_host = head
        deadline = time.monotonic() + wait_s
        while not (seen := _holds(token, nonce)) and time.monotonic() < deadline:
            time.sleep(0.25)  # NFS may cache a missing entry for a moment; look again
        views: list = [None] * world_size
        dist.all_gather_object(views, (seen, socket.gethostname()))
    finally:
        if rank == 0:
            token.unlink(missing_ok=True)
    blind = [f"{r} ({host})" for r, (ok, host) in enumerate(views) if not ok]
    if blind:
        raise UserError(f"run.out_dir is not shared: rank(s) {', '.join(blind)} do not see the run directory "
                        f"{where} that rank 0 ({head_host}) created; a multi-node run needs run.out_dir on a "
                        f"filesystem every node mounts at the same path (NFS, Lustre, ...), given as an absolute path")


def _holds(token: Path, nonce: str) -> bool:
    try:
        return token.read_text().strip() == nonce
    except OSError:
        return False
