"""Planted cases of `profile`'s third pass: a forward that hands tensor values to Python (`.tolist()`,
`.numpy()`, `.cpu().numpy()`) was counted as no host read on a CPU (no read op runs there), so its reads went
unnamed; a forward whose time is all in one layer got a bare compute-bound verdict with nothing to say which
layer; a callback's slow on_log at every step was left out of the report. Verdicts are asserted by kind, counts
and names, never by a timing share."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.faults.common import BASE_TOML, lit, step_events
from tests.faults.test_planted_s22 import check_report
from turbotrain import profile as prof
from turbotrain.cli import main
from turbotrain.profile import LAYER_BOUND, _layer_detail

pytestmark = pytest.mark.usefixtures("userpkg_importable")

PKG = "userpkg.planted_s26_profile"
ITEMS = ['data.name="userpkg.planted_s22:items"', "data.num_workers=0", 'train.loss="cross_entropy"',
         "data.args={}", "model.args={}"]
READS = "remove the host reads from the model and the loss"


def _profile(tmp_path, *overrides) -> dict:
    argv = [str(BASE_TOML), f"run.out_dir={lit(tmp_path)}", *ITEMS, *overrides]
    assert main(["profile", "--active", "3", *argv]) == 0
    out = tmp_path / "fault" / "profile"
    report = json.loads((out / "report.json").read_text())
    check_report(report, (out / "report.md").read_text(), argv)
    return report


def _dos(report: dict) -> list[str]:
    return [r["do"] for r in report["recommendations"] if not r["set"]]


# ---------------------------------------------------------------- values exported to Python are host reads

EXPORTS = {"tolist": lambda h: h.tolist(), "numpy": lambda h: h.detach().numpy(),
           "cpu_numpy": lambda h: h.detach().cpu().numpy(), "np_asarray": lambda h: np.asarray(h.detach())}


@pytest.mark.parametrize("how", sorted(EXPORTS))
def test_values_exported_to_python_are_host_reads(how):
    """On a GPU each export waits for the queue like .item(); on a CPU no read op runs, and the only trace is the
    resolve it starts with, called from Python rather than from inside an op."""
    w = torch.randn(32, 4, requires_grad=True)
    x = torch.randn(8, 32)

    def exported(n):
        def fn():
            h = x @ w
            for _ in range(n):
                EXPORTS[how](h)
            return h.sum()
        return fn
    assert prof.host_reads(step_events(exported(3)), 1) == 3
    assert prof.host_reads(step_events(exported(0)), 1) == 0


def test_ops_that_resolve_inside_are_no_reads():
    """Ops whose own work resolves conjugate/negative bits (a matmul, a loss, a complex view) read nothing."""
    w = torch.randn(32, 4, requires_grad=True)
    x = torch.randn(8, 32)

    def healthy():
        h = x @ w
        z = torch.view_as_complex(torch.randn(4, 2)).conj().resolve_conj()
        return torch.nn.functional.cross_entropy(h, torch.zeros(8, dtype=torch.long)) + z.real.sum() * 0
    assert prof.host_reads(step_events(healthy), 1) == 0


@pytest.mark.parametrize("how", ["tolist", "numpy"])
def test_a_forward_exporting_its_activations_is_told_to_remove_the_reads(tmp_path, how):
    report = _profile(tmp_path, f'model.name="{PKG}:exports"', f'model.args={{how="{how}", n=20}}')
    assert report["host_reads_per_step"] == 20  # a count: what the machine's load cannot move
    assert READS in _dos(report)
    if report["verdict"].startswith("host"):  # the host's own work: the reads are its first fix
        assert report["recommendations"][0]["do"] == READS


# ---------------------------------------------------------------- the one slow layer is named

def test_one_slow_layer_is_named_in_the_verdict_and_its_fix(tmp_path):
    # a 5x5 convolution over 96x96 images holds ~50x the arithmetic of the model's other layers together
    report = _profile(tmp_path, f'model.name="{PKG}:one_slow_layer"', "model.args={size=96}")
    assert report["verdict"] == "compute-bound"
    top = report["layers"][0]
    assert top["module"] == "slow" and top["type"].startswith("Conv2d(16, 64, kernel_size=(5, 5)")
    assert "of forward is `slow` (Conv2d(" in report["verdict_detail"]
    md = (tmp_path / "fault" / "profile" / "report.md").read_text()
    assert "Forward by layer (own time, measured apart): `slow` " in md


def test_no_layer_is_named_where_the_work_is_spread(tmp_path):
    """Four equal layers: none holds most of forward, so none is accused; each is still listed."""
    report = _profile(tmp_path, f'model.name="{PKG}:even_layers"', "data.batch_size=256")
    assert {la["module"] for la in report["layers"]} >= {"0", "1", "2", "3"}
    # the verdict is the machine's (a loaded one may read the loader as the bottleneck): the layer rule is not
    assert max(la["share_of_forward"] for la in report["layers"]) < LAYER_BOUND, report["layers"]
    assert _layer_detail(report["layers"], "compute-bound", "compute") == "compute"
    assert "of forward is" not in report["verdict_detail"]


def test_layers_are_own_times(tmp_path):
    """A parent's time excludes its children's: the big convolution is named, not the container around it."""
    report = _profile(tmp_path, f'model.name="{PKG}:nested_slow"')
    names = [la["module"] for la in report["layers"]]
    assert names[0] == "body.slow", names
    assert next(la for la in report["layers"] if la["module"] == "body")["share_of_forward"] < 0.5


# ---------------------------------------------------------------- a slow on_log is timed, not left out

def test_a_slow_on_log_at_every_step_is_log_bound(tmp_path):
    # 0.5 s of on_log at each step beside a 2-layer MLP's step of a few ms
    report = _profile(tmp_path, 'model.name="userpkg.planted_s22:small"', "train.log_every=1",
                      f'train.callbacks=["{PKG}:slow_log_half"]')
    assert report["verdict"] == "log-bound" and report["bottleneck"] == "log"
    assert report["loop"]["log"]["every"] == 1 and report["loop"]["log"]["ms_each"] >= 500
    first = report["recommendations"][0]["set"]
    assert first.startswith("train.log_every=") and int(first.split("=")[1]) > 1
    md = (tmp_path / "fault" / "profile" / "report.md").read_text()
    assert "callbacks' on_log " in md  # its ms, which a loaded machine's sleep may overshoot


def test_a_slow_on_log_logged_rarely_is_not_accused(tmp_path):
    report = _profile(tmp_path, 'model.name="userpkg.planted_s22:small"', "train.log_every=1000",
                      "train.steps=1000", f'train.callbacks=["{PKG}:slow_log"]')
    assert report["loop"]["log"]["every"] == 1000
    assert report["verdict"] != "log-bound"
    assert not any(r["set"].startswith("train.log_every=") for r in report["recommendations"])


def test_a_layer_called_many_times_a_forward_counts_every_call(tmp_path):
    report = _profile(tmp_path, f'model.name="{PKG}:shared_block"', "data.batch_size=256")
    names = [la["module"] for la in report["layers"]]
    assert names[0] == "shared", names
    if report["verdict"] == "compute-bound":  # the weight-shared layer is where forward's time goes
        assert "of forward is `shared` (Linear(" in report["verdict_detail"]


# ---------------------------------------------------------------- reads in a callback's on_step_end

def test_reads_in_a_callbacks_step_end_are_counted_and_named(tmp_path):
    # planted_s22:small has 4 parameters: 4 reads a step, each a wait for the device on a GPU
    report = _profile(tmp_path, 'model.name="userpkg.planted_s22:small"', f'train.callbacks=["{PKG}:reads_weights"]')
    assert report["callback_reads_per_step"] == 4
    assert report["host_reads_per_step"] == 0  # not the model's: its own advice is not given
    assert "move the host reads out of train.callbacks' on_step_end" in _dos(report)
    assert READS not in _dos(report)


def test_a_callback_without_reads_is_not_accused(tmp_path):
    report = _profile(tmp_path, 'model.name="userpkg.planted_s22:small"', f'train.callbacks=["{PKG}:slow_log"]')
    assert report["callback_reads_per_step"] == 0
    assert not any("train.callbacks' on_step_end" in d for d in _dos(report))
