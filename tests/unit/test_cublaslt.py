"""models/cublaslt.py on a CPU: the timed choice's rule and what `matmul` hands back to torch. The GEMMs themselves
run in tests/integration/test_cublaslt_gpu.py."""
import math

import pytest
import torch

from turbotrain.models import cublaslt as lt


@pytest.mark.parametrize("times,want", [([1.0, 0.9, 0.95], 1), ([1.0, 0.98, 0.99], 0), ([1.0], 0),
                                        ([math.inf, 2.0, 1.5], 2), ([1.0, 1.2, 0.5, 0.96], 2),
                                        ([1.0, 1.0 - lt.MARGIN], 0)])
def test_another_algorithm_replaces_the_first_only_by_the_margin(times, want):
    assert lt.pick(times) == want


@pytest.mark.parametrize("ptrs,want", [([256, 512], 256), ([256, 16 + 256], 16), ([128, 256], 128),
                                       ([64 * 3], 64), ([32], 32)])
def test_alignment_is_the_largest_power_of_two_of_every_pointer(ptrs, want):
    assert lt.alignment(ptrs) == want


def test_what_cublaslt_cannot_take_goes_back_to_torch():
    """Checked before any library call, so a CPU tells: fp32 inputs, mixed dtypes, a transposed view, sizes not
    multiples of 8, an empty output."""
    a, b = torch.zeros(16, 8, dtype=torch.bfloat16), torch.zeros(24, 8, dtype=torch.bfloat16)
    out = torch.zeros(16, 24, dtype=torch.bfloat16)
    cases = [(out.float(), a.float(), b.float()), (out, a, b.half()), (out, a.t().contiguous().t(), b),
             (torch.zeros(16, 20, dtype=torch.bfloat16), a, torch.zeros(20, 8, dtype=torch.bfloat16)),
             (torch.zeros(0, 24, dtype=torch.bfloat16), torch.zeros(0, 8, dtype=torch.bfloat16), b),
             (out.half(), a, b)]
    for o, x, y in cases:
        assert lt.matmul(o, x, y, a_t=False, b_t=True, accumulate=False, setting="kernels.fused_loss") is False
