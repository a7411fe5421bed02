"""The DataLoader path with a worker process feeds the same batches as the device-resident path."""
import torch

from turbotrain.data.datasets import synthetic
from turbotrain.data.loader import Batches, StepSampler

CPU = torch.device("cpu")


def test_device_resident_and_dataloader_paths_feed_the_same_batches():
    ds = synthetic("train", kind="images", size=64, shape=(3, 8, 8), num_classes=5)
    resident = Batches(ds, StepSampler(64, 8, 2, seed=0), CPU, resident=True)
    loader = Batches(ds, StepSampler(64, 8, 2, seed=0), CPU, resident=False,
                     settings=dict(num_workers=1, pin_memory=False, prefetch_factor=2, persistent_workers=False))
    for _ in range(10):
        (xa, ya), (xb, yb) = next(resident), next(loader)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert loader.wait_s > 0
