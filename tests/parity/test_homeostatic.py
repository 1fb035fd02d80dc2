"""The homeostatic regulariser on atom utilisation (cuda_src/homeostatic.cu, cudarl/reference/homeostatic.py)."""

import numpy as np
import pytest

from cudarl.reference import homeostatic as ref
from cudarl.testing import assert_bitwise, assert_parity, finite_difference, poison


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


# ---- GPU ------------------------------------------------------------------------------------
def _run(cp, ops, x, target, weight, out):
    p, m, g, st, grad = out
    ops.probs(x, p)
    ops.mass(p, m)
    ops.control(m, g, st, target, weight)
    ops.grad(p, g, grad)


def _bufs(cp, R, K):
    out = [cp.empty((R, K), np.float32), cp.empty(K, np.float32), cp.empty(K, np.float32)]
    out += [cp.empty(3, np.float32), cp.empty((R, K), np.float32)]
    for a in out:
        poison(a)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("R,K", [(1, 11), (7, 51), (1536, 51), (300, 101), (33, 257)])
def test_gpu_matches_reference(cp, rng, R, K):
    from cudarl.ops import homeostatic as ops

    x = (rng.normal(size=(R, K)) * 2).astype(np.float32)
    out = _bufs(cp, R, K)
    _run(cp, ops, cp.asarray(x), 0.7, 1.3, out)
    p = ref.probs(x)
    m = ref.mass(p)
    g, st = ref.control(m, 0.7, 1.3)
    assert_parity(out[0], p, what="p")
    assert_parity(out[1], m, what="mass")
    assert_parity(out[2], g, rtol=1e-4, what="g")
    assert_parity(out[3], st, rtol=1e-4, what="state")
    assert_parity(out[4], ref.grad(p, g), rtol=1e-4, what="grad")
    base = cp.asarray(rng.normal(size=(R, K)).astype(np.float32))
    acc = base.copy()
    ops.grad(out[0], out[2], acc, accumulate=True)
    assert_parity(acc, base.get() + ref.grad(out[0].get(), out[2].get()), what="grad accumulated")


@pytest.mark.gpu
def test_gpu_graphed_equals_eager_bitwise(cp, rng):
    from cudarl.graph import StepGraph
    from cudarl.ops import homeostatic as ops

    x = cp.asarray((rng.normal(size=(1536, 51)) * 2).astype(np.float32))
    out = _bufs(cp, 1536, 51)
    g = StepGraph("homeostatic_parity", [("h", lambda: _run(cp, ops, x, 0.6, 1.0, out))], xp=cp)
    g.run_eager()
    g.synchronize()
    want = [a.get() for a in out]
    g.capture()
    for a in out:
        poison(a)
    cp.cuda.Device().synchronize()
    g.replay()
    g.synchronize()
    for a, w in zip(out, want, strict=True):
        assert_bitwise(a, w)
