"""The unfused C51 chain (the fused kernel's oracle): hand cases and identities on the reference,
finite differences, GPU parity.

CPU tests check ``cudarl.reference.c51_chain`` (and ``cudarl.losses`` on NumPy); ``gpu`` tests hold
``cuda_src/c51_chain.cu`` to it, eager and graphed, and cross-check against PyTorch.
"""

import numpy as np
import pytest
from c51_cases import empty, former_chain, gpu_inputs, popart_state, rand_probs, targets_inputs

from cudarl import losses
from cudarl.reference import c51_chain as ref
from cudarl.testing import assert_bitwise, assert_parity, assert_reruns_bitwise, finite_difference

SUPPORT5 = np.linspace(-2, 2, 5, dtype=np.float32)  # z = -2, -1, 0, 1, 2; dz = 1


def _one_hot(k, K=5):
    p = np.zeros((1, K), np.float32)
    p[0, k] = 1
    return p


# ---- hand-computed projections --------------------------------------------------------------
def test_projection_atoms_exactly_on_grid_keep_all_their_mass():
    p = np.array([[0.1, 0.2, 0.3, 0.25, 0.15]], np.float32)
    m = ref.project(p, np.float32([1.0]), np.float32([1.0]), SUPPORT5)
    # z + 1 lands on the grid (l == u): each atom moves up one, and the top two clip onto v_max.
    np.testing.assert_array_equal(m, [[0.0, p[0, 0], p[0, 1], p[0, 2], p[0, 3] + p[0, 4]]])  # exact: no split


def test_projection_between_atoms_splits_linearly():
    m = ref.project(_one_hot(2), np.float32([0.25]), np.float32([1.0]), SUPPORT5)
    np.testing.assert_allclose(m, [[0, 0, 0.75, 0.25, 0]], atol=1e-7)


def test_projection_clips_at_both_ends():
    p = np.array([[0.1, 0.2, 0.3, 0.25, 0.15]], np.float32)
    lo = ref.project(p, np.float32([-10.0]), np.float32([0.9]), SUPPORT5)
    hi = ref.project(p, np.float32([+10.0]), np.float32([0.9]), SUPPORT5)
    np.testing.assert_allclose(lo, [[1, 0, 0, 0, 0]], atol=1e-7)
    np.testing.assert_allclose(hi, [[0, 0, 0, 0, 1]], atol=1e-7)
    # Half-clipped: r = 1.5, d = 1 puts z = -2 at -0.5 (splits) and everything from z = 1 up at v_max.
    m = ref.project(p, np.float32([1.5]), np.float32([1.0]), SUPPORT5)
    np.testing.assert_allclose(m, [[0, 0.05, 0.05 + 0.1, 0.1 + 0.15, 0.15 + 0.25 + 0.15]], atol=1e-7)


def test_terminal_projects_a_point_mass_at_the_reward():
    p = np.array([[0.1, 0.2, 0.3, 0.25, 0.15]], np.float32)
    m = ref.project(p, np.float32([0.25]), np.float32([0.0]), SUPPORT5)
    np.testing.assert_allclose(m, [[0, 0, 0.75, 0.25, 0]], atol=1e-7)
    m = ref.project(p, np.float32([-1.0]), np.float32([0.0]), SUPPORT5)  # terminal, on the grid
    np.testing.assert_array_equal(m, [[0, 1, 0, 0, 0]])


@pytest.mark.parametrize("K", [11, 51, 101])
def test_projected_mass_sums_to_one(rng, K):
    B = 2000
    z = np.linspace(-10, 10, K, dtype=np.float32)
    dz = z[1] - z[0]
    p = rand_probs(rng, B, K)
    r = rng.uniform(-25, 25, B).astype(np.float32)
    r[::3] = (rng.integers(-K, K, B)[::3] * dz).astype(np.float32)  # many exactly on the grid
    d = rng.choice(np.float32([0.0, 0.5, 0.99, 1.0]), B)
    m = ref.project(p, r, d, z)
    assert np.all(m >= 0)
    np.testing.assert_allclose(m.sum(1), 1.0, atol=1e-6)


def test_projection_preserves_the_mean_inside_the_support(rng):
    K, B = 51, 300
    z = np.linspace(-10, 10, K)
    p = ref.softmax(rng.normal(size=(B, K)) - (np.abs(z) / 2)[None])  # little mass near the edges
    r = rng.uniform(-0.5, 0.5, B)
    d = np.full(B, 0.5)  # r + d z stays inside [-10, 10]
    m = ref.project(p, r, d, z, compute_dtype=np.float64)
    np.testing.assert_allclose(m @ z, r + d * (p @ z), atol=1e-10)


# ---- double DQN -----------------------------------------------------------------------------
def test_next_probs_selects_with_online_and_evaluates_with_target():
    z = SUPPORT5
    online = np.full((1, 3, 5), -5.0, np.float32)
    online[0, 0, 2] = online[0, 1, 4] = online[0, 2, 0] = 5.0  # Q ~ 0, 2, -2: action 1 wins
    target = np.zeros((1, 3, 5), np.float32)
    target[0, 1] = [0, 1, 2, 3, 4]
    target[0, 2] = [9, 0, 0, 0, 0]  # the target net's own greedy action would differ
    probs, a = ref.next_probs(online, target, z)
    assert a.dtype == np.int32 and a.tolist() == [1]
    np.testing.assert_allclose(probs[0], ref.softmax(np.arange(5.0)), rtol=1e-6)


def test_next_probs_takes_the_first_action_on_a_tie():
    online = np.zeros((2, 4, 5), np.float32)
    _, a = ref.next_probs(online, online, SUPPORT5)
    assert a.tolist() == [0, 0]


# ---- loss, gradient, priorities ---------------------------------------------------------------
def _loss_inputs(rng, B, A, K, dtype=np.float32):
    logits = rng.normal(size=(B, A, K)).astype(dtype)
    a = rng.integers(0, A, B).astype(np.int32)
    m = ref.softmax(rng.normal(size=(B, K)) * 2).astype(dtype)
    w = rng.uniform(0.2, 1.0, B).astype(dtype)
    return logits, a, m, w


@pytest.mark.parametrize("normalised", [True, False])
def test_loss_gradient_matches_finite_differences(rng, normalised):
    B, A, K = 5, 3, 11
    logits, a, m, w = _loss_inputs(rng, B, A, K, np.float64)
    if not normalised:
        m = m * rng.uniform(0.5, 1.5, (B, 1))  # the gradient formula keeps sum(m)
    _, _, grad, _ = ref.loss(logits, a, m, w, compute_dtype=np.float64)
    num = finite_difference(lambda x: ref.loss(x, a, m, w, compute_dtype=np.float64)[1], logits)
    np.testing.assert_allclose(grad, num, atol=1e-8, rtol=1e-6)
    assert np.all(grad[np.arange(B)[:, None], np.array([[x for x in range(A) if x != ai] for ai in a])] == 0)


def test_loss_is_the_weighted_mean_of_cross_entropies(rng):
    logits, a, m, w = _loss_inputs(rng, 7, 3, 11, np.float64)
    per, mean, _, prio_ce = ref.loss(logits, a, m, w, priority="ce", compute_dtype=np.float64)
    logp = np.log(ref.softmax(logits[np.arange(7), a]))
    np.testing.assert_allclose(per, -(m * logp).sum(1), rtol=1e-12)
    np.testing.assert_allclose(mean, (w * per).sum() / 7, rtol=1e-12)
    np.testing.assert_array_equal(prio_ce, per)


def test_kl_priority_is_zero_at_the_target_and_ce_minus_entropy_elsewhere(rng):
    logits, a, m, w = _loss_inputs(rng, 6, 2, 11, np.float64)
    m_self = ref.softmax(logits[np.arange(6), a])
    _, _, _, kl_self = ref.loss(logits, a, m_self, w, priority="kl", compute_dtype=np.float64)
    np.testing.assert_allclose(kl_self, 0, atol=1e-12)
    per, _, _, kl = ref.loss(logits, a, m, w, priority="kl", compute_dtype=np.float64)
    np.testing.assert_allclose(kl, per + (m * np.log(m)).sum(1), rtol=1e-10)
    assert np.all(kl > 0)


def test_loss_rejects_out_of_range_actions():
    logits = np.zeros((2, 3, 5), np.float32)
    with pytest.raises(ValueError, match="actions"):
        ref.loss(logits, np.int32([0, 3]), np.full((2, 5), 0.2, np.float32), np.ones(2, np.float32))


def test_public_c51_project_dispatches_to_the_reference(rng):
    p = rand_probs(rng, 9, 11)
    z = np.linspace(-5, 5, 11, dtype=np.float32)
    r, d = rng.uniform(-3, 3, 9).astype(np.float32), np.full(9, 0.9, np.float32)
    out = losses.c51_project(p, r, d, z)
    assert out.shape == (9, 11) and out.dtype == np.float32
    np.testing.assert_array_equal(out, ref.project(p, r, d, z))


# ---- the targets phase (reference) -------------------------------------------------------
@pytest.mark.parametrize("popart", [False, True])
@pytest.mark.parametrize("B,A,K", [(1, 3, 11), (37, 3, 51), (300, 5, 101)])
def test_targets_are_bitwise_the_former_chain_of_ops(rng, B, A, K, popart):
    z, online, target, r, d = targets_inputs(rng, B, A, K)
    state = popart_state(rng) if popart else None
    before = None if state is None else state.copy()
    got = ref.targets(online, target, z, r, d, state, 0.05 if popart else None)
    want = former_chain(online, target, z, r, d, state, 0.05)
    for name, g, w in zip(("m", "probs", "a_star", "y", "r_norm", "state"), got, want, strict=True):
        if w is None:
            assert g is None, name
        else:
            assert_bitwise(g, w, what=name)
    if popart:
        np.testing.assert_array_equal(state, before)  # the input state is not modified


def test_targets_update_with_this_steps_y_then_normalise_with_the_new_statistics(rng):
    """PopArt order: y uses the statistics before the step, r~ the ones after (float64 by hand)."""
    from cudarl.reference import popart as pref

    B, A, K = 64, 3, 51
    z, online, target, r, d = targets_inputs(rng, B, A, K)
    state, beta = popart_state(rng), 0.2
    m, probs, _, y, r_norm, new = ref.targets(online, target, z, r, d, state, beta)
    s0 = np.float64(state[pref.SIGMA]) / state[pref.SCALE]
    y64 = r + d * (s0 * (probs.astype(np.float64) @ z) + state[pref.MU])
    np.testing.assert_allclose(y, y64, rtol=1e-5, atol=1e-5)
    c = 1 - np.float64(state[pref.DECAY]) * (1 - beta)
    m1 = (1 - beta) * np.float64(state[pref.M1]) + beta * y64.mean()
    m2 = (1 - beta) * np.float64(state[pref.M2]) + beta * (y64**2).mean()
    mu, sigma = m1 / c, np.sqrt(m2 / c - (m1 / c) ** 2)
    np.testing.assert_allclose([new[pref.MU], new[pref.SIGMA]], [mu, sigma], rtol=1e-4)
    assert abs(mu - state[pref.MU]) > 0.1  # the statistics moved, so the order is observable
    np.testing.assert_allclose(r_norm, (r - (1 - d) * mu) / (sigma / state[pref.SCALE]), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(m, ref.project(probs, r_norm, d, z))


def test_public_c51_targets_on_numpy_is_the_reference(rng):
    z, online, target, r, d = targets_inputs(rng, 20, 3, 51)
    plain = losses.c51_targets(online, target, z, r, d)
    assert plain.y is None and plain.r_norm is None
    assert_bitwise(plain.target, ref.targets(online, target, z, r, d)[0], what="target without PopArt")
    state = popart_state(rng)
    want = ref.targets(online, target, z, r, d, state, 0.05)
    res = losses.c51_targets(online, target, z, r, d, state, np.float32([0.05]), 1e-4)
    for name, g, w in zip(("target", "probs", "a_star", "y", "r_norm"), list(res)[:5], want[:5], strict=True):
        assert_bitwise(g, w, what=name)
    assert_bitwise(state, want[5], what="PopArt state, moved in place")


# ---- GPU ------------------------------------------------------------------------------------
SHAPES = [(1, 3, 11), (7, 3, 51), (33, 2, 101), (512, 3, 51), (1000, 5, 11), (4096, 3, 101)]


@pytest.mark.gpu
@pytest.mark.parametrize("B,A,K", SHAPES)
def test_gpu_project_matches_reference(cp, rng, B, A, K):
    from cudarl.ops import c51_chain as ops

    z, _, _, r, d, _, _ = gpu_inputs(rng, B, A, K)
    p = rand_probs(rng, B, K)
    out = empty(cp, (B, K))
    ops.project(cp.asarray(p), cp.asarray(r), cp.asarray(d), cp.asarray(z), out)
    assert_parity(out, ref.project(p, r, d, z), what="projection")
    np.testing.assert_allclose(out.get().sum(1), 1.0, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("B,A,K", SHAPES)
def test_gpu_next_probs_matches_reference(cp, rng, B, A, K):
    from cudarl.ops import c51_chain as ops

    z, online, target, *_ = gpu_inputs(rng, B, A, K)
    probs, a_star = empty(cp, (B, K)), empty(cp, (B,), np.int32)
    ops.next_probs(cp.asarray(online), cp.asarray(target), cp.asarray(z), probs, a_star)
    got_a = a_star.get()
    q = ref.expected_q(online, z, compute_dtype=np.float64)
    assert np.all((got_a >= 0) & (got_a < A))
    # Float32 rounding may flip a near-tie; any action within 1e-4 of the best is acceptable.
    assert np.all(q[np.arange(B), got_a] >= q.max(1) - 1e-4), "picked an action that is not (near-)greedy"
    assert np.mean(got_a == np.argmax(q, 1)) >= 0.99
    want = ref.softmax(target[np.arange(B), got_a]).astype(np.float32)
    assert_parity(probs, want, what="next-state probabilities")


@pytest.mark.gpu
@pytest.mark.parametrize("priority", ["ce", "kl"])
@pytest.mark.parametrize("B,A,K", SHAPES)
def test_gpu_loss_matches_reference(cp, rng, B, A, K, priority):
    from cudarl.ops import c51_chain as ops

    z, online, _, _, _, a, w = gpu_inputs(rng, B, A, K)
    m = ref.project(rand_probs(rng, B, K), rng.uniform(-3, 3, B), np.full(B, 0.9), z)  # sparse, with zeros
    per, loss, grad, prio = empty(cp, (B,)), empty(cp, (1,)), empty(cp, (B, A, K)), empty(cp, (B,))
    done = cp.zeros(1, np.uint32)
    ops.loss(
        cp.asarray(online), cp.asarray(a), cp.asarray(m), cp.asarray(w), per, loss, grad, prio, done, priority=priority
    )
    r_per, r_loss, r_grad, r_prio = ref.loss(online, a, m, w, priority=priority)
    assert_parity(per, r_per, what="per-sample loss")
    assert_parity(loss, np.float32([r_loss]), what="mean loss")
    assert_parity(grad, r_grad, what="grad wrt logits")
    assert_parity(prio, r_prio, what=f"{priority} priority")
    assert int(done.get()[0]) == 0, "the last block did not reset the ticket counter"


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 4, 5, 255, 257, 4096, 5001])
def test_gpu_loss_mean_by_the_last_block_is_exact_to_rounding_and_reuses_its_counter(cp, rng, B):
    """One launch writes rows and the batch mean (the last block to finish sums loss_per in a
    fixed order): grids of 1 to 1251 blocks, one counter for every launch, eager and graphed."""
    from cudarl.graph import StepGraph
    from cudarl.ops import c51_chain as ops

    A, K = 3, 51
    z, online, _, _, _, a, w = gpu_inputs(rng, B, A, K)
    m = ref.project(rand_probs(rng, B, K), rng.uniform(-3, 3, B), np.full(B, 0.9), z)
    dev = {k: cp.asarray(v) for k, v in dict(online=online, a=a, m=m, w=w).items()}
    per, loss, grad, prio = empty(cp, (B,)), empty(cp, (1,)), empty(cp, (B, A, K)), empty(cp, (B,))
    done = cp.zeros(1, np.uint32)

    def run():
        ops.loss(dev["online"], dev["a"], dev["m"], dev["w"], per, loss, grad, prio, done)

    cp.cuda.Device().synchronize()
    g = StepGraph("c51_loss_mean", [("loss", run)], xp=cp)
    g.run_eager()
    g.synchronize()
    r_per, r_loss, _, _ = ref.loss(online, a, m, w)
    assert_parity(per, r_per, what="per-sample loss")
    assert_parity(loss, np.float32([r_loss]), what="mean loss")
    first = loss.get()
    np.testing.assert_allclose(first[0], np.float64(w) @ per.get().astype(np.float64) / B, rtol=1e-6)
    g.capture()

    def counter_left_zero(attempt):
        assert int(done.get()[0]) == 0, f"{attempt}: the ticket counter was not left 0"

    assert_reruns_bitwise(
        g, {"mean loss": loss}, {"mean loss": first}, ("eager", "graphed", "graphed", "eager"), check=counter_left_zero
    )


def _ref_targets_given_actions(target, z, r, d, a_star, state=None, beta=None):
    """ref.targets with the GPU's a* (a float32 near-tie may pick another greedy action)."""
    from cudarl.reference import popart as pref

    probs = ref.softmax(target[np.arange(target.shape[0]), a_star]).astype(np.float32)
    if state is None:
        return ref.project(probs, r, d, z), probs, None, None, None
    y = pref.td_targets(r, d, (probs @ z.reshape(-1, 1))[:, 0], state)
    m, r_norm, new_state = ref.project_popart(probs, r, d, z, y, state, beta)
    return m, probs, y, r_norm, new_state


def _check_a_star(got_a, online, z):
    q = ref.expected_q(online, z, compute_dtype=np.float64)
    assert np.all((got_a >= 0) & (got_a < online.shape[1]))
    assert np.all(q[np.arange(len(got_a)), got_a] >= q.max(1) - 1e-4), "picked an action that is not (near-)greedy"
    assert np.mean(got_a == np.argmax(q, 1)) >= 0.99


def _gpu_targets(cp, dev, outs, popart):
    """The targets phase through the public function: one launch, or two with PopArt."""
    out = losses.C51Targets(outs["m"], outs["probs"], outs["a_star"])
    kw = {}
    if popart:
        out.y, out.r_norm, out.scratch = outs["y"], outs["r_norm"], dev["scratch"]
        kw = dict(popart_state=dev["state"], popart_beta=dev["beta"])
    return losses.c51_targets(dev["online"], dev["target"], dev["z"], dev["r"], dev["d"], **kw, out=out)


def _targets_buffers(cp, rng, B, A, K):
    z, online, target, r, d, _, _ = gpu_inputs(rng, B, A, K)
    state = popart_state(rng)
    host = dict(z=z, online=online, target=target, r=r, d=d, state=state, beta=np.float32([0.05]))
    dev = {k: cp.asarray(v) for k, v in host.items()}
    dev["scratch"] = empty(cp, (8,))
    outs = dict(
        m=empty(cp, (B, K)),
        probs=empty(cp, (B, K)),
        a_star=empty(cp, (B,), np.int32),
        y=empty(cp, (B,)),
        r_norm=empty(cp, (B,)),
    )
    return host, dev, outs


@pytest.mark.gpu
@pytest.mark.parametrize("popart", [False, True])
@pytest.mark.parametrize("B,A,K", SHAPES)
def test_gpu_targets_match_reference(cp, rng, B, A, K, popart):
    """cudarl_c51_targets (one launch), or next_probs_td + project_popart (two) against ref.targets."""
    host, dev, outs = _targets_buffers(cp, rng, B, A, K)
    res = _gpu_targets(cp, dev, outs, popart)
    cp.cuda.get_current_stream().synchronize()
    got_a = outs["a_star"].get()
    _check_a_star(got_a, host["online"], host["z"])
    m, probs, y, r_norm, new_state = _ref_targets_given_actions(
        host["target"], host["z"], host["r"], host["d"], got_a, host["state"] if popart else None, 0.05
    )
    assert res.target is outs["m"] and res.probs is outs["probs"]
    assert_parity(outs["probs"], probs, what="next-state probabilities")
    assert_parity(outs["m"], m, what="projected target")
    np.testing.assert_allclose(outs["m"].get().sum(1), 1.0, atol=1e-5)
    if not popart:
        assert res.y is None
        assert np.isnan(outs["y"].get()).all(), "no PopArt: y must not be written"
        return
    assert_parity(outs["y"], y, what="return-space TD targets")
    assert_parity(dev["state"], new_state, what="PopArt state after the update")
    np.testing.assert_allclose(dev["state"].get(), new_state, rtol=1e-5, atol=1e-6)
    assert_bitwise(dev["scratch"], host["state"], what="statistics before the update (scratch)")
    assert_parity(outs["r_norm"], r_norm, what="normalised rewards")


@pytest.mark.gpu
@pytest.mark.parametrize("popart", [False, True])
def test_gpu_fused_targets_agree_with_the_former_launch_chain(cp, rng, popart):
    """The fused launches against the ops the targets phase ran before (next_probs, the cuBLAS
    GEMM probs @ z, PopArt td_targets / update / normalize_rewards, project): the same a*, the
    same numbers to float32 rounding (v_hat is summed in another order than cuBLAS's)."""
    from cudarl.blas import gemm
    from cudarl.ops import c51_chain as ops
    from cudarl.ops import popart as pops

    B, A, K = 512, 3, 51
    host, dev, outs = _targets_buffers(cp, rng, B, A, K)
    old = {k: empty(cp, v.shape, v.dtype) for k, v in outs.items()}
    old_state, v_hat = dev["state"].copy(), empty(cp, (B, 1))
    ops.next_probs(dev["online"], dev["target"], dev["z"], old["probs"], old["a_star"])
    r_in = dev["r"]
    if popart:
        gemm(old["probs"], dev["z"].reshape(-1, 1), v_hat)
        pops.td_targets(dev["r"], dev["d"], v_hat.reshape(-1), old_state, old["y"])
        pops.update(old["y"], old_state, dev["beta"])
        pops.normalize_rewards(dev["r"], dev["d"], old_state, old["r_norm"])
        r_in = old["r_norm"]
    ops.project(old["probs"], r_in, dev["d"], dev["z"], old["m"])
    _gpu_targets(cp, dev, outs, popart)
    cp.cuda.get_current_stream().synchronize()
    assert_bitwise(outs["a_star"], old["a_star"], what="a*")
    assert_bitwise(outs["probs"], old["probs"], what="next-state probabilities (the same rows)")
    if popart:
        assert_parity(outs["y"], old["y"], what="y")
        np.testing.assert_allclose(dev["state"].get(), old_state.get(), rtol=1e-5, atol=1e-6)
        assert_parity(outs["r_norm"], old["r_norm"], what="normalised rewards")
        assert_parity(outs["m"], old["m"], what="target")
    else:
        assert_bitwise(outs["m"], old["m"], what="target (the same rows, one launch)")


@pytest.mark.gpu
@pytest.mark.parametrize("popart", [False, True])
def test_gpu_targets_phase_is_bitwise_repeatable_and_graphed_equals_eager(cp, rng, popart):
    """Run to run and graphed vs eager, bitwise, PopArt state included (restored before each run)."""
    from cudarl.graph import StepGraph

    host, dev, outs = _targets_buffers(cp, rng, 777, 3, 51)
    cp.cuda.Device().synchronize()
    g = StepGraph("c51_targets_parity", [("targets", lambda: _gpu_targets(cp, dev, outs, popart))], xp=cp)
    g.run_eager()
    g.synchronize()
    first = {k: v.get() for k, v in dict(outs, state=dev["state"]).items()}
    if popart:
        assert not np.array_equal(first["state"], host["state"]), "the PopArt statistics did not move"

    def restore():
        dev["state"][...] = cp.asarray(host["state"])

    def same_state(attempt):
        assert_bitwise(dev["state"], first["state"], what=f"{attempt} PopArt state")

    assert_reruns_bitwise(g, outs, first, ("eager",), reset=restore, check=same_state)
    g.capture()
    assert_reruns_bitwise(g, outs, first, ("graphed", "graphed"), reset=restore, check=same_state)
    if popart:  # the state a replay reads is device memory: a second replay moves it again
        g.replay()
        g.synchronize()
        assert not np.array_equal(dev["state"].get(), first["state"])


def _step_buffers(cp, rng, B, A, K):
    z, online, target, r, d, a, w = gpu_inputs(rng, B, A, K)
    logits_tm1 = (rng.normal(size=(B, A, K))).astype(np.float32)
    dev = {
        k: cp.asarray(v)
        for k, v in dict(z=z, online=online, target=target, r=r, d=d, a=a, w=w, logits=logits_tm1).items()
    }
    dev["done"] = cp.zeros(1, np.uint32)
    outs = dict(
        probs=empty(cp, (B, K)),
        a_star=empty(cp, (B,), np.int32),
        m=empty(cp, (B, K)),
        per=empty(cp, (B,)),
        loss=empty(cp, (1,)),
        grad=empty(cp, (B, A, K)),
        prio=empty(cp, (B,)),
    )
    return dev, outs


def _targets_and_loss(dev, outs):
    """The step's targets and loss phases without PopArt: two launches."""
    from cudarl.ops import c51_chain as ops

    ops.targets(dev["online"], dev["target"], dev["z"], dev["r"], dev["d"], outs["m"], outs["probs"], outs["a_star"])
    ops.loss(
        dev["logits"], dev["a"], outs["m"], dev["w"], outs["per"], outs["loss"], outs["grad"], outs["prio"], dev["done"]
    )


@pytest.mark.gpu
def test_gpu_c51_step_is_bitwise_repeatable_and_graphed_equals_eager(cp, rng):
    from cudarl.graph import StepGraph

    dev, outs = _step_buffers(cp, rng, 777, 3, 51)
    cp.cuda.Device().synchronize()
    g = StepGraph("c51_parity", [("targets_and_loss", lambda: _targets_and_loss(dev, outs))], xp=cp)
    g.run_eager()
    g.synchronize()
    first = {k: v.get() for k, v in outs.items()}
    assert_reruns_bitwise(g, outs, first, ("eager",))
    g.capture()
    assert_reruns_bitwise(g, outs, first, ("graphed",))


@pytest.mark.gpu
def test_gpu_c51_loss_and_grad_agree_with_pytorch(cp, rng):
    """Independent PyTorch implementation (float64, autograd) of the same equations."""
    torch = pytest.importorskip("torch", reason="torch is not installed on this GPU host")
    B, A, K = 512, 3, 51
    dev, outs = _step_buffers(cp, rng, B, A, K)
    _targets_and_loss(dev, outs)
    cp.cuda.get_current_stream().synchronize()

    t = {k: torch.from_numpy(v.get()).to(torch.float64) for k, v in dev.items() if k not in ("a",)}
    a = torch.from_numpy(dev["a"].get()).long()
    z = t["z"]
    # double DQN selection and the textbook floor/ceil projection with the l == u fix
    q_online = (torch.softmax(t["online"], -1) * z).sum(-1)
    a_star = torch.from_numpy(outs["a_star"].get()).long()  # selection itself is checked against NumPy
    assert (q_online.gather(1, a_star[:, None])[:, 0] >= q_online.max(1).values - 1e-4).all()
    p_next = torch.softmax(t["target"][torch.arange(B), a_star], -1)
    v_min, v_max, dz = z[0], z[-1], (z[-1] - z[0]) / (K - 1)
    tz = (t["r"][:, None] + t["d"][:, None] * z[None]).clamp(v_min, v_max)
    bpos = ((tz - v_min) / dz).clamp(0, K - 1)
    lo, up = bpos.floor().long(), bpos.ceil().long()
    m = torch.zeros(B, K, dtype=torch.float64)
    m.scatter_add_(1, lo, p_next * (up.double() - bpos))
    m.scatter_add_(1, up, p_next * (bpos - lo.double()))
    m.scatter_add_(1, lo, p_next * (lo == up).double())
    logits = t["logits"].clone().requires_grad_(True)
    logp = torch.log_softmax(logits[torch.arange(B), a], -1)
    per = -(m * logp).sum(-1)
    loss = (t["w"] * per).mean()
    loss.backward()

    assert_parity(outs["m"], m.numpy().astype(np.float32), what="projection vs torch")
    assert_parity(outs["per"], per.detach().numpy().astype(np.float32), what="per-sample loss vs torch")
    assert_parity(outs["loss"], np.float32([loss.item()]), what="loss vs torch")
    assert_parity(outs["grad"], logits.grad.numpy().astype(np.float32), what="grad vs torch")


def test_non_finite_reward_or_discount_gives_a_nan_row():
    import numpy as np

    from cudarl.reference import c51_chain as ref

    z = np.linspace(-1, 1, 5).astype(np.float32)
    p = np.full((3, 5), 0.2, np.float32)
    m = ref.project(p, np.array([0.1, np.nan, 0.2], np.float32), np.array([0.9, 0.9, np.inf], np.float32), z)
    assert np.all(np.isfinite(m[0])) and abs(m[0].sum() - 1) < 1e-6
    assert np.all(np.isnan(m[1])) and np.all(np.isnan(m[2]))


@pytest.mark.gpu
def test_gpu_non_finite_reward_gives_the_same_nan_rows(cp):
    import numpy as np

    from cudarl.ops import c51_chain as ops
    from cudarl.reference import c51_chain as ref
    from cudarl.testing import assert_parity

    rng = np.random.default_rng(5)
    B, K = 9, 11
    z = np.linspace(-2, 2, K).astype(np.float32)
    p = rng.dirichlet(np.ones(K), B).astype(np.float32)
    r = rng.standard_normal(B).astype(np.float32)
    d = np.full(B, 0.9, np.float32)
    r[3], d[6] = np.nan, np.inf
    out = cp.zeros((B, K), np.float32)
    ops.project(cp.asarray(p), cp.asarray(r), cp.asarray(d), cp.asarray(z), out)
    want = ref.project(p, r, d, z)
    got = out.get()
    bad = np.array([3, 6])
    assert np.all(np.isnan(got[bad])) and np.all(np.isnan(want[bad]))
    ok = np.setdiff1d(np.arange(B), bad)
    assert_parity(got[ok], want[ok])
