import os
import sys
from pathlib import Path

# CPU matmuls reproducible across the processes of one test (a run, its kill, its resume): MKL may pick its code
# path by the data's memory alignment (MKL_CBWR) and its thread count by the machine's load (MKL_DYNAMIC,
# OMP_DYNAMIC), either a different summation order in runs that must match bit for bit (benchmarks/NOTES.md,
# session 18: suspected, not proven).
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")
os.environ.setdefault("MKL_DYNAMIC", "FALSE")
os.environ.setdefault("OMP_DYNAMIC", "FALSE")

import pytest  # noqa: E402
import torch  # noqa: E402

# The user-code package tests/userpkg imports as `userpkg` (turbotrain sees it only through "userpkg.x:y"
# strings): tests/ goes on sys.path for in-process runs; subprocesses get it via tests.helpers.userpkg_env().
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.append(_TESTS)  # appended: tests/ must not shadow installed modules


@pytest.fixture
def userpkg_importable(monkeypatch):
    """tests/ first on sys.path for the test (the CLI in-process puts the current directory first), so
    "userpkg.x:y" strings import. Usage: `pytestmark = pytest.mark.usefixtures("userpkg_importable")`."""
    monkeypatch.syspath_prepend(_TESTS)


@pytest.fixture(autouse=True)
def _isolate(monkeypatch):
    """Each test starts with dynamo reset, default TF32 flags and the process env restored."""
    saved = dict(os.environ)
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)
