"""The homeostatic regulariser on atom utilisation (cuda_src/homeostatic.cu, cudarl/reference/homeostatic.py)."""

import numpy as np
import pytest

from cudarl import signatures, testing
from cudarl.reference import homeostatic as ref
from cudarl.reference import nn as ref_nn
from cudarl.testing import assert_bitwise, assert_parity, finite_difference, poison

F32 = np.float32


def test_uniform_atoms_have_utilisation_one_and_a_single_atom_one_over_k():
    K = 8
    _, st = ref.control(np.full(K, 1 / K), 0.5, 2.0, np.float64)
    np.testing.assert_allclose(st, [2.0 * 0.5**2, 1.0, np.log(K)])
    m = np.zeros(K)
    m[3] = 1.0
    _, st = ref.control(m, 0.5, 1.0, np.float64)
    np.testing.assert_allclose(st[1], 1 / K)


@pytest.mark.parametrize("target", [0.2, 0.9])
def test_gradient_matches_finite_differences(rng, target):
    R, K = 6, 7
    x = rng.normal(size=(R, K)) * 1.5
    p = ref.probs(x, np.float64)
    g, _ = ref.control(ref.mass(p, np.float64), target, 0.8, np.float64)
    got = ref.grad(p, g, np.float64)
    want = finite_difference(lambda t: ref.loss(t, target, 0.8), x)
    np.testing.assert_allclose(got, want, atol=1e-9, rtol=1e-6)


@pytest.mark.parametrize("target,bump", [(0.9, 6.0), (0.3, 0.0)])
def test_steps_against_the_gradient_move_utilisation_toward_the_set_point(rng, target, bump):
    x = rng.normal(size=(32, 11)) * 0.3
    x[:, 2] += bump  # every row on one atom: utilisation far below the set point; no bump: near 1

    def u(x):
        return ref.control(ref.mass(ref.probs(x, np.float64), np.float64), target, 1.0, np.float64)[1][1]

    u0 = u(x)
    for _ in range(60):
        p = ref.probs(x, np.float64)
        g, _ = ref.control(ref.mass(p, np.float64), target, 1.0, np.float64)
        x = x - 300.0 * ref.grad(p, g, np.float64)
    assert abs(u(x) - target) < 0.5 * abs(u0 - target), (u0, u(x))


def _mass_by_hand(p):
    """The documented order, one float32 addition at a time: each block's rows, the slices, then / R."""
    R, K = p.shape
    nb, S = -(-R // ref.ROWS), max(1, ref.THREADS // K)
    m = np.zeros(K, F32)
    for k in range(K):
        part = []
        for i in range(nb):
            acc = F32(0)
            for r in range(ref.ROWS * i, min(ref.ROWS * (i + 1), R)):
                acc = F32(acc + p[r, k])
            part.append(acc)
        total = F32(0)
        for q in range(S):
            acc = F32(0)
            for i in range(q, nb, S):
                acc = F32(acc + part[i])
            total = F32(total + acc)
        m[k] = F32(total / F32(R))
    return m


@pytest.mark.parametrize("R,K", [(1, 5), (13, 51), (96, 51), (40, 2), (9, 300)])
def test_the_mass_is_summed_in_the_documented_order(rng, R, K):
    """The twin's mass (the kernel's order: blocks of ROWS rows, S = max(1, THREADS // K) slices of the
    partials, the slices in order) against the same order written one addition at a time, bit for bit,
    and against the float64 mean within float32 rounding (K = 2: more slices than partials; K = 300: one
    slice)."""
    p = ref.probs(rng.normal(size=(R, K)) * 2)
    m = ref.mass(p)
    assert m.dtype == F32
    assert_bitwise(m, _mass_by_hand(p), "mass")
    assert_parity(m, p.astype(np.float64).mean(0).astype(F32), what="mass against the float64 mean")
    assert ref.partial_sums(p).shape == (ref.partials(R), K)


def test_the_twins_launches_are_the_stages_composed(rng):
    """probs_control and grad_dueling (the kernels' two launches, in place) are probs - mass - control and
    grad - the dueling backward added onto dva, bit for bit; the ticket is left as it was."""
    B, A, K = 6, 3, 11
    logits = (rng.normal(size=(B * A, K)) * 2).astype(F32)
    p, part = np.full((B, A, K), np.nan, F32), np.full((ref.partials(B * A), K), np.nan, F32)
    m, g, st, done = np.full(K, np.nan, F32), np.full(K, np.nan, F32), np.full(3, np.nan, F32), np.zeros(1, np.uint32)
    ref.probs_control(logits, p.reshape(-1, K), part, m, g, st, done, 0.6, 1.3)
    want_p = ref.probs(logits)
    want_g, want_st = ref.control(ref.mass(want_p), 0.6, 1.3)
    for got, want, what in ((p.reshape(-1, K), want_p, "p"), (part, ref.partial_sums(want_p), "part")):
        assert_bitwise(got, want, what)
    for got, want, what in ((m, ref.mass(want_p), "m"), (g, want_g, "g"), (st, want_st, "state")):
        assert_bitwise(got, want, what)
    assert done[0] == 0
    base = rng.normal(size=(B, (1 + A) * K)).astype(F32)
    dva = base.copy()
    ref.grad_dueling(p, g, dva)
    want = base.copy()
    ref_nn.dueling_backward(ref.grad(p.reshape(-1, K), g).reshape(B, A, K), want, accumulate=True)
    assert_bitwise(dva, want, "dva")


def test_grad_dueling_is_the_losss_gradient_on_the_heads_raw_output(rng):
    """Through the dueling combine (logits = V + A_a - mean_a A): the gradient grad_dueling adds equals the
    float64 central differences of the loss in the head's raw output va."""
    B, A, K, target, w = 4, 3, 7, 0.8, 1.7
    va = rng.normal(size=(B, (1 + A) * K)) * 1.5

    def logits(v):
        v = v.reshape(B, 1 + A, K)
        return (v[:, :1] + v[:, 1:] - v[:, 1:].mean(1, keepdims=True)).reshape(B * A, K)

    p = ref.probs(logits(va), np.float64)
    g, _ = ref.control(ref.mass(p, np.float64), target, w, np.float64)
    dva = np.zeros_like(va)
    ref.grad_dueling(p.reshape(B, A, K), g, dva)
    want = finite_difference(lambda v: ref.loss(logits(v), target, w), va)
    np.testing.assert_allclose(dva, want, atol=1e-9, rtol=1e-6)


def test_the_launchers_pass_what_the_kernels_declare(monkeypatch):
    """Each launcher's arguments as the kernel declares them, its grid (probs_control: a block of
    HS_ROWS rows; grad_dueling: a warp a sample), and the twin's order constants equal to the kernel's."""
    from cudarl.ops import homeostatic as ops

    assert ref.ROWS == signatures.define("homeostatic", "HS_ROWS")
    assert ref.THREADS == signatures.define("homeostatic", "HS_THREADS")
    assert ops.MAX_ACTIONS == signatures.define("homeostatic", "HS_MAXA")
    calls = []
    monkeypatch.setattr(ops, "launch", lambda fam, op, grid, block, args, **kw: calls.append((op, grid, block, args)))
    B, A, K = 37, 3, 51
    R, nb = B * A, ref.partials(B * A)
    z = np.zeros
    ops.probs_control(z((R, K), F32), z((R, K), F32), z((nb, K), F32), z(K, F32), z(K, F32), z(3, F32),
                      z(1, np.uint32), 0.5, 1.0)  # fmt: skip
    ops.grad_dueling(z((B, A, K), F32), z(K, F32), z((B, (1 + A) * K), F32))
    (pc, gd) = calls
    assert pc[:3] == ("probs_control", 14, 256) and nb == 14
    assert gd[:3] == ("grad_dueling", 5, 256)
    for op, _, _, args in calls:
        testing.assert_launch_args("homeostatic", op, args)
    with pytest.raises(ValueError, match="part has shape"):
        ops.probs_control(z((R, K), F32), z((R, K), F32), z((nb - 1, K), F32), z(K, F32), z(K, F32), z(3, F32),
                          z(1, np.uint32), 0.5, 1.0)  # fmt: skip
    with pytest.raises(ValueError, match="1 to 32 actions"):
        ops.grad_dueling(z((2, 33, K), F32), z(K, F32), z((2, 34 * K), F32))


# ---- GPU ------------------------------------------------------------------------------------
def _control_bufs(cp, R, K):
    out = [cp.empty((R, K), np.float32), cp.empty((ref.partials(R), K), np.float32), cp.empty(K, np.float32)]
    out += [cp.empty(K, np.float32), cp.empty(3, np.float32)]
    for a in out:
        poison(a)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("R,K", [(1, 11), (7, 51), (1536, 51), (300, 101), (33, 257), (1000, 2), (2, 1024)])
def test_gpu_probs_control_matches_reference(cp, rng, R, K):
    """The softmax within float32 tolerance; the blocks' sums and the masses bit for bit the twin's order on
    the kernel's own p (and the float64 mean within tolerance); the control within the old tolerance of
    the twin's float64 control. Launched twice: the ticket is left at 0, so a second launch is a first."""
    from cudarl.ops import homeostatic as ops

    x = (rng.normal(size=(R, K)) * 2).astype(np.float32)
    out = _control_bufs(cp, R, K)
    done = cp.zeros(1, np.uint32)
    for _ in range(2):
        ops.probs_control(cp.asarray(x), *out, done, 0.7, 1.3)
        p, part, m, g, st = (a.get() for a in out)
        assert int(done[0]) == 0
        assert_parity(p, ref.probs(x), what="p")
        assert_bitwise(part, ref.partial_sums(p), "the blocks' column sums")
        assert_bitwise(m, ref.mass(p), "mass (the twin's order, on the kernel's p)")
        assert_parity(m, ref.probs(x, np.float64).mean(0).astype(np.float32), what="mass against the float64 mean")
        want_g, want_st = ref.control(ref.mass(ref.probs(x)), 0.7, 1.3)
        assert_parity(g, want_g, rtol=1e-4, what="g")
        assert_parity(st, want_st, rtol=1e-4, what="state")
        for a in out:
            poison(a)


@pytest.mark.gpu
@pytest.mark.parametrize("B,A,K", [(1, 1, 11), (7, 3, 51), (512, 3, 51), (100, 3, 101), (11, 3, 257), (5, 32, 7)])
def test_gpu_grad_dueling_matches_reference(cp, rng, B, A, K):
    """The gradient through the dueling combine, added onto a random dva, against the twin on the same
    p and g (the kernel's sums s_a run in a warp's order, the twin's in NumPy's: float32 tolerance)."""
    from cudarl.ops import homeostatic as ops

    p = ref.probs(rng.normal(size=(B * A, K)) * 2).reshape(B, A, K)
    g, _ = ref.control(ref.mass(p.reshape(-1, K)), 0.3, 2.0)
    base = rng.normal(size=(B, (1 + A) * K)).astype(np.float32)
    dva = cp.asarray(base)
    ops.grad_dueling(cp.asarray(p), cp.asarray(g), dva)
    want = base.copy()
    ref.grad_dueling(p, g, want)
    assert_parity(dva, want, what="dva")
    assert_parity(dva.get() - base, want - base, rtol=1e-4, what="the gradient added")


@pytest.mark.gpu
def test_gpu_graphed_equals_eager_bitwise(cp, rng):
    """Both launches captured in one graph and replayed three times: every output bit for bit the eager
    run's, dva restored before each run; the ticket back at 0 after each."""
    from cudarl.graph import StepGraph
    from cudarl.ops import homeostatic as ops
    from cudarl.testing import assert_reruns_bitwise

    B, A, K = 512, 3, 51
    x = cp.asarray((rng.normal(size=(B * A, K)) * 2).astype(np.float32))
    p, part, m, g, st = _control_bufs(cp, B * A, K)
    base = cp.asarray(rng.normal(size=(B, (1 + A) * K)).astype(np.float32))
    dva, done = base.copy(), cp.zeros(1, np.uint32)

    def phase():
        ops.probs_control(x, p, part, m, g, st, done, 0.6, 1.0)
        ops.grad_dueling(p.reshape(B, A, K), g, dva)

    outs = {"p": p, "part": part, "m": m, "g": g, "state": st, "dva": dva}
    graph = StepGraph("homeostatic_parity", [("h", phase)], xp=cp)
    graph.run_eager()
    graph.synchronize()
    first = {k: v.get() for k, v in outs.items()}

    def restore():
        dva[...] = base

    def ticket_at_zero(attempt):
        assert int(done[0]) == 0, attempt

    assert_reruns_bitwise(graph, outs, first, ("eager",), reset=restore, check=ticket_at_zero)
    graph.capture()
    assert_reruns_bitwise(graph, outs, first, ("graphed",) * 3, reset=restore, check=ticket_at_zero)
