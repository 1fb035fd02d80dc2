"""The sub-batch rows of the auxiliary signals' own passes (cuda_src/auxgrad.cu, agent.aux_batch), spread
evenly over the batch."""

import numpy as np
import pytest

from cudarl.reference import auxgrad as ref
from cudarl.testing import assert_bitwise, poison


@pytest.mark.parametrize("R,B", [(1, 1), (1, 9), (3, 9), (8, 32), (30, 100), (64, 256), (7, 7)])
def test_spread_rows_are_spread_evenly_and_start_at_the_first(R, B):
    idx = ref.spread(R, B)
    assert idx.shape == (R,) and idx[0] == 0 and idx[-1] < B and np.all(np.diff(idx) >= B // R)
    assert np.all(np.diff(idx) <= -(-B // R))  # no gap wider than the ceiling of B / R
    if R == B:
        np.testing.assert_array_equal(idx, np.arange(B))
    src = np.arange(B * 3, dtype=np.float32).reshape(B, 3)
    dst = np.empty((R, 3), np.float32)
    ref.spread_rows(dst, src)
    np.testing.assert_array_equal(dst, src[idx])


def test_spread_refuses_more_rows_than_the_batch():
    with pytest.raises(ValueError, match="rows out of"):
        ref.spread(5, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("R,B,n", [(1, 1, 1), (1, 5, 3), (3, 10, 7), (64, 256, 449), (37, 512, 1024), (9, 9, 33)])
def test_gpu_spread_rows_is_exact(cp, rng, R, B, n):
    from cudarl.ops import auxgrad as ops

    src = rng.normal(size=(B, n)).astype(np.float32)
    dst = cp.empty((R, n), np.float32)
    poison(dst)
    ops.spread_rows(dst, cp.asarray(src))
    want = np.empty((R, n), np.float32)
    ref.spread_rows(want, src)
    assert_bitwise(dst, want)


@pytest.mark.gpu
def test_gpu_spread_rows_graphed_equals_eager_and_sees_new_rows(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import auxgrad as ops

    src = cp.asarray(rng.normal(size=(100, 21)).astype(np.float32))
    dst = cp.zeros((30, 21), np.float32)
    g = StepGraph("spread_rows_parity", [("s", lambda: ops.spread_rows(dst, src))], xp=cp)
    g.capture()
    src[...] = cp.asarray(rng.normal(size=(100, 21)).astype(np.float32))  # the replay reads the new rows
    poison(dst)
    g.replay()
    g.synchronize()
    want = np.empty((30, 21), np.float32)
    ref.spread_rows(want, src.get())
    assert_bitwise(dst, want)
