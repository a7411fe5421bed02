"""The lead's tests of session 27: changes made on helpers' reports, outside their scopes."""
from __future__ import annotations

import pytest

from turbotrain.errors import UserError
from turbotrain.monitor.rules import MonitorConfig


def test_webhook_retries_are_bounded():
    """Each try waits out its timeout: a billion tries would hold the first alert until the run ends."""
    with pytest.raises(UserError, match=r"^monitor.webhook_retries = 1000000000: at most 100 tries an alert$"):
        MonitorConfig(webhook_retries=1_000_000_000)
    assert MonitorConfig(webhook_retries=100).webhook_retries == 100


FAULT = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "userpkg" / "fault.toml")


@pytest.mark.usefixtures("userpkg_importable")
@pytest.mark.parametrize("factory, says, run_dir_made", [
    ("NoArgs", "it is called as factory(run_dir, start_step), which NoArgs() does not take", False),
    ("raising", "monitor.trackers: userpkg.lead_s27:raising raised RuntimeError: tracker service unreachable", True),
])
def test_a_tracker_factory_that_breaks_its_contract_is_one_error_line(tmp_path, capsys, factory, says, run_dir_made):
    from turbotrain.cli import main

    rc = main(["train", FAULT, f'monitor.trackers=["userpkg.lead_s27:{factory}"]', f"run.out_dir={str(tmp_path)!r}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error: ") and says in err[-1], err
    assert "Traceback" not in "\n".join(err)
    assert (tmp_path / "fault").exists() == run_dir_made  # a signature is checked before the run dir is made


def test_webhook_timeout_is_bounded():
    with pytest.raises(UserError, match=r"^monitor.webhook_timeout_s = 1e\+300: must be > 0 and at most 3600$"):
        MonitorConfig(webhook_timeout_s=1e300)


@pytest.mark.usefixtures("userpkg_importable")
@pytest.mark.parametrize("data, hint", [
    ("corrupt", "ValueError: record 4 is corrupt"),
    ("ragged", "every item must be an (inputs, targets) pair of the same shapes and dtypes"),
])
def test_a_dataset_failure_gets_the_hint_of_its_kind(tmp_path, capsys, data, hint):
    """A record the dataset cannot read is the dataset's to fix; the pair-of-same-shapes hint is for batching."""
    from turbotrain.cli import main

    rc = main(["train", FAULT, f'data.name="userpkg.lead_s27:{data}"', "data.eval_batches=0", "train.steps=8",
               f"run.out_dir={str(tmp_path)!r}"])  # 8 steps of 8: one epoch, the last item read whatever the order
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and hint in err[-1], err
    if data == "corrupt":
        assert "fix or skip that item in the dataset's code" in err[-1] and "same shapes" not in err[-1], err[-1]


def test_out_of_memory_is_recognised_from_libraries_and_through_a_wrapper():
    from turbotrain.step import _out_of_memory

    assert _out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"))
    assert _out_of_memory(RuntimeError("CUDA error: out of memory"))
    wrapped = RuntimeError("backend compiler failed")
    wrapped.__cause__ = MemoryError()
    assert _out_of_memory(wrapped) == "host memory"
    assert _out_of_memory(RuntimeError("shape mismatch")) is None


def test_a_traced_module_is_not_taken_for_an_uninitialised_one():
    import torch

    from turbotrain.models import check_initialised

    traced = torch.jit.trace(torch.nn.Linear(2, 2), torch.zeros(1, 2))
    check_initialised(torch.nn.Sequential(traced), "model.name")
    check_initialised(traced, "model.name")
