"""The step sampler: the samples of step k are the same whatever the world size or micro split."""
import pytest

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


@pytest.mark.parametrize("n_samples, world", [(39 * 8, 2), (10 * 8, 3), (8, 2)])
def test_eval_batches_are_dealt_evenly(n_samples, world):
    """Every rank gets the same number of val micro-batches (FSDP's forward is a collective), and no
    sample is seen twice."""
    from turbotrain.data.loader import eval_batches

    ds = list(range(n_samples))
    per_rank = [eval_batches(ds, 8, 100, r, world) for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1
    seen = [i for b in per_rank for idx in b for i in idx.tolist()]
    assert len(seen) == len(set(seen)) == len(per_rank[0]) * world * 8
