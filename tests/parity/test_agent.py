"""agent family: expected Q of quantiles, discounts from done flags, the device epsilon schedule."""
import numpy as np
import pytest

from cudarl.reference import agent as ref
from cudarl.testing import assert_bitwise, assert_parity


def test_reference_hand_cases():
    q = np.empty((1, 2), np.float32)
    ref.quantile_mean(q, np.array([[[1, 10], [3, 20]]], np.float32))
    assert q.tolist() == [[2.0, 15.0]]
    out = np.empty(3, np.float32)
    ref.discount(out, np.array([0, 1, 0], np.float32), np.array([0.5], np.float32))
    assert out.tolist() == [0.5, 0.0, 0.5]
    eps, count = np.zeros(1, np.float32), np.zeros(1, np.int64)
    seen = []
    for _ in range(6):
        ref.epsilon(eps, count, 1.0, 0.2, 4)
        seen.append(float(eps[0]))
    assert seen == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2]) and count[0] == 6


@pytest.mark.gpu
@pytest.mark.parametrize("B,N,A", [(1, 1, 2), (7, 32, 3), (4096, 8, 5)])
def test_gpu_quantile_mean(cp, rng, B, N, A):
    from cudarl.ops import agent as ops

    theta = rng.standard_normal((B, N, A)).astype(np.float32)
    q = cp.full((B, A), np.nan, np.float32)
    ops.quantile_mean(q, cp.asarray(theta))
    want = np.empty((B, A), np.float32)
    ref.quantile_mean(want, theta)
    assert_parity(q, want)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 257, 70_000])
def test_gpu_discount_and_epsilon(cp, rng, n):
    from cudarl.ops import agent as ops

    done = (rng.random(n) < 0.3).astype(np.float32)
    out = cp.full(n, np.nan, np.float32)
    gamma = cp.asarray(np.array([0.97], np.float32))
    ops.discount(out, cp.asarray(done), gamma)
    want = np.empty(n, np.float32)
    ref.discount(want, done, np.array([0.97], np.float32))
    assert_bitwise(out, want)

    eps, count = cp.zeros(1, np.float32), cp.zeros(1, np.int64)
    e_ref, c_ref = np.zeros(1, np.float32), np.zeros(1, np.int64)
    for _ in range(12):
        ops.epsilon(eps, count, 1.0, 0.05, 9)
        ref.epsilon(e_ref, c_ref, 1.0, 0.05, 9)
        assert_bitwise(eps, e_ref)
    assert int(count.get()[0]) == 12


def test_reference_publish_rotates_slots():
    ring = np.zeros(6, np.float32)
    for t in range(1, 5):
        ref.publish(ring, np.array([t], np.float32), np.array([10 * t], np.float32), np.array([t], np.int64), 3)
    assert ring.tolist() == [3, 30, 4, 40, 2, 20]


@pytest.mark.gpu
def test_gpu_publish_into_pinned_ring(cp):
    from cudarl.ops import agent as ops
    from cudarl.pinned import PinnedReadback

    rb = PinnedReadback(2, np.float32, cp, slots=2)
    step = cp.zeros(1, np.int64)
    for t in range(1, 4):
        step.fill(t)
        ops.publish(rb.device, cp.asarray(np.array([t], np.float32)), cp.asarray(np.array([-t], np.float32)), step, 2)
        rb.mark_written(slot=t % 2)
        assert rb.read(t % 2).tolist() == [t, -t]
