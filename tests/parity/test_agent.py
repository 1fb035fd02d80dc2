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


def test_reference_publish_row_rotates_slots():
    ring = np.zeros(6, np.float32)
    for t in range(1, 5):
        ref.publish_row(ring, np.array([t, 10 * t, -t], np.float32), np.array([t], np.int64), 2)
    assert ring.tolist() == [4, 40, -4, 3, 30, -3]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 9, 300])
def test_gpu_publish_row_into_pinned_ring(cp, rng, n):
    from cudarl.ops import agent as ops
    from cudarl.pinned import PinnedReadback

    rb = PinnedReadback(n, np.float32, cp, slots=2)
    step = cp.zeros(1, np.int64)
    for t in range(1, 4):
        step.fill(t)
        values = rng.normal(size=n).astype(np.float32)
        ops.publish_row(rb.device, cp.asarray(values), step, 2)
        rb.mark_written(slot=t % 2)
        assert_bitwise(rb.read(t % 2), values, what=f"slot {t % 2}")


# --- the fused act kernels (act_c51, act_iqn) ------------------------------------------------------
_SCHEDULE = (1.0, 0.05, 9)  # eps_start, eps_end, eps_steps: from exploring everything to mostly greedy


def _env_params(seed=77):
    """The envs' Philox key as the act ops take it: uint64 ``[1]`` (device memory on the GPU)."""
    return np.array([seed], np.uint64)


def _twin_act_inputs(rng, n, A, K=51, N=8):
    """Logits [n, A, K], quantiles [n, N, A], the support, env counters and env params for the twins."""
    logits = rng.standard_normal((n, A, K)).astype(np.float32) * 3
    theta = rng.standard_normal((n, N, A)).astype(np.float32)
    support = np.linspace(-10, 10, K, dtype=np.float32)
    return logits, theta, support, rng.integers(0, 2**40, n, dtype=np.uint64), _env_params()


def test_reference_act_is_the_three_steps_it_fuses(rng):
    """The twin of act_c51 (act_iqn) is expected Q (quantile mean), the epsilon schedule, then the
    env's epsilon-greedy act, in that order: the NumPy backend runs exactly what it ran before."""
    from cudarl.reference import env as env_ref
    from cudarl.reference import qstats

    n, A = 9, 3
    logits, theta, support, env_count, params = _twin_act_inputs(rng, n, A)
    for fused, head, q_of in (
        (ref.act_c51, (logits, support), lambda: qstats.per_sample(logits, support)[0]),
        (ref.act_iqn, (theta,), None),
    ):
        eps, count, arrivals = np.zeros(1, np.float32), np.array([4], np.int64), np.zeros(1, np.uint32)
        e_want, c_want = np.zeros(1, np.float32), np.array([4], np.int64)
        actions, q = np.full(n, -1, np.int32), np.zeros((n, A), np.float32)
        fused(actions, q, *head, env_count, params, eps, count, arrivals, *_SCHEDULE)
        q_want = np.zeros((n, A), np.float32)
        if q_of is None:
            ref.quantile_mean(q_want, theta)
        else:
            q_want[...] = q_of()
        ref.epsilon(e_want, c_want, *_SCHEDULE)
        a_want = np.zeros(n, np.int32)
        env_ref.act(a_want, q_want, e_want, env_count, params)
        assert_bitwise(q, q_want)
        assert_bitwise(actions, a_want)
        assert eps[0] == e_want[0] and count[0] == 5 and arrivals[0] == 0


def _act_buffers(cp, n, A):
    return (
        cp.full(n, -7, np.int32),
        cp.full((n, A), np.nan, np.float32),
        cp.zeros(1, np.float32),
        cp.zeros(1, np.int64),
        cp.zeros(1, np.uint32),
    )


def _check_act_against_twin(q_g, actions_g, eps_g, count_g, q_twin, env_count, params, eps_twin, step):
    """q within float32 rounding of the twin; the twin's epsilon-greedy rule applied to the GPU's
    q gives the GPU's actions (so near-ties cannot make the test flaky); eps and count exact."""
    from cudarl.reference import env as env_ref

    assert_parity(q_g, q_twin, what=f"q at step {step}")
    assert_bitwise(eps_g, eps_twin, what=f"epsilon at step {step}")
    a = np.zeros(q_twin.shape[0], np.int32)
    env_ref.act(a, q_g.get(), eps_twin, env_count, params)
    assert_bitwise(actions_g, a, what=f"actions at step {step}")
    assert int(count_g.get()[0]) == step + 1


def _fused_vs_separate(cp, rng, n, A, params, draw_head, fused, separate, twin_q):
    """12 steps of the schedule (epsilon from 1 to 0.05, so both branches run) with fresh head
    outputs and env counters: ``fused(head, env_count, bufs)`` equals ``separate(head, env_count,
    bufs)`` bitwise (q, actions, epsilon, step counter), its ticket counter is back to 0 after
    every launch, and both match the twin (``twin_q(head)``: the twin's Q)."""
    bufs_f, bufs_s = _act_buffers(cp, n, A), _act_buffers(cp, n, A)
    eps_twin, count_twin = np.zeros(1, np.float32), np.zeros(1, np.int64)
    for step in range(12):
        head = draw_head()
        env_count = rng.integers(0, 2**40, n, dtype=np.uint64)
        head_d, ec = cp.asarray(head), cp.asarray(env_count)
        fused(head_d, ec, bufs_f)
        separate(head_d, ec, bufs_s)
        # strict=False: the fifth buffer, the ticket counter, is checked on its own below
        for name, x, y in zip(("actions", "q", "epsilon", "count"), bufs_f, bufs_s, strict=False):
            assert_bitwise(x, y, what=f"{name} at step {step}: fused vs separate kernels")
        assert int(bufs_f[4].get()[0]) == 0, "the ticket counter was left non-zero"
        ref.epsilon(eps_twin, count_twin, *_SCHEDULE)
        actions, q, eps, count, _ = bufs_f
        _check_act_against_twin(q, actions, eps, count, twin_q(head), env_count, params, eps_twin, step)


def _c51_act_case(cp, rng, n, A, K, fused, q_separate, q_twin):
    """A fused C51 act kernel ``fused(actions, q, logits, support, env_count, params, eps, count,
    arrivals, *schedule)`` against ``q_separate(q, logits, support)`` + epsilon + env.act on the GPU, and
    the twin's values ``q_twin(q, logits, support)``."""
    from cudarl.ops import agent as ops
    from cudarl.ops import env as env_ops

    params = _env_params()
    seed = cp.asarray(params)
    support = np.linspace(-10, 10, K, dtype=np.float32)
    sup = cp.asarray(support)

    def draw():
        logits = (rng.standard_normal((n, A, K)) * 3).astype(np.float32)
        logits[::4, -1] = logits[::4, 0]  # tied actions: the first index must win on every path
        return logits

    def separate(lg, ec, bufs):
        actions, q, eps, count, _ = bufs
        q_separate(q, lg, sup)
        ops.epsilon(eps, count, *_SCHEDULE)
        env_ops.act(actions, q, eps, ec, seed)

    def twin_q(logits):
        q = np.zeros((n, A), np.float32)
        q_twin(q, logits, support)
        return q

    def run_fused(lg, ec, b):
        fused(b[0], b[1], lg, sup, ec, seed, *b[2:], *_SCHEDULE)

    _fused_vs_separate(cp, rng, n, A, params, draw, run_fused, separate, twin_q)


def _quantile_act_case(cp, rng, n, N, A, fused, q_separate, q_twin):
    """:func:`_c51_act_case` for a fused quantile act kernel ``fused(actions, q, theta, env_count, params,
    eps, count, arrivals, *schedule)``, ``q_separate(q, theta)`` and ``q_twin(q, theta)``."""
    from cudarl.ops import agent as ops
    from cudarl.ops import env as env_ops

    params = _env_params(5)
    seed = cp.asarray(params)

    def separate(th, ec, bufs):
        actions, q, eps, count, _ = bufs
        q_separate(q, th)
        ops.epsilon(eps, count, *_SCHEDULE)
        env_ops.act(actions, q, eps, ec, seed)

    def twin_q(theta):
        q = np.zeros((n, A), np.float32)
        q_twin(q, theta)
        return q

    def run_fused(th, ec, b):
        fused(b[0], b[1], th, ec, seed, *b[2:], *_SCHEDULE)

    draw = lambda: rng.standard_normal((n, N, A)).astype(np.float32)  # noqa: E731
    _fused_vs_separate(cp, rng, n, A, params, draw, run_fused, separate, twin_q)


@pytest.mark.gpu
@pytest.mark.parametrize("n, A, K", [(1, 2, 1), (7, 3, 51), (4096, 3, 51), (4099, 5, 77)])
def test_gpu_act_c51_equals_the_three_kernels_it_fuses(cp, rng, n, A, K):
    """act_c51 against qstats.per_sample + epsilon + env.act on the GPU, and the twin."""
    from cudarl.ops import agent as ops
    from cudarl.ops import qstats as qstats_ops
    from cudarl.reference import qstats

    ent, mass = cp.zeros(n, np.float32), cp.zeros((n, K), np.float32)

    def twin(q, logits, support):
        q[...] = qstats.per_sample(logits, support)[0]

    _c51_act_case(cp, rng, n, A, K, ops.act_c51, lambda q, lg, sup: qstats_ops.per_sample(lg, sup, q, ent, mass), twin)


@pytest.mark.gpu
@pytest.mark.parametrize("n, N, A", [(1, 1, 2), (7, 32, 3), (4099, 8, 5)])
def test_gpu_act_iqn_equals_the_three_kernels_it_fuses(cp, rng, n, N, A):
    """act_iqn against quantile_mean + epsilon + env.act on the GPU, and the twin."""
    from cudarl.ops import agent as ops

    _quantile_act_case(cp, rng, n, N, A, ops.act_iqn, ops.quantile_mean, ref.quantile_mean)


def test_reference_act_c51_dueling_is_the_combine_then_act_c51(rng):
    """The twin of act_c51_dueling is nn.dueling_forward then act_c51 (the NumPy backend's act is
    what it was before the fusion)."""
    from cudarl.reference import nn as nn_ref

    n, A, K = 6, 3, 51
    va = rng.standard_normal((n, (1 + A) * K)).astype(np.float32) * 3
    support = np.linspace(-10, 10, K, dtype=np.float32)
    env_count = rng.integers(0, 2**40, n, dtype=np.uint64)
    logits = np.zeros((n, A, K), np.float32)
    nn_ref.dueling_forward(va, logits)
    outs = []
    for op, head in ((ref.act_c51_dueling, va), (ref.act_c51, logits)):
        bufs = (np.full(n, -1, np.int32), np.zeros((n, A), np.float32), np.zeros(1, np.float32))
        op(*bufs[:2], head, support, env_count, _env_params(), bufs[2], np.array([7], np.int64),
           np.zeros(1, np.uint32), *_SCHEDULE)  # fmt: skip
        outs.append(bufs)
    for x, y in zip(*outs, strict=True):
        assert_bitwise(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("n, A, K", [(1, 2, 1), (7, 3, 51), (33, 9, 33), (4096, 3, 51), (4099, 5, 77)])
def test_gpu_act_c51_dueling_equals_the_dueling_kernel_then_act_c51(cp, rng, n, A, K):
    """act_c51_dueling against nn.dueling_forward + act_c51 on the GPU (bitwise: q, actions, epsilon,
    the step counter), and the twin; K = 1, 33, 77: atoms not a multiple of the warp."""
    from cudarl.ops import agent as ops
    from cudarl.ops import nn as nn_ops
    from cudarl.reference import nn as nn_ref
    from cudarl.reference import qstats

    params = _env_params(3)
    seed = cp.asarray(params)
    support = np.linspace(-10, 10, K, dtype=np.float32)
    sup, logits_d = cp.asarray(support), cp.full((n, A, K), np.nan, np.float32)

    def draw():
        va = (rng.standard_normal((n, (1 + A) * K)) * 3).astype(np.float32)
        va[::4, 2 * K : 3 * K] = va[::4, K : 2 * K]  # tied advantages (so tied actions): the first must win
        return va

    def separate(va, ec, bufs):
        nn_ops.dueling_forward(va, logits_d)
        ops.act_c51(bufs[0], bufs[1], logits_d, sup, ec, seed, *bufs[2:], *_SCHEDULE)

    def twin_q(va):
        logits = np.zeros((n, A, K), np.float32)
        nn_ref.dueling_forward(va, logits)
        return qstats.per_sample(logits, support)[0]

    _fused_vs_separate(
        cp,
        rng,
        n,
        A,
        params,
        draw,
        lambda va, ec, b: ops.act_c51_dueling(b[0], b[1], va, sup, ec, seed, *b[2:], *_SCHEDULE),
        separate,
        twin_q,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["c51", "c51 dueling", "c51 cvar", "quantile mean_std"])
def test_gpu_act_graphed_equals_eager_and_advances_the_schedule(cp, rng, kind):
    """act_c51 (act_c51_dueling from the raw head output, act_c51_risk, act_quantile_risk) captured once:
    each replay reads the step counter from device memory (epsilon follows the schedule) and the head
    outputs and env counters written between replays; graphed and eager launches agree bitwise at every
    step."""
    from cudarl.graph import StepGraph
    from cudarl.ops import agent as ops

    n, A, K, N = 4096, 3, 51, 16
    params = cp.asarray(_env_params(9))
    sup = cp.asarray(np.linspace(-10, 10, K, dtype=np.float32))
    shape = {"c51 dueling": (n, (1 + A) * K), "quantile mean_std": (n, N, A)}.get(kind, (n, A, K))
    head, ec = cp.zeros(shape, np.float32), cp.zeros(n, np.uint64)
    bufs_g, bufs_e = _act_buffers(cp, n, A), _act_buffers(cp, n, A)

    def act(bufs):
        actions, q, eps, count, arrivals = bufs
        sched = (eps, count, arrivals, *_SCHEDULE)
        if kind == "c51":
            ops.act_c51(actions, q, head, sup, ec, params, *sched)
        elif kind == "c51 dueling":
            ops.act_c51_dueling(actions, q, head, sup, ec, params, *sched)
        elif kind == "c51 cvar":
            ops.act_c51_risk(actions, q, head, sup, ec, params, CVAR, 0.2, 0.0, *sched)
        else:
            ops.act_quantile_risk(actions, q, head, ec, params, MEAN_STD, 1.0, 0.5, *sched)

    g = StepGraph(f"agent_act_graphed_{kind.replace(' ', '_')}", [("act", lambda: act(bufs_g))], xp=cp)
    g.capture()
    eps_twin, count_twin = np.zeros(1, np.float32), np.zeros(1, np.int64)
    for step in range(12):
        head.set((rng.standard_normal(shape) * 3).astype(np.float32))
        ec.set(rng.integers(0, 2**40, n, dtype=np.uint64))
        cp.cuda.Device().synchronize()
        g.replay()
        g.synchronize()
        act(bufs_e)
        cp.cuda.Device().synchronize()
        for name, x, y in zip(("actions", "q", "epsilon", "count", "arrivals"), bufs_g, bufs_e, strict=True):
            assert_bitwise(x, y, what=f"{name} at step {step}: graphed vs eager")
        ref.epsilon(eps_twin, count_twin, *_SCHEDULE)
        assert_bitwise(bufs_g[2], eps_twin, what=f"epsilon at step {step}")
        assert int(bufs_g[3].get()[0]) == step + 1 and int(bufs_g[4].get()[0]) == 0


# --- risk-sensitive acting (agent.act_by): c51_risk, quantile_risk, cvar_taus, the fused act kernels ---
CVAR, MEAN_STD = ref.CVAR, ref.MEAN_STD


def _logits_of(p):
    """Logits whose softmax is ``p`` (zero mass: -80, below float32's reach after the softmax)."""
    p = np.asarray(p, np.float64)
    return np.where(p > 0, np.log(np.maximum(p, 1e-300)), -80.0).astype(np.float32)


def test_reference_c51_risk_by_hand():
    """Atoms -5, 0, 1 with mass 0.1, 0, 0.9: the mean 0.4 prefers it to a sure 0, its 10% tail (-5) and
    mean - std (0.4 - 1.8) do not; at alpha 0.5 the tail is the -5 atom and 0.4 of the 1 atom."""
    support = np.array([-5, 0, 1], np.float32)
    logits = _logits_of([[[0.1, 0, 0.9], [0, 1, 0]]])
    q = np.empty((1, 2), np.float32)
    for mode, alpha, lam, want in (
        (CVAR, 0.1, 0, [-5.0, 0.0]),
        (CVAR, 0.5, 0, [(0.1 * -5 + 0.4 * 1) / 0.5, 0.0]),
        (CVAR, 1.0, 0, [0.4, 0.0]),
        (MEAN_STD, 1.0, 1.0, [0.4 - 1.8, 0.0]),
        (MEAN_STD, 1.0, 0.0, [0.4, 0.0]),
    ):
        ref.c51_risk(q, logits, support, mode, alpha, lam)
        np.testing.assert_allclose(q, [want], rtol=1e-5, atol=1e-5, err_msg=f"mode {mode} alpha {alpha}")


def test_reference_c51_cvar_is_the_integral_of_the_quantile_function(rng):
    """CVaR_alpha = (1/alpha) int_0^alpha F^-1(u) du of the categorical distribution, in float64 by
    integrating its step quantile function on a fine grid of u."""
    K = 21
    support = np.linspace(-3, 4, K, dtype=np.float32)
    logits = (rng.standard_normal((5, 2, K)) * 2).astype(np.float32)
    p = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    q = np.empty((5, 2), np.float32)
    for alpha in (0.03, 0.25, 0.5, 0.9):
        ref.c51_risk(q, logits, support, CVAR, alpha, 0.0)
        u = (np.arange(200_000) + 0.5) / 200_000 * alpha
        cdf = np.cumsum(p, -1)
        want = np.empty((5, 2))
        for i in range(5):
            for a in range(2):
                k = np.minimum(np.searchsorted(cdf[i, a], u, side="right"), K - 1)
                want[i, a] = support.astype(np.float64)[k].mean()
        np.testing.assert_allclose(q, want, atol=2e-3)


def test_reference_quantile_risk_by_hand():
    theta = np.array([-4, 0, 1, 3], np.float32).reshape(1, 4, 1)
    q = np.empty((1, 1), np.float32)
    for mode, alpha, lam, want in (
        (CVAR, 0.5, 0, -2.0),  # the first two of four cells
        (CVAR, 0.375, 0, -4.0 / 1.5),  # the first cell and half the second
        (CVAR, 1.0, 0, 0.0),
        (MEAN_STD, 1.0, 1.0, -np.sqrt(6.5)),
        (MEAN_STD, 1.0, 0.5, -0.5 * np.sqrt(6.5)),
    ):
        ref.quantile_risk(q, theta, mode, alpha, lam)
        assert q[0, 0] == pytest.approx(want, rel=1e-6, abs=1e-6), (mode, alpha)
    tau = np.array([0.0, 0.5, 0.999], np.float32)
    ref.cvar_taus(tau, 0.2)
    assert tau.tolist() == pytest.approx([0.0, 0.1, 0.1998]) and tau.max() < 0.2


def test_reference_act_risk_is_the_three_steps_it_fuses(rng):
    from cudarl.reference import env as env_ref

    n, A = 9, 3
    logits, theta, support, env_count, params = _twin_act_inputs(rng, n, A)
    for mode, alpha, lam in ((CVAR, 0.2, 0.0), (MEAN_STD, 1.0, 0.7)):
        for fused, value, head in (
            (ref.act_c51_risk, ref.c51_risk, (logits, support)),
            (ref.act_quantile_risk, ref.quantile_risk, (theta,)),
        ):
            eps, count, arrivals = np.zeros(1, np.float32), np.array([4], np.int64), np.zeros(1, np.uint32)
            actions, q = np.full(n, -1, np.int32), np.zeros((n, A), np.float32)
            fused(actions, q, *head, env_count, params, mode, alpha, lam, eps, count, arrivals, *_SCHEDULE)
            q_want, e_want, c_want = np.zeros((n, A), np.float32), np.zeros(1, np.float32), np.array([4], np.int64)
            value(q_want, *head, mode, alpha, lam)
            ref.epsilon(e_want, c_want, *_SCHEDULE)
            a_want = np.zeros(n, np.int32)
            env_ref.act(a_want, q_want, e_want, env_count, params)
            assert_bitwise(q, q_want)
            assert_bitwise(actions, a_want)
            assert eps[0] == e_want[0] and count[0] == 5


_RISKS = [(CVAR, 0.05, 0.0), (CVAR, 0.37, 0.0), (CVAR, 1.0, 0.0), (MEAN_STD, 1.0, 0.0), (MEAN_STD, 1.0, 1.3)]


@pytest.mark.gpu
@pytest.mark.parametrize("n, A, K", [(1, 2, 1), (7, 3, 51), (4099, 5, 77), (33, 3, 32)])
@pytest.mark.parametrize("mode, alpha, lam", _RISKS)
def test_gpu_c51_risk(cp, rng, n, A, K, mode, alpha, lam):
    from cudarl.ops import agent as ops

    logits = (rng.standard_normal((n, A, K)) * 3).astype(np.float32)
    support = np.linspace(-10, 10, K, dtype=np.float32)
    q = cp.full((n, A), np.nan, np.float32)
    ops.c51_risk(q, cp.asarray(logits), cp.asarray(support), mode, alpha, lam)
    want = np.empty((n, A), np.float32)
    ref.c51_risk(want, logits, support, mode, alpha, lam)
    assert_parity(q, want, what=f"c51_risk mode {mode} alpha {alpha} lam {lam}")


@pytest.mark.gpu
@pytest.mark.parametrize("B, N, A", [(1, 1, 2), (7, 32, 3), (4096, 8, 5), (9, 200, 3)])
@pytest.mark.parametrize("mode, alpha, lam", _RISKS)
def test_gpu_quantile_risk_and_cvar_taus(cp, rng, B, N, A, mode, alpha, lam):
    from cudarl.ops import agent as ops

    theta = rng.standard_normal((B, N, A)).astype(np.float32)
    q = cp.full((B, A), np.nan, np.float32)
    ops.quantile_risk(q, cp.asarray(theta), mode, alpha, lam)
    want = np.empty((B, A), np.float32)
    ref.quantile_risk(want, theta, mode, alpha, lam)
    assert_parity(q, want, what=f"quantile_risk mode {mode} alpha {alpha} lam {lam}")
    tau = rng.random((B, N)).astype(np.float32)
    tau_g = cp.asarray(tau)
    ops.cvar_taus(tau_g, alpha)
    ref.cvar_taus(tau, alpha)
    assert_bitwise(tau_g, tau)


@pytest.mark.gpu
@pytest.mark.parametrize("n, A, K", [(1, 2, 1), (7, 3, 51), (4099, 5, 77)])
@pytest.mark.parametrize("mode, alpha, lam", [(CVAR, 0.1, 0.0), (MEAN_STD, 1.0, 0.8)])
def test_gpu_act_c51_risk_equals_the_three_kernels_it_fuses(cp, rng, n, A, K, mode, alpha, lam):
    """act_c51_risk against c51_risk + epsilon + env.act on the GPU, and the twin."""
    from cudarl.ops import agent as ops

    risk = (mode, alpha, lam)

    def fused(actions, q, lg, sup, ec, params, *rest):
        ops.act_c51_risk(actions, q, lg, sup, ec, params, *risk, *rest)

    _c51_act_case(
        cp,
        rng,
        n,
        A,
        K,
        fused,
        lambda q, lg, sup: ops.c51_risk(q, lg, sup, *risk),
        lambda q, lg, sup: ref.c51_risk(q, lg, sup, *risk),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("n, N, A", [(1, 1, 2), (7, 32, 3), (4099, 8, 5)])
@pytest.mark.parametrize("mode, alpha, lam", [(CVAR, 0.3, 0.0), (MEAN_STD, 1.0, 0.8)])
def test_gpu_act_quantile_risk_equals_the_three_kernels_it_fuses(cp, rng, n, N, A, mode, alpha, lam):
    """act_quantile_risk against quantile_risk + epsilon + env.act on the GPU, and the twin."""
    from cudarl.ops import agent as ops

    risk = (mode, alpha, lam)

    def fused(actions, q, th, ec, params, *rest):
        ops.act_quantile_risk(actions, q, th, ec, params, *risk, *rest)

    _quantile_act_case(
        cp,
        rng,
        n,
        N,
        A,
        fused,
        lambda q, th: ops.quantile_risk(q, th, *risk),
        lambda q, th: ref.quantile_risk(q, th, *risk),
    )
