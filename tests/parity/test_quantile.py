"""Quantile family (IQN / QR-DQN): hand cases, finite differences, Philox taus, GPU parity."""
import numpy as np
import pytest

from cudarl import losses
from cudarl.reference import philox
from cudarl.reference import quantile as ref
from cudarl.testing import assert_bitwise, assert_parity, poison


def test_quantile_loss_sign_and_shape_on_a_hand_case():
    # One sample, 2 actions, 1 quantile at 0 for the chosen action 1, tau = 0.25, kappa = 1.
    theta = np.float64([[[5.0], [0.0]]])
    a = np.int32([1])
    w = np.float64([1.0])
    # target above the quantile: H(2) = 1 * (2 - 0.5) = 1.5, weight tau = 0.25
    per, mean, grad = ref.huber_loss(theta, a, np.float64([[2.0]]), np.float64([0.25]), w, 1.0, compute_dtype=np.float64)
    assert grad.shape == (1, 2, 1)
    np.testing.assert_allclose(per, [0.375])
    np.testing.assert_allclose(mean, 0.375)
    np.testing.assert_allclose(grad, [[[0.0], [-0.25]]])  # descent moves the quantile up, towards the target
    # target below: weight 1 - tau = 0.75, gradient positive (descent moves it down)
    per, _, grad = ref.huber_loss(theta, a, np.float64([[-2.0]]), np.float64([0.25]), w, 1.0, compute_dtype=np.float64)
    np.testing.assert_allclose(per, [1.125])
    np.testing.assert_allclose(grad, [[[0.0], [0.75]]])
    # inside the quadratic zone: delta = 0.5 -> 0.25 * 0.125
    per, _, grad = ref.huber_loss(theta, a, np.float64([[0.5]]), np.float64([0.25]), w, 1.0, compute_dtype=np.float64)
    np.testing.assert_allclose(per, [0.25 * 0.125])
    np.testing.assert_allclose(grad, [[[0.0], [-0.25 * 0.5]]])


def test_quantile_loss_averages_over_targets_and_sums_over_quantiles():
    theta = np.float64([[[0.0, 1.0]]])
    target = np.float64([[2.0, -2.0]])
    taus = np.float64([0.25, 0.75])
    per, _, _ = ref.huber_loss(theta, np.int32([0]), target, taus, np.float64([1.0]), 0.0, compute_dtype=np.float64)
    # kappa = 0: |tau - 1{d<0}| |d|; quantile 0: 0.25*2 + 0.75*2; quantile 1: 0.75*1 + 0.25*3
    np.testing.assert_allclose(per, [((0.5 + 1.5) + (0.75 + 0.75)) / 2])


@pytest.mark.parametrize("kappa", [1.0, 0.5, 2.0, 0.0])
@pytest.mark.parametrize("shared_taus", [False, True])
def test_quantile_gradient_matches_finite_differences(rng, kappa, shared_taus):
    B, A, N, M = 4, 3, 5, 6
    theta = rng.normal(size=(B, A, N))
    target = rng.normal(size=(B, M)) * 2
    taus = ref.qr_taus(N).astype(np.float64) if shared_taus else rng.random((B, N))
    a = rng.integers(0, A, B).astype(np.int32)
    w = rng.uniform(0.2, 1, B)
    _, _, grad = ref.huber_loss(theta, a, target, taus, w, kappa, compute_dtype=np.float64)
    f = lambda th: ref.huber_loss(th, a, target, taus, w, kappa, compute_dtype=np.float64)[1]  # noqa: E731
    eps = 1e-6
    num = np.zeros_like(theta)
    for idx in np.ndindex(*theta.shape):
        hi, lo = theta.copy(), theta.copy()
        hi[idx] += eps
        lo[idx] -= eps
        num[idx] = (f(hi) - f(lo)) / (2 * eps)
    np.testing.assert_allclose(grad, num, atol=1e-7, rtol=1e-5)
    assert np.any(grad != 0)


def test_quantile_regression_converges_to_the_target_quantiles():
    # Gradient descent on the QR loss (kappa = 0) against samples of U(0, 1) finds theta_i ~ tau_i.
    N, M = 8, 4000
    taus = ref.qr_taus(N).astype(np.float64)
    target = np.linspace(0, 1, M)[None]
    theta = np.full((1, 1, N), 0.5)
    for _ in range(400):
        _, _, g = ref.huber_loss(theta, np.int32([0]), target, taus, np.float64([1.0]), 0.0, compute_dtype=np.float64)
        theta -= 0.05 * g
    np.testing.assert_allclose(theta[0, 0], taus, atol=0.01)


def test_qr_taus_are_midpoints():
    np.testing.assert_array_equal(ref.qr_taus(4), np.float32([0.125, 0.375, 0.625, 0.875]))


def test_sample_taus_is_the_philox_stream(rng):
    t = losses.sample_taus(seed=1234, counter=7, stream_id=ref.TAU_STREAM_ID, shape=(5, 8))
    assert t.shape == (5, 8) and t.dtype == np.float32
    assert np.all((t >= 0) & (t < 1))
    np.testing.assert_array_equal(t.ravel(), philox.uniform(1234, 7, ref.TAU_STREAM_ID, 40))
    assert not np.array_equal(t, losses.sample_taus(1234, 8, ref.TAU_STREAM_ID, (5, 8)))


def test_targets_use_online_selection_and_target_values():
    online = np.float32([[[0, 0], [1, 1], [0.5, 0.5]]])
    target = np.float32([[[9, 9], [1, 2], [7, 7]]])
    T, a = ref.targets(online, target, np.float32([1.0]), np.float32([0.5]))
    assert a.tolist() == [1]
    np.testing.assert_allclose(T, [[1.5, 2.0]])
    T, _ = ref.targets(online, target, np.float32([1.0]), np.float32([0.0]))  # terminal
    np.testing.assert_allclose(T, [[1.0, 1.0]])


# ---- GPU ------------------------------------------------------------------------------------
CASES = [(1, 3, 8, 8), (7, 2, 32, 8), (33, 3, 64, 64), (512, 3, 32, 32), (4096, 3, 8, 64), (1000, 4, 64, 32)]


def _empty(cp, shape, dtype=np.float32):
    x = cp.empty(shape, dtype)
    poison(x)
    return x


def _inputs(rng, B, A, N, M):
    theta = rng.normal(size=(B, A, N)).astype(np.float32)
    target = (rng.normal(size=(B, M)) * 2).astype(np.float32)
    a = rng.integers(0, A, B).astype(np.int32)
    w = rng.uniform(0.1, 1, B).astype(np.float32)
    return theta, target, a, w


@pytest.mark.gpu
@pytest.mark.parametrize("kappa", [1.0, 0.0])
@pytest.mark.parametrize("B,A,N,M", CASES)
def test_gpu_iqn_loss_matches_reference(cp, rng, B, A, N, M, kappa):
    from cudarl.ops import quantile as ops

    theta, target, a, w = _inputs(rng, B, A, N, M)
    taus = rng.random((B, N)).astype(np.float32)
    per, loss, grad = _empty(cp, (B,)), _empty(cp, (1,)), _empty(cp, (B, A, N))
    ops.huber_loss(cp.asarray(theta), cp.asarray(a), cp.asarray(target), cp.asarray(taus), cp.asarray(w), per, loss, grad, kappa=kappa)
    r_per, r_loss, r_grad = ref.huber_loss(theta, a, target, taus, w, kappa)
    assert_parity(per, r_per, what="per-sample loss")
    assert_parity(loss, np.float32([r_loss]), what="loss")
    assert_parity(grad, r_grad, what="grad wrt quantiles")


@pytest.mark.gpu
@pytest.mark.parametrize("B,A,N,M", CASES)
def test_gpu_qr_loss_with_fixed_taus_matches_reference(cp, rng, B, A, N, M):
    from cudarl.ops import quantile as ops

    theta, target, a, w = _inputs(rng, B, A, N, M)
    taus = ref.qr_taus(N)
    per, loss, grad = _empty(cp, (B,)), _empty(cp, (1,)), _empty(cp, (B, A, N))
    ops.huber_loss(cp.asarray(theta), cp.asarray(a), cp.asarray(target), cp.asarray(taus), cp.asarray(w), per, loss, grad)
    r_per, r_loss, r_grad = ref.huber_loss(theta, a, target, taus, w, 1.0)
    assert_parity(per, r_per, what="per-sample loss")
    assert_parity(loss, np.float32([r_loss]), what="loss")
    assert_parity(grad, r_grad, what="grad wrt quantiles")


@pytest.mark.gpu
@pytest.mark.parametrize("B,A,N,M", CASES)
def test_gpu_quantile_targets_match_reference(cp, rng, B, A, N, M):
    from cudarl.ops import quantile as ops

    online = rng.normal(size=(B, A, M)).astype(np.float32)
    target = rng.normal(size=(B, A, M)).astype(np.float32)
    r = rng.uniform(-1, 1, B).astype(np.float32)
    d = rng.choice(np.float32([0, 0.9, 0.99]), B)
    out, a_star = _empty(cp, (B, M)), _empty(cp, (B,), np.int32)
    ops.targets(cp.asarray(online), cp.asarray(target), cp.asarray(r), cp.asarray(d), out, a_star)
    got_a = a_star.get()
    q = online.astype(np.float64).mean(-1)
    assert np.all(q[np.arange(B), got_a] >= q.max(1) - 1e-5), "picked a non-greedy action"
    want = (r[:, None] + d[:, None] * target[np.arange(B), got_a]).astype(np.float32)
    assert_parity(out, want, what="quantile targets")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8), (7, 32), (4096, 64), (3, 5)])
def test_gpu_sample_taus_is_bitwise_the_reference(cp, shape):
    from cudarl.ops import quantile as ops

    counter = cp.asarray(np.uint64([2**33 + 5]))
    out = _empty(cp, shape)
    ops.sample_taus(99, counter, ref.TAU_STREAM_ID, out)
    assert_bitwise(out, ref.sample_taus(99, 2**33 + 5, ref.TAU_STREAM_ID, shape), what="taus")


@pytest.mark.gpu
def test_gpu_iqn_step_is_bitwise_repeatable_and_graphed_equals_eager(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import quantile as ops

    B, A, N, M = 300, 3, 32, 32
    theta, _, a, w = _inputs(rng, B, A, N, M)
    dev = dict(theta=cp.asarray(theta), a=cp.asarray(a), w=cp.asarray(w),
               on=cp.asarray(rng.normal(size=(B, A, M)).astype(np.float32)), tg=cp.asarray(rng.normal(size=(B, A, M)).astype(np.float32)),
               r=cp.asarray(rng.uniform(-1, 1, B).astype(np.float32)), d=cp.asarray(np.full(B, 0.99, np.float32)),
               counter=cp.asarray(np.uint64([3])))
    outs = dict(taus=_empty(cp, (B, N)), T=_empty(cp, (B, M)), a_star=_empty(cp, (B,), np.int32),
                per=_empty(cp, (B,)), loss=_empty(cp, (1,)), grad=_empty(cp, (B, A, N)))

    def phase():
        ops.sample_taus(7, dev["counter"], ref.TAU_STREAM_ID, outs["taus"])
        ops.targets(dev["on"], dev["tg"], dev["r"], dev["d"], outs["T"], outs["a_star"])
        ops.huber_loss(dev["theta"], dev["a"], outs["T"], outs["taus"], dev["w"], outs["per"], outs["loss"], outs["grad"])

    cp.cuda.Device().synchronize()
    g = StepGraph("quantile_parity", [("iqn", phase)], xp=cp)
    g.run_eager()
    g.synchronize()
    first = {k: v.get() for k, v in outs.items()}
    assert_bitwise(first["taus"], ref.sample_taus(7, 3, ref.TAU_STREAM_ID, (B, N)), what="taus")
    for attempt in ("eager rerun", "graphed"):
        for v in outs.values():
            poison(v)
        cp.cuda.Device().synchronize()
        if attempt == "graphed":
            g.capture()
            g.replay()
        else:
            g.run_eager()
        g.synchronize()
        for k, v in outs.items():
            assert_bitwise(v, first[k], what=f"{attempt} {k}")
    # the counter is read from device memory: moving it changes the captured graph's taus
    dev["counter"].fill(4)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    assert_bitwise(outs["taus"], ref.sample_taus(7, 4, ref.TAU_STREAM_ID, (B, N)), what="taus after the counter moved")
