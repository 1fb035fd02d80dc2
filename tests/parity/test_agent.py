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
    from cudarl.reference.env import EnvParams

    return EnvParams(0, 1, 1, 1, False, 0.0, 0.0, seed, False, False)


def test_reference_act_is_the_three_steps_it_fuses(rng):
    """The twin of act_c51 (act_iqn) is expected Q (quantile mean), the epsilon schedule, then the
    env's epsilon-greedy act, in that order: the NumPy backend runs exactly what it ran before."""
    from cudarl.reference import env as env_ref
    from cudarl.reference import qstats

    n, A, K, N = 9, 3, 51, 8
    logits = rng.standard_normal((n, A, K)).astype(np.float32) * 3
    theta = rng.standard_normal((n, N, A)).astype(np.float32)
    support = np.linspace(-10, 10, K, dtype=np.float32)
    env_count = rng.integers(0, 2**40, n, dtype=np.uint64)
    params = _env_params()
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


@pytest.mark.gpu
@pytest.mark.parametrize("n, A, K", [(1, 2, 1), (7, 3, 51), (4096, 3, 51), (4099, 5, 77)])
def test_gpu_act_c51_equals_the_three_kernels_it_fuses(cp, rng, n, A, K):
    """act_c51 against qstats.per_sample + epsilon + env.act on the GPU, and the twin."""
    from cudarl.ops import agent as ops
    from cudarl.ops import env as env_ops
    from cudarl.ops import qstats as qstats_ops
    from cudarl.reference import qstats

    params = _env_params()
    support = np.linspace(-10, 10, K, dtype=np.float32)
    sup, ent, mass = cp.asarray(support), cp.zeros(n, np.float32), cp.zeros((n, K), np.float32)

    def draw():
        logits = (rng.standard_normal((n, A, K)) * 3).astype(np.float32)
        logits[::4, -1] = logits[::4, 0]  # tied actions: the first index must win on every path
        return logits

    def separate(lg, ec, bufs):
        actions, q, eps, count, _ = bufs
        qstats_ops.per_sample(lg, sup, q, ent, mass)
        ops.epsilon(eps, count, *_SCHEDULE)
        env_ops.act(actions, q, eps, ec, params)

    _fused_vs_separate(
        cp,
        rng,
        n,
        A,
        params,
        draw,
        lambda lg, ec, b: ops.act_c51(b[0], b[1], lg, sup, ec, params, *b[2:], *_SCHEDULE),
        separate,
        lambda logits: qstats.per_sample(logits, support)[0],
    )


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
    support = np.linspace(-10, 10, K, dtype=np.float32)
    sup, logits_d = cp.asarray(support), cp.full((n, A, K), np.nan, np.float32)

    def draw():
        va = (rng.standard_normal((n, (1 + A) * K)) * 3).astype(np.float32)
        va[::4, 2 * K : 3 * K] = va[::4, K : 2 * K]  # tied advantages (so tied actions): the first must win
        return va

    def separate(va, ec, bufs):
        nn_ops.dueling_forward(va, logits_d)
        ops.act_c51(bufs[0], bufs[1], logits_d, sup, ec, params, *bufs[2:], *_SCHEDULE)

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
        lambda va, ec, b: ops.act_c51_dueling(b[0], b[1], va, sup, ec, params, *b[2:], *_SCHEDULE),
        separate,
        twin_q,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("n, N, A", [(1, 1, 2), (7, 32, 3), (4099, 8, 5)])
def test_gpu_act_iqn_equals_the_three_kernels_it_fuses(cp, rng, n, N, A):
    """act_iqn against quantile_mean + epsilon + env.act on the GPU, and the twin."""
    from cudarl.ops import agent as ops
    from cudarl.ops import env as env_ops

    params = _env_params(5)

    def separate(th, ec, bufs):
        actions, q, eps, count, _ = bufs
        ops.quantile_mean(q, th)
        ops.epsilon(eps, count, *_SCHEDULE)
        env_ops.act(actions, q, eps, ec, params)

    def twin_q(theta):
        q = np.zeros((n, A), np.float32)
        ref.quantile_mean(q, theta)
        return q

    _fused_vs_separate(
        cp,
        rng,
        n,
        A,
        params,
        lambda: rng.standard_normal((n, N, A)).astype(np.float32),
        lambda th, ec, b: ops.act_iqn(b[0], b[1], th, ec, params, *b[2:], *_SCHEDULE),
        separate,
        twin_q,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["act_c51", "act_c51_dueling"])
def test_gpu_act_c51_graphed_equals_eager_and_advances_the_schedule(cp, rng, op):
    """act_c51 (act_c51_dueling, from the raw head output) captured once: each replay reads the step
    counter from device memory (epsilon follows the schedule) and the head outputs and env counters
    written between replays; graphed and eager launches agree bitwise at every step."""
    from cudarl.graph import StepGraph
    from cudarl.ops import agent as ops

    n, A, K = 4096, 3, 51
    params = _env_params(9)
    sup = cp.asarray(np.linspace(-10, 10, K, dtype=np.float32))
    head_shape = (n, A, K) if op == "act_c51" else (n, (1 + A) * K)
    lg, ec = cp.zeros(head_shape, np.float32), cp.zeros(n, np.uint64)
    bufs_g, bufs_e = _act_buffers(cp, n, A), _act_buffers(cp, n, A)

    def act(bufs):
        actions, q, eps, count, arrivals = bufs
        getattr(ops, op)(actions, q, lg, sup, ec, params, eps, count, arrivals, *_SCHEDULE)

    g = StepGraph("agent_act_graphed", [("act", lambda: act(bufs_g))], xp=cp)
    g.capture()
    eps_twin, count_twin = np.zeros(1, np.float32), np.zeros(1, np.int64)
    for step in range(12):
        lg.set((rng.standard_normal(head_shape) * 3).astype(np.float32))
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
