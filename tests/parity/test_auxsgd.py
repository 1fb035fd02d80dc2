"""The auxiliary signals' own SGD step on a span of parameters: twin by hand, kernel bit for bit."""

import numpy as np
import pytest

from cudarl.reference import auxsgd as ref
from cudarl.testing import assert_bitwise


def test_step_by_hand_and_clear():
    p, g = np.float32([1.0, -2.0, 0.5]), np.float32([0.5, 1.0, -4.0])
    ref.step(p, g, 0.1, clear=False)
    np.testing.assert_allclose(p, [0.95, -2.1, 0.9], rtol=1e-6)
    np.testing.assert_allclose(g, [0.5, 1.0, -4.0])
    ref.step(p, g, 0.1, clear=True)
    np.testing.assert_allclose(p, [0.9, -2.2, 1.3], rtol=1e-6)
    assert not g.any()


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 257, 300_001])
@pytest.mark.parametrize("clear", [False, True])
def test_gpu_step_matches_reference_bitwise(cp, rng, n, clear):
    from cudarl.ops import auxsgd as ops

    p, g = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    dp, dg = cp.asarray(p), cp.asarray(g)
    ops.step(dp, dg, 0.037, clear=clear)
    ref.step(p, g, 0.037, clear=clear)
    assert_bitwise(dp, p, "params")
    assert_bitwise(dg, g, "grads")
