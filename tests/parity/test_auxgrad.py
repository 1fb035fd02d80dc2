"""The flat-gradient copy of the auxiliary signals' extra backward (cuda_src/auxgrad.cu)."""

import numpy as np
import pytest

from cudarl.reference import auxgrad as ref
from cudarl.testing import assert_bitwise, poison


def test_copy_refuses_sizes_that_differ():
    with pytest.raises(ValueError, match="sizes"):
        ref.copy(np.zeros(3, np.float32), np.zeros(4, np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 257, 1_000_003])
def test_gpu_copy_is_exact(cp, rng, n):
    from cudarl.ops import auxgrad as ops

    src = cp.asarray(rng.normal(size=n).astype(np.float32))
    dst = cp.empty(n, np.float32)
    poison(dst)
    ops.copy(dst, src)
    want = np.empty(n, np.float32)
    ref.copy(want, src.get())
    assert_bitwise(dst, want)
