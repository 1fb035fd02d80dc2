"""Quantile family (IQN / QR-DQN): hand cases, finite differences, Philox taus, GPU parity."""

import numpy as np
import pytest

from cudarl import losses
from cudarl.reference import philox
from cudarl.reference import quantile as ref
from cudarl.testing import assert_bitwise, assert_parity, assert_reruns_bitwise, finite_difference, poison


def test_quantile_loss_sign_and_shape_on_a_hand_case():
    # One sample, 1 quantile, 2 actions ([B, N, A]): the chosen action 1 has its quantile at 0,
    # tau = 0.25, kappa = 1.
    theta = np.float64([[[5.0, 0.0]]])
    a = np.int32([1])
    w = np.float64([1.0])
    # target above the quantile: H(2) = 1 * (2 - 0.5) = 1.5, weight tau = 0.25
    per, mean, grad = ref.huber_loss(
        theta, a, np.float64([[2.0]]), np.float64([0.25]), w, 1.0, compute_dtype=np.float64
    )
    assert grad.shape == (1, 1, 2)
    np.testing.assert_allclose(per, [0.375])
    np.testing.assert_allclose(mean, 0.375)
    np.testing.assert_allclose(grad, [[[0.0, -0.25]]])  # descent moves the quantile up, towards the target
    # target below: weight 1 - tau = 0.75, gradient positive (descent moves it down)
    per, _, grad = ref.huber_loss(theta, a, np.float64([[-2.0]]), np.float64([0.25]), w, 1.0, compute_dtype=np.float64)
    np.testing.assert_allclose(per, [1.125])
    np.testing.assert_allclose(grad, [[[0.0, 0.75]]])
    # inside the quadratic zone: delta = 0.5 -> 0.25 * 0.125
    per, _, grad = ref.huber_loss(theta, a, np.float64([[0.5]]), np.float64([0.25]), w, 1.0, compute_dtype=np.float64)
    np.testing.assert_allclose(per, [0.25 * 0.125])
    np.testing.assert_allclose(grad, [[[0.0, -0.25 * 0.5]]])


def test_quantile_loss_averages_over_targets_and_sums_over_quantiles():
    # [B, N, A] = [1, 2, 3]: action 1's quantiles are column 1, (0, 1); columns 0 and 2 are decoys.
    theta = np.float64([[[9.0, 0.0, -9.0], [9.0, 1.0, -9.0]]])
    target = np.float64([[2.0, -2.0]])
    taus = np.float64([0.25, 0.75])
    per, _, grad = ref.huber_loss(theta, np.int32([1]), target, taus, np.float64([1.0]), 0.0, compute_dtype=np.float64)
    # kappa = 0: |tau - 1{d<0}| |d|; quantile 0: 0.25*2 + 0.75*2; quantile 1: 0.75*1 + 0.25*3
    np.testing.assert_allclose(per, [((0.5 + 1.5) + (0.75 + 0.75)) / 2])
    # d/dtheta_i = -(1/M) sum_j |tau_i - 1{d<0}| sign(d): quantile 0: -(0.25 - 0.75)/2; quantile 1: -(0.75 - 0.25)/2
    np.testing.assert_allclose(grad, [[[0.0, 0.25, 0.0], [0.0, -0.25, 0.0]]])


@pytest.mark.parametrize("kappa", [1.0, 0.5, 2.0, 0.0])
@pytest.mark.parametrize("shared_taus", [False, True])
def test_quantile_gradient_matches_finite_differences(rng, kappa, shared_taus):
    B, N, A, M = 4, 5, 3, 6
    theta = rng.normal(size=(B, N, A))
    target = rng.normal(size=(B, M)) * 2
    taus = ref.qr_taus(N).astype(np.float64) if shared_taus else rng.random((B, N))
    a = rng.integers(0, A, B).astype(np.int32)
    w = rng.uniform(0.2, 1, B)
    _, _, grad = ref.huber_loss(theta, a, target, taus, w, kappa, compute_dtype=np.float64)
    f = lambda th: ref.huber_loss(th, a, target, taus, w, kappa, compute_dtype=np.float64)[1]  # noqa: E731
    num = finite_difference(f, theta)
    np.testing.assert_allclose(grad, num, atol=1e-7, rtol=1e-5)
    assert np.any(grad != 0)


def test_quantile_regression_converges_to_the_target_quantiles():
    # Gradient descent on the QR loss (kappa = 0) against samples of U(0, 1) finds theta_i ~ tau_i.
    N, M = 8, 4000
    taus = ref.qr_taus(N).astype(np.float64)
    target = np.linspace(0, 1, M)[None]
    theta = np.full((1, N, 1), 0.5)
    for _ in range(400):
        _, _, g = ref.huber_loss(theta, np.int32([0]), target, taus, np.float64([1.0]), 0.0, compute_dtype=np.float64)
        theta -= 0.05 * g
    np.testing.assert_allclose(theta[0, :, 0], taus, atol=0.01)


def test_qr_taus_are_midpoints():
    np.testing.assert_array_equal(ref.qr_taus(4), np.float32([0.125, 0.375, 0.625, 0.875]))


def test_sample_taus_is_the_philox_stream(rng):
    t = losses.sample_taus(seed=1234, counter=7, stream_id=ref.TAU_STREAM_ID, shape=(5, 8))
    assert t.shape == (5, 8) and t.dtype == np.float32
    assert np.all((t >= 0) & (t < 1))
    np.testing.assert_array_equal(t.ravel(), philox.uniform(1234, 7, ref.TAU_STREAM_ID, 40))
    assert not np.array_equal(t, losses.sample_taus(1234, 8, ref.TAU_STREAM_ID, (5, 8)))


def test_targets_use_online_selection_and_target_values():
    # [B, M, A] = [1, 2, 3]: action 1 has the largest mean over the M quantiles
    online = np.float32([[[0, 1, 0.5], [0, 1, 0.5]]])
    target = np.float32([[[9, 1, 7], [9, 2, 7]]])
    T, a = ref.targets(online, target, np.float32([1.0]), np.float32([0.5]))
    assert a.tolist() == [1]
    np.testing.assert_allclose(T, [[1.5, 2.0]])
    T, _ = ref.targets(online, target, np.float32([1.0]), np.float32([0.0]))  # terminal
    np.testing.assert_allclose(T, [[1.0, 1.0]])


def test_iqn_network_loss_backward_matches_finite_differences(rng):
    """The real pieces end to end, float64: QNetwork(head="iqn") forward -> quantile Huber loss
    -> its gradient written into the network's grad outputs -> QNetwork.backward, against central
    differences of the loss wrt parameters of every tensor. N != A, so a transposed layout
    anywhere (loss vs head) gives wrong gradients, not a shape error that is easy to miss."""
    from cudarl.nn import QNetwork

    B, n_in, A, N, M, kappa = 3, 5, 3, 4, 6, 1.0
    net = QNetwork(n_in, A, hidden=(7, 6), head="iqn", n_quantiles=N, n_cos=5, dtype=np.float64, max_batch=B, seed=11)
    net.params += 0.1 * rng.standard_normal(net.params.shape)  # biases away from 0
    x = rng.standard_normal((B, n_in))
    tau = rng.uniform(size=(B, N))
    a = np.int32([2, 0, 1])
    w = rng.uniform(0.3, 1.0, B)
    # a fixed (semi-gradient) target spread around the initial quantiles, mostly in the Huber zone
    target = 0.5 * rng.standard_normal((B, M))

    def loss_and_grad():
        theta = net.forward(x, tau=tau)["q"]
        assert theta.shape == (B, N, A)
        _, mean, grad = ref.huber_loss(theta, a, target, tau, w, kappa, compute_dtype=np.float64)
        return mean, grad, theta

    _, grad, theta = loss_and_grad()
    # losses.quantile_huber_loss is this twin on NumPy (in float32): same gradient to float32 rounding
    public = losses.quantile_huber_loss(
        theta.astype(np.float32), a, target.astype(np.float32), tau.astype(np.float32), w.astype(np.float32), kappa
    )
    assert public.grad.shape == (B, N, A)
    assert_parity(public.grad, grad.astype(np.float32), what="public quantile_huber_loss grad")
    dq = net.grad_outputs()["q"]
    assert dq.shape == grad.shape
    dq[...] = grad
    net.grads[...] = np.nan
    net.backward(x)

    h, picked = 1e-6, []
    for e in net.layout.entries:  # a few parameters of every tensor
        picked += list(e.offset + rng.choice(e.size, size=min(3, e.size), replace=False))
    an = net.grads[picked].copy()
    assert not np.isnan(an).any(), "backward left a picked parameter gradient unwritten"
    fd = np.zeros(len(picked))
    for k, i in enumerate(picked):
        old = net.params[i]
        net.params[i] = old + h
        lp = loss_and_grad()[0]
        net.params[i] = old - h
        lm = loss_and_grad()[0]
        net.params[i] = old
        fd[k] = (lp - lm) / (2 * h)
    err = np.linalg.norm(fd - an) / np.linalg.norm(fd)
    assert err <= 1e-6, f"relative error {err:.2e}"
    assert np.count_nonzero(an) >= len(picked) // 2, "too few non-zero gradients to say anything"


# ---- GPU ------------------------------------------------------------------------------------
CASES = [
    (1, 3, 8, 8),
    (7, 2, 32, 8),
    (33, 3, 64, 64),
    (512, 3, 32, 32),
    (4096, 3, 8, 64),
    (1000, 4, 64, 32),
    (5, 7, 40, 24),
]  # N * A not a multiple of 32


def _empty(cp, shape, dtype=np.float32):
    x = cp.empty(shape, dtype)
    poison(x)
    return x


def _inputs(rng, B, A, N, M):
    theta = rng.normal(size=(B, N, A)).astype(np.float32)
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
    per, loss, grad = _empty(cp, (B,)), _empty(cp, (1,)), _empty(cp, (B, N, A))
    done = cp.zeros(1, np.uint32)
    ops.huber_loss(
        cp.asarray(theta),
        cp.asarray(a),
        cp.asarray(target),
        cp.asarray(taus),
        cp.asarray(w),
        per,
        loss,
        grad,
        done,
        kappa=kappa,
    )
    r_per, r_loss, r_grad = ref.huber_loss(theta, a, target, taus, w, kappa)
    assert_parity(per, r_per, what="per-sample loss")
    assert_parity(loss, np.float32([r_loss]), what="loss")
    assert_parity(grad, r_grad, what="grad wrt quantiles")
    assert int(done.get()[0]) == 0, "the last block did not reset the ticket counter"


@pytest.mark.gpu
@pytest.mark.parametrize("B,A,N,M", CASES)
def test_gpu_qr_loss_with_fixed_taus_matches_reference(cp, rng, B, A, N, M):
    from cudarl.ops import quantile as ops

    theta, target, a, w = _inputs(rng, B, A, N, M)
    taus = ref.qr_taus(N)
    per, loss, grad = _empty(cp, (B,)), _empty(cp, (1,)), _empty(cp, (B, N, A))
    ops.huber_loss(
        cp.asarray(theta),
        cp.asarray(a),
        cp.asarray(target),
        cp.asarray(taus),
        cp.asarray(w),
        per,
        loss,
        grad,
        cp.zeros(1, np.uint32),
    )
    r_per, r_loss, r_grad = ref.huber_loss(theta, a, target, taus, w, 1.0)
    assert_parity(per, r_per, what="per-sample loss")
    assert_parity(loss, np.float32([r_loss]), what="loss")
    assert_parity(grad, r_grad, what="grad wrt quantiles")


@pytest.mark.gpu
@pytest.mark.parametrize("B,A,N,M", CASES)
def test_gpu_quantile_targets_match_reference(cp, rng, B, A, N, M):
    from cudarl.ops import quantile as ops

    online = rng.normal(size=(B, M, A)).astype(np.float32)
    target = rng.normal(size=(B, M, A)).astype(np.float32)
    r = rng.uniform(-1, 1, B).astype(np.float32)
    d = rng.choice(np.float32([0, 0.9, 0.99]), B)
    out, a_star = _empty(cp, (B, M)), _empty(cp, (B,), np.int32)
    ops.targets(cp.asarray(online), cp.asarray(target), cp.asarray(r), cp.asarray(d), out, a_star)
    got_a = a_star.get()
    q = online.astype(np.float64).mean(axis=1)  # [B, A]
    assert np.all(q[np.arange(B), got_a] >= q.max(1) - 1e-5), "picked a non-greedy action"
    want = (r[:, None] + d[:, None] * target[np.arange(B), :, got_a]).astype(np.float32)
    assert_parity(out, want, what="quantile targets")


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 4, 5, 255, 257, 5000])
def test_gpu_loss_mean_by_the_last_block_matches_and_reuses_its_counter(cp, rng, B):
    """The batch mean is summed by the block that finishes last (grids of 1 to 1250 blocks); the
    ticket counter is left 0, so one counter serves every launch, eager and graphed, bitwise."""
    from cudarl.graph import StepGraph
    from cudarl.ops import quantile as ops
    from cudarl.reference.util import weighted_mean

    A, N, M = 3, 8, 8
    theta, target, a, w = _inputs(rng, B, A, N, M)
    taus = rng.random((B, N)).astype(np.float32)
    dev = {k: cp.asarray(v) for k, v in dict(theta=theta, target=target, a=a, w=w, taus=taus).items()}
    per, loss, grad, done = _empty(cp, (B,)), _empty(cp, (1,)), _empty(cp, (B, N, A)), cp.zeros(1, np.uint32)

    def run():
        ops.huber_loss(dev["theta"], dev["a"], dev["target"], dev["taus"], dev["w"], per, loss, grad, done)

    cp.cuda.Device().synchronize()
    g = StepGraph("quantile_loss_mean", [("loss", run)], xp=cp)
    g.run_eager()
    g.synchronize()
    assert_parity(
        loss, np.float32([weighted_mean(per.get(), w, 1.0 / B, np.float64)]), what="mean of the kernel's rows"
    )
    assert_parity(loss, np.float32([ref.huber_loss(theta, a, target, taus, w)[1]]), what="mean loss")
    first = loss.get()
    g.capture()

    def counter_left_zero(attempt):
        assert int(done.get()[0]) == 0, f"{attempt}: the ticket counter was not left 0"

    assert_reruns_bitwise(
        g, {"mean loss": loss}, {"mean loss": first}, ("graphed", "eager", "graphed"), check=counter_left_zero
    )


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
    dev = dict(
        theta=cp.asarray(theta),
        a=cp.asarray(a),
        w=cp.asarray(w),
        on=cp.asarray(rng.normal(size=(B, M, A)).astype(np.float32)),
        tg=cp.asarray(rng.normal(size=(B, M, A)).astype(np.float32)),
        r=cp.asarray(rng.uniform(-1, 1, B).astype(np.float32)),
        d=cp.asarray(np.full(B, 0.99, np.float32)),
        counter=cp.asarray(np.uint64([3])),
        done=cp.zeros(1, np.uint32),
    )
    outs = dict(
        taus=_empty(cp, (B, N)),
        T=_empty(cp, (B, M)),
        a_star=_empty(cp, (B,), np.int32),
        per=_empty(cp, (B,)),
        loss=_empty(cp, (1,)),
        grad=_empty(cp, (B, N, A)),
    )

    def phase():
        ops.sample_taus(7, dev["counter"], ref.TAU_STREAM_ID, outs["taus"])
        ops.targets(dev["on"], dev["tg"], dev["r"], dev["d"], outs["T"], outs["a_star"])
        ops.huber_loss(
            dev["theta"],
            dev["a"],
            outs["T"],
            outs["taus"],
            dev["w"],
            outs["per"],
            outs["loss"],
            outs["grad"],
            dev["done"],
        )

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
