"""CQL (C51 and quantile heads)."""

import numpy as np
import pytest

from cudarl.reference import regularizers as ref
from cudarl.testing import assert_bitwise, assert_parity, finite_difference, poison


def test_cql_hand_case_equal_q_values_cost_log_a():
    theta = np.zeros((2, 3, 4))  # [B, N, A]: 3 quantiles of 4 actions
    per, loss, grad = ref.cql_quantile(theta, np.int32([0, 3]), alpha=2.0, compute_dtype=np.float64)
    np.testing.assert_allclose(per, np.log(4))
    np.testing.assert_allclose(loss, 2.0 * np.log(4))
    # pushes the data action up (negative gradient), the others down:
    # (alpha / B)(pi_a - 1{a = a_b}) / N with pi = 1/4 is -0.25 for the data action, 1/12 for the others
    want = np.full((2, 3, 4), 1 / 12)
    want[0, :, 0] = want[1, :, 3] = -0.25
    np.testing.assert_allclose(grad, want)


def test_cql_c51_gradient_matches_finite_differences(rng):
    B, A, K = 4, 3, 7
    x = rng.normal(size=(B, A, K))
    z = np.linspace(-3, 3, K)
    a = rng.integers(0, A, B).astype(np.int32)
    _, _, grad = ref.cql_c51(x, a, z, 0.7, compute_dtype=np.float64)
    np.testing.assert_allclose(
        grad,
        finite_difference(lambda t: ref.cql_c51(t, a, z, 0.7, compute_dtype=np.float64)[1], x),
        atol=1e-8,
        rtol=1e-6,
    )


def test_cql_quantile_gradient_matches_finite_differences(rng):
    th = rng.normal(size=(5, 4, 3))  # [B, N, A]
    a = rng.integers(0, 3, 5).astype(np.int32)
    _, _, grad = ref.cql_quantile(th, a, 1.3, compute_dtype=np.float64)
    np.testing.assert_allclose(
        grad,
        finite_difference(lambda t: ref.cql_quantile(t, a, 1.3, compute_dtype=np.float64)[1], th),
        atol=1e-8,
        rtol=1e-6,
    )


# ---- GPU ------------------------------------------------------------------------------------
def _e(cp, shape):
    x = cp.empty(shape, np.float32)
    poison(x)
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("B,A,K", [(1, 3, 11), (7, 2, 51), (512, 3, 101), (4096, 5, 51)])
def test_gpu_cql_c51_matches_reference(cp, rng, B, A, K, accumulate):
    from cudarl.ops import regularizers as ops

    z = np.linspace(-10, 10, K, dtype=np.float32)
    x = (rng.normal(size=(B, A, K)) * 1.5).astype(np.float32)
    a = rng.integers(0, A, B).astype(np.int32)
    base = rng.normal(size=(B, A, K)).astype(np.float32) * 1e-3
    per, loss = _e(cp, (B,)), _e(cp, (1,))
    grad = cp.asarray(base) if accumulate else _e(cp, (B, A, K))
    ops.cql_c51(cp.asarray(x), cp.asarray(a), cp.asarray(z), 0.5, per, loss, grad, accumulate=accumulate)
    r_per, r_loss, r_grad = ref.cql_c51(x, a, z, 0.5)
    assert_parity(per, r_per, what="cql per sample")
    assert_parity(loss, np.float32([r_loss]), what="cql loss")
    assert_parity(grad, (r_grad + base) if accumulate else r_grad, what="cql grad")


@pytest.mark.gpu
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize(
    "B,A,N", [(1, 3, 8), (33, 3, 32), (4096, 4, 64), (5, 7, 40)]
)  # last: N * A not a multiple of 32
def test_gpu_cql_quantile_matches_reference(cp, rng, B, A, N, accumulate):
    from cudarl.ops import regularizers as ops

    th = rng.normal(size=(B, N, A)).astype(np.float32)
    a = rng.integers(0, A, B).astype(np.int32)
    base = rng.normal(size=(B, N, A)).astype(np.float32) * 1e-3
    per, loss = _e(cp, (B,)), _e(cp, (1,))
    grad = cp.asarray(base) if accumulate else _e(cp, (B, N, A))
    ops.cql_quantile(cp.asarray(th), cp.asarray(a), 1.5, per, loss, grad, accumulate=accumulate)
    r_per, r_loss, r_grad = ref.cql_quantile(th, a, 1.5)
    assert_parity(per, r_per, what="cql per sample")
    assert_parity(loss, np.float32([r_loss]), what="cql loss")
    assert_parity(grad, (r_grad + base) if accumulate else r_grad, what="cql grad")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 255, 257, 5000])
def test_gpu_mean_matches_reference(cp, rng, n):
    from cudarl.ops import regularizers as ops

    x = rng.normal(size=n).astype(np.float32)
    out = _e(cp, (1,))
    ops.mean(cp.asarray(x), out, 0.3)
    assert_parity(out, np.float32([ref.mean(x, 0.3, np.float64)]), what="mean")


def _block_tree_sum_f32(x: np.ndarray, N: int = 256) -> np.float32:
    """cudarl_regularizers_mean's order in float32: slot t sums x[t], x[t + N], ... in order, then
    block_tree_sum's pairs (slot t += slot t + s for s = N/2, ..., 1); IEEE adds, so the GPU's bits."""
    sh = np.zeros(N, np.float32)
    for lo in range(0, x.size, N):
        part = x[lo : lo + N]
        sh[: part.size] = sh[: part.size] + part
    s = N // 2
    while s:
        sh[:s] = sh[:s] + sh[s : 2 * s]
        s //= 2
    return sh[0]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 255, 257, 5000])
def test_gpu_mean_is_the_fixed_tree_bit_for_bit(cp, rng, n):
    """The one-block mean is its documented order exactly (cudarl/reduce.cuh's block_tree_sum, whose last
    five levels are warp shuffles adding the same pairs): a float32 emulation of that order is its bits."""
    from cudarl.ops import regularizers as ops

    x = (rng.normal(size=n) * rng.uniform(0.1, 100, n)).astype(np.float32)
    out = _e(cp, (1,))
    ops.mean(cp.asarray(x), out, 0.3)
    assert_bitwise(out, np.float32([np.float32(0.3) * _block_tree_sum_f32(x)]), what="mean")
