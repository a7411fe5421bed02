"""The step sampler: the samples of step k are the same whatever the world size or micro split."""
import pytest
import torch

from turbotrain.data.loader import StepSampler
from turbotrain.errors import UserError


def _step_set(step, micro, accum, world, n=100):
    out = []
    for rank in range(world):
        s = StepSampler(n, micro, accum, rank=rank, world=world, seed=3)
        out += [i for mb in s.step_indices(step) for i in mb.tolist()]
    return sorted(out)


@pytest.mark.parametrize("micro, accum, world", [(8, 1, 1), (4, 2, 1), (4, 1, 2), (2, 2, 2), (1, 4, 2)])
def test_global_batch_is_invariant(micro, accum, world):
    for step in (0, 1, 11, 12, 30):  # crosses epoch boundaries (12 steps of 8 in 100 samples)
        assert _step_set(step, micro, accum, world) == _step_set(step, 8, 1, 1)


def test_no_repeats_within_an_epoch_and_epochs_reshuffle():
    s = StepSampler(100, 8, 1, seed=0)
    epoch0 = [i for k in range(12) for i in s.step_indices(k)[0].tolist()]
    assert len(set(epoch0)) == 96
    epoch1 = [i for k in range(12, 24) for i in s.step_indices(k)[0].tolist()]
    assert epoch0 != epoch1


def test_iteration_resumes_at_a_step():
    full = iter(StepSampler(50, 5, 2, seed=1))
    batches = [next(full) for _ in range(10)]
    resumed = iter(StepSampler(50, 5, 2, seed=1, start_step=3))
    assert [next(resumed) for _ in range(4)] == batches[6:10]


def test_dataset_smaller_than_a_global_batch_is_refused():
    with pytest.raises(UserError, match="fewer than one global batch"):
        StepSampler(10, 8, 2)
