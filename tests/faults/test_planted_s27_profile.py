"""Planted cases of `profile`'s fourth pass, on a data-bound step: a loader whose cost is collating large items
was told to make __getitem__ cheaper (its items are already in-memory tensors: an index each) and to produce
in-memory tensors; cheap items handed over from a loader worker, the wait all in the hand-over, were told to make
__getitem__ cheaper, to add workers or cores: the fix is data.num_workers=0. The loader's read is now measured in
the training process, items apart from their collation, and weighed against the step's data wait. Verdicts and
advice are asserted by kind and key; where a number decides, the plant makes it 10x or more."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from tests.faults.common import BASE_TOML, lit
from tests.faults.test_planted_s22 import check_report
from tests.integration.test_profile_verdicts import _fake_run, _shares
from turbotrain import profile as prof
from turbotrain.cli import main

pytestmark = pytest.mark.usefixtures("userpkg_importable")

PKG = "userpkg.planted_s27_profile"
GETITEM = "make the dataset's __getitem__ cheaper"
COLLATE = "make the items cheaper to collate"


def _profile(tmp_path, *overrides, base=('train.loss="cross_entropy"', "data.args={}", "model.args={}")) -> dict:
    argv = [str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *base, *overrides]
    assert main(["profile", "--active", "3", *argv]) == 0
    out = tmp_path / "fault" / "profile"
    report = json.loads((out / "report.json").read_text())
    check_report(report, (out / "report.md").read_text(), argv)
    return report


def _dos(recs: list[dict]) -> list[str]:
    return [r["do"] for r in recs if not r["set"]]


def _sets(recs: list[dict]) -> list[str]:
    return [r["set"] for r in recs if r["set"]]


# ---------------------------------------------------------------- collation, not the items' reads

def test_a_loader_bound_by_collating_large_items_is_told_so(tmp_path):
    # 64 views of 768 KiB images a batch: an index per item, a 48 MiB copy to collate them; forward reads 3 pixels
    report = _profile(tmp_path, f'data.name="{PKG}:big_items"', f'model.name="{PKG}:corner"', "data.batch_size=64",
                      "data.num_workers=0")
    assert report["verdict"] == "data-bound"
    split = report["loader_split_ms"]
    assert split["collate_ms"] > split["items_ms"], split
    recs = report["recommendations"]
    assert recs[0]["set"].startswith("data.num_workers=")  # workers collate in parallel: still the first lever
    assert COLLATE in _dos(recs) and GETITEM not in _dos(recs)
    md = (tmp_path / "fault" / "profile" / "report.md").read_text()
    assert "is collating its items into one batch, not reading them" in md


def test_slow_items_keep_the_getitem_advice(tmp_path):
    # 10 ms of sleep per item against collating 8 vectors of 32 floats
    report = _profile(tmp_path, 'data.name="userpkg.planted_s22:items"', 'model.name="userpkg.planted_s22:small"',
                      "data.args={delay=0.01}", "data.num_workers=0")
    assert report["verdict"] == "data-bound"
    assert report["loader_split_ms"]["items_ms"] > 10 * report["loader_split_ms"]["collate_ms"]
    assert GETITEM in _dos(report["recommendations"]) and COLLATE not in _dos(report["recommendations"])


@pytest.mark.parametrize("items_ms, collate_ms, tip", [(1.0, 30.0, COLLATE), (30.0, 1.0, GETITEM)])
def test_the_tip_follows_the_larger_part_of_the_read(items_ms, collate_ms, tip):
    split = {"items_ms": items_ms, "collate_ms": collate_ms, "wait_ms": items_ms + collate_ms}
    _, recs = prof.verdict(_shares(data_wait=0.8), _fake_run(workers=0), {}, split=split)
    assert tip in _dos(recs) and ({COLLATE, GETITEM} - {tip}).isdisjoint(_dos(recs))


# ---------------------------------------------------------------- a worker's hand-over, not the dataset

def test_cheap_items_from_a_worker_are_told_to_read_in_process(tmp_path):
    # fault.toml's 8 rows of 8 floats a batch (tens of µs in this process) against a worker's hand-over (about a ms),
    # beside a linear model's step of a few hundred µs
    report = _profile(tmp_path, "data.num_workers=1", base=())
    split = report["loader_split_ms"]
    assert split["wait_ms"] >= prof.HANDOFF * (split["items_ms"] + split["collate_ms"]), split
    if report["verdict"] == "data-bound":  # the wait the plant makes; a loaded machine may slow compute past it
        recs = report["recommendations"]
        assert recs[0]["set"] == "data.num_workers=0", recs
        assert GETITEM not in _dos(recs) and "more CPU cores for the loader" not in _dos(recs)


@pytest.mark.parametrize("workers", [1, 2, 8])
def test_a_wait_the_read_cannot_explain_is_the_hand_over(workers):
    split = {"items_ms": 0.05, "collate_ms": 0.01, "wait_ms": 3.0}
    kind, recs = prof.verdict(_shares(data_wait=0.7), _fake_run(workers=workers), {}, split=split)
    assert kind == "data-bound" and recs[0]["set"] == "data.num_workers=0"
    assert not any(s.startswith("data.num_workers=") and s != "data.num_workers=0" for s in _sets(recs))
    assert GETITEM not in _dos(recs) and "more CPU cores for the loader" not in _dos(recs)


@pytest.mark.parametrize("workers, wait_ms", [(1, 12.0), (4, 3.0), (0, 30.0)])
def test_workers_slower_than_the_step_are_no_hand_over(workers, wait_ms):
    """A wait within a few reads is the workers' reading (or no workers at all): num_workers=0 would make it worse."""
    split = {"items_ms": 9.0, "collate_ms": 1.0, "wait_ms": wait_ms}
    _, recs = prof.verdict(_shares(data_wait=0.7), _fake_run(workers=workers), {}, split=split)
    assert "data.num_workers=0" not in _sets(recs)
    assert GETITEM in _dos(recs)


def test_the_read_is_not_measured_where_there_is_no_loader_or_it_fails():
    assert prof.loader_split(SimpleNamespace(batches=SimpleNamespace(loader=None, resident=True))) is None

    class Broken(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            raise OSError("the mount went away")
    sampler = SimpleNamespace(start_step=0, world=1, rank=0, step_indices=lambda s: [torch.arange(4)],
                              read_seed=lambda s, slot: 0)
    loader = SimpleNamespace(dataset=Broken(), collate_fn=lambda b: b)
    assert prof.loader_split(SimpleNamespace(batches=SimpleNamespace(loader=loader, sampler=sampler))) is None


def test_the_dataset_is_read_again_only_where_data_is_a_stall():
    """A slow dataset's read is paid once more for the advice: not where no data advice is given."""
    reads = []

    class Counted(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            reads.append(i)
            return torch.zeros(4), 0
    sampler = SimpleNamespace(start_step=0, world=1, rank=0, step_indices=lambda s: [torch.arange(4)],
                              read_seed=lambda s, slot: 0)
    run = SimpleNamespace(batches=SimpleNamespace(loader=SimpleNamespace(dataset=Counted(), collate_fn=list),
                                                  sampler=sampler))
    assert prof._loader_read(run, _shares(data_wait=0.05), 0.001) is None and not reads
    split = prof._loader_read(run, _shares(data_wait=0.5), 0.002)
    assert reads and split["wait_ms"] == pytest.approx(2.0) and split["items_ms"] >= 0
