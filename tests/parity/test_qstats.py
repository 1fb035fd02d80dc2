"""Q statistics (expected Q, entropy, utilisation, Q variance; the moments of a head without atoms)."""

import numpy as np
import pytest

from cudarl.reference import c51_chain as c51
from cudarl.reference import qstats as ref
from cudarl.testing import assert_bitwise, assert_parity, poison

Z5 = np.linspace(-2, 2, 5, dtype=np.float32)


def _peaked(k, K=5, height=60.0):
    x = np.zeros(K, np.float64)
    x[k] = height  # softmax is a one-hot to float64 precision (e^-60)
    return x


def test_q_stats_hand_case():
    # sample 0: actions put all mass on atoms 0 and 4; sample 1: on atoms 2 and 4
    logits = np.stack([np.stack([_peaked(0), _peaked(4)]), np.stack([_peaked(2), _peaked(4)])])
    s = ref.q_stats(logits, Z5, compute_dtype=np.float64)
    L = ref.layout(2)
    np.testing.assert_allclose(s[L["mean_q"]], [(-2 + 0) / 2, 2.0], atol=1e-12)
    np.testing.assert_allclose(s[L["var_q"]], [1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(s[L["entropy"]], 0.0, atol=1e-20)
    # batch-mean mass: atom 0: 1/4, atom 2: 1/4, atom 4: 1/2, atoms 1 and 3: ~0  -> 3 of 5 used
    assert s[L["utilisation"]] == pytest.approx(0.6)


def test_uniform_distributions_use_every_atom_with_maximal_entropy():
    s = ref.q_stats(np.zeros((4, 3, 11)), np.linspace(-1, 1, 11), compute_dtype=np.float64)
    L = ref.layout(3)
    assert s[L["utilisation"]] == 1.0
    np.testing.assert_allclose(s[L["entropy"]], np.log(11))
    np.testing.assert_allclose(s[L["mean_q"]], 0, atol=1e-12)


def test_q_statistics_move_after_a_c51_step(rng):
    """Rule 8: one learning step moves the observables the host reads."""
    B, A, K = 64, 3, 51
    z = np.linspace(-10, 10, K, dtype=np.float32)
    logits = rng.normal(size=(B, A, K)).astype(np.float32)
    a = rng.integers(0, A, B).astype(np.int32)
    target = c51.project(c51.softmax(logits[:, 0]), np.full(B, 5.0, np.float32), np.zeros(B, np.float32), z)
    before = ref.q_stats(logits, z)
    _, _, grad, _ = c51.loss(logits, a, target, np.ones(B, np.float32))
    after = ref.q_stats(logits - 50.0 * grad, z)
    L = ref.layout(A)
    assert np.all(after[L["mean_q"]] > before[L["mean_q"]])  # the target sits at +5
    assert after[L["entropy"]] != before[L["entropy"]]
    assert np.all(after[L["var_q"]] != before[L["var_q"]])


def test_moments_are_reduces_q_half_and_leave_the_atom_statistics_nan(rng):
    q = rng.normal(size=(33, 3)).astype(np.float32)
    L = ref.layout(3)
    m = ref.moments(q)
    full = ref.reduce(q, np.zeros(33, np.float32), np.full((33, 5), 0.2, np.float32))
    np.testing.assert_array_equal(m[L["mean_q"]], full[L["mean_q"]])
    np.testing.assert_array_equal(m[L["var_q"]], full[L["var_q"]])
    assert np.isnan(m[L["entropy"]]) and np.isnan(m[L["utilisation"]])


def test_expected_q_is_per_samples_q(rng):
    logits = rng.normal(size=(9, 3, 11)).astype(np.float32)
    z = np.linspace(-1, 1, 11, dtype=np.float32)
    assert_bitwise(ref.expected_q(logits, z), ref.per_sample(logits, z)[0], what="expected Q")


# ---- GPU ------------------------------------------------------------------------------------
def _concentrated_logits(rng, B, A, K):
    k = np.arange(K)
    centre = rng.uniform(0.3 * K, 0.7 * K, (B, A, 1))
    return (-((k - centre) ** 2) / (0.02 * K * K) + rng.normal(size=(B, A, K)) * 0.3).astype(np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("B,A,K", [(1, 3, 11), (7, 3, 51), (300, 2, 101), (4096, 3, 51), (1000, 5, 11)])
def test_gpu_q_stats_match_reference(cp, rng, B, A, K):
    from cudarl.ops import qstats as ops

    z = np.linspace(-10, 10, K, dtype=np.float32)
    logits = _concentrated_logits(rng, B, A, K)
    q, ent, mass, out = (
        cp.empty((B, A), np.float32),
        cp.empty(B, np.float32),
        cp.empty((B, K), np.float32),
        cp.empty(2 * A + 2, np.float32),
    )
    for x in (q, ent, mass, out):
        poison(x)
    ops.q_stats(cp.asarray(logits), cp.asarray(z), q, ent, mass, out)
    r_q, r_ent, r_mass = ref.per_sample(logits, z)
    assert_parity(q, r_q, what="expected Q")
    assert_parity(ent, r_ent, what="entropy per sample")
    assert_parity(mass, r_mass, what="atom mass per sample")
    want = ref.q_stats(logits, z)
    got = out.get()
    L = ref.layout(A)
    names = ("mean_q", "var_q", "entropy") if B > 1 else ("mean_q", "entropy")
    for name in names:
        assert_parity(np.atleast_1d(got[L[name]]), np.atleast_1d(want[L[name]]), what=name)
    if B == 1:  # one sample: Q - mean_Q is exactly 0 (two passes), so the variance is exactly 0
        assert np.all(want[L["var_q"]] == 0), f"reference var_q with B=1: {want[L['var_q']]}"
        assert np.all(got[L["var_q"]] == 0), f"GPU var_q with B=1 (poisoned before the launch): {got[L['var_q']]}"
    # a column whose mean sits within float32 rounding of the threshold may count either way
    col = r_mass.astype(np.float64).mean(0)
    near = np.sum(np.abs(col - 1.0 / (10 * K)) < 1e-6)
    assert abs(got[L["utilisation"]] - want[L["utilisation"]]) <= near / K + 1e-7
    assert 0 < want[L["utilisation"]] < 1  # the inputs leave some atoms unused


@pytest.mark.gpu
def test_gpu_q_stats_reach_the_host_through_pinned_memory_bitwise_repeatably(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import qstats as ops
    from cudarl.pinned import PinnedReadback

    B, A, K = 512, 3, 51
    z = cp.asarray(np.linspace(-10, 10, K, dtype=np.float32))
    logits = cp.asarray(_concentrated_logits(rng, B, A, K))
    q, ent, mass = cp.empty((B, A), np.float32), cp.empty(B, np.float32), cp.empty((B, K), np.float32)
    rb = PinnedReadback(2 * A + 2, np.float32, cp)

    def phase():
        ops.q_stats(logits, z, q, ent, mass, rb.device)

    cp.cuda.Device().synchronize()
    g = StepGraph("qstats_parity", [("stats", phase)], xp=cp)
    g.run_eager()
    rb.mark_written(g.stream)
    eager = rb.read()
    np.testing.assert_allclose(eager, ref.q_stats(logits.get(), z.get()), rtol=1e-5, atol=1e-6)
    g.capture()
    g.replay()
    rb.mark_written(g.stream)
    assert_bitwise(rb.read(), eager, what="graphed q stats")


@pytest.mark.gpu
@pytest.mark.parametrize("B,A", [(1, 3), (7, 2), (512, 3), (4097, 5)])
def test_gpu_moments_match_reference_and_reduce(cp, rng, B, A):
    from cudarl.ops import qstats as ops

    q = rng.normal(size=(B, A)).astype(np.float32) * 3 + 1
    out = cp.empty(2 * A + 2, np.float32)
    poison(out)
    ops.moments(cp.asarray(q), out)
    got, want, L = out.get(), ref.moments(q), ref.layout(A)
    assert_parity(got[L["mean_q"]], want[L["mean_q"]], what="mean Q")
    if B > 1:
        assert_parity(got[L["var_q"]], want[L["var_q"]], what="var Q")
    assert np.isnan(got[L["entropy"]]) and np.isnan(got[L["utilisation"]])
    # the same Q half, bit for bit, as reduce writes it
    K = 5
    full = cp.empty(2 * A + 2, np.float32)
    ops.reduce(cp.asarray(q), cp.zeros(B, np.float32), cp.full((B, K), 0.2, np.float32), full)
    assert_bitwise(got[L["mean_q"]], full.get()[L["mean_q"]], what="moments vs reduce mean")
    assert_bitwise(got[L["var_q"]], full.get()[L["var_q"]], what="moments vs reduce var")


@pytest.mark.gpu
@pytest.mark.parametrize("B,A,K", [(1, 3, 11), (33, 3, 51), (4096, 3, 51)])
def test_gpu_expected_q_is_per_samples_q_bitwise(cp, rng, B, A, K):
    from cudarl.ops import qstats as ops

    logits = cp.asarray(_concentrated_logits(rng, B, A, K))
    z = cp.asarray(np.linspace(-10, 10, K, dtype=np.float32))
    q1, q2 = cp.empty((B, A), np.float32), cp.empty((B, A), np.float32)
    poison(q1)
    poison(q2)
    ops.expected_q(logits, z, q1)
    ops.per_sample(logits, z, q2, cp.empty(B, np.float32), cp.empty((B, K), np.float32))
    assert_bitwise(q1, q2, what="expected_q vs per_sample")
    assert_parity(q1, ref.expected_q(logits.get(), z.get()), what="expected Q")
