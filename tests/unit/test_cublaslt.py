"""models/cublaslt.py on a CPU: the timed choice's rule and what `matmul` hands back to torch. The GEMMs themselves
run in tests/integration/test_cublaslt_gpu.py."""
import math

import pytest
import torch

from turbotrain.models import cublaslt as lt


@pytest.mark.parametrize("times,want", [([1.0, 0.9, 0.95], 1), ([1.0, 0.98, 0.99], 0), ([1.0], 0),
                                        ([math.inf, 2.0, 1.5], 2), ([1.0, 1.2, 0.5, 0.96], 2),
                                        ([1.0, 1.01 - lt.MARGIN], 0), ([1.0, 0.90, 0.91], 1), ([1.0, 0.91, 0.90], 1),
                                        ([1.0, 1.1, 0.91, 0.90], 2)])
def test_the_earliest_candidate_within_the_margin_of_the_fastest_is_kept(times, want):
    """The first choice unless another is clearly faster; among near-ties the earliest, whatever the noise."""
    assert lt.pick(times) == want


@pytest.mark.parametrize("ptrs,want", [([256, 512], 256), ([256, 16 + 256], 16), ([128, 256], 128),
                                       ([64 * 3], 64), ([32], 32)])
def test_alignment_is_the_largest_power_of_two_of_every_pointer(ptrs, want):
    assert lt.alignment(ptrs) == want


def _on(device, *ts):
    """The tensors as `takes` sees them on `device` (is_cuda and device read from a stand-in; no GPU needed)."""
    where = torch.device(device)

    class T:
        def __init__(self, t):
            self.t = t

        def __getattr__(self, name):
            return getattr(self.t, name)

        is_cuda = where.type == "cuda"

        @property
        def device(self):
            return where
    return [T(t) for t in ts]


def test_what_cublaslt_cannot_take_goes_back_to_torch():
    """Checked before any library call: CPU tensors, fp32 inputs, mixed dtypes, a transposed view, sizes not
    multiples of 8, an empty product (k = 0 too), shapes that do not agree, an fp16 output of bf16 inputs."""
    bf = torch.bfloat16
    a, b, out = torch.zeros(16, 8, dtype=bf), torch.zeros(24, 8, dtype=bf), torch.zeros(16, 24, dtype=bf)
    assert lt.takes(*_on("cuda:0", out, a, b), a_t=False, b_t=True)  # the one that runs
    assert not lt.takes(out, a, b, a_t=False, b_t=True)  # CPU tensors
    assert lt.matmul(out, a, b, a_t=False, b_t=True, accumulate=False, setting="kernels.fused_loss") is False
    cases = [(out.float(), a.float(), b.float()), (out, a, b.half()), (out, a.t().contiguous().t(), b),
             (torch.zeros(16, 20, dtype=bf), a, torch.zeros(20, 8, dtype=bf)),
             (torch.zeros(0, 24, dtype=bf), torch.zeros(0, 8, dtype=bf), b),
             (out, torch.zeros(16, 0, dtype=bf), torch.zeros(24, 0, dtype=bf)),
             (out, a, torch.zeros(24, 16, dtype=bf)),  # k of a (8) is not b's (16): a wrong product, not a GEMM
             (out.half(), a, b)]
    for o, x, y in cases:
        assert not lt.takes(*_on("cuda:0", o, x, y), a_t=False, b_t=True)
    assert not lt.takes(*_on("cuda:0", out, a), *_on("cuda:1", b), a_t=False, b_t=True)  # two devices


def test_a_disallowed_reduced_precision_reduction_goes_back_to_torch():
    bf = torch.bfloat16
    args = _on("cuda:0", torch.zeros(16, 24, dtype=bf), torch.zeros(16, 8, dtype=bf), torch.zeros(24, 8, dtype=bf))
    flags = torch.backends.cuda.matmul
    before = flags.allow_bf16_reduced_precision_reduction
    flags.allow_bf16_reduced_precision_reduction = False  # torch's flag object: set and given back by hand
    try:
        assert not lt.takes(*args, a_t=False, b_t=True)
    finally:
        flags.allow_bf16_reduced_precision_reduction = before
    assert lt.takes(*args, a_t=False, b_t=True)
