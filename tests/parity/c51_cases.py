"""Inputs shared by the C51 parity tests (test_c51_chain.py, test_c51.py)."""

import numpy as np

from cudarl.reference import c51_chain as ref
from cudarl.testing import poison


def rand_probs(rng, B, K):
    x = rng.normal(size=(B, K)) * 2
    return ref.softmax(x).astype(np.float32)


def targets_inputs(rng, B, A, K):
    z = np.linspace(-10, 10, K, dtype=np.float32)
    online = (rng.normal(size=(B, A, K)) * 1.5).astype(np.float32)
    target = (rng.normal(size=(B, A, K)) * 1.5).astype(np.float32)
    r = rng.uniform(-12, 12, B).astype(np.float32)
    d = rng.choice(np.float32([0.0, 0.9, 0.99, 1.0]), B)
    return z, online, target, r, d


def popart_state(rng, scale=10 / 3):
    """A state whose statistics have moved (mu ~ 2, sigma ~ 3, decay < 1): nothing is an identity."""
    from cudarl.reference import popart as pref

    return pref.update(rng.normal(2.0, 3.0, 64).astype(np.float32), pref.init_state(scale), beta=0.1)


def former_chain(online, target, z, r, d, state=None, beta=None, sigma_min=1e-4):
    """The targets phase as the agent ran it before the fusion, on NumPy: next_probs, the
    [B, K] x [K, 1] GEMM (cudarl.blas on NumPy), td_targets, update, normalize_rewards, project."""
    from cudarl.blas import gemm
    from cudarl.reference import popart as pref

    probs, a_star = ref.next_probs(online, target, z)
    if state is None:
        return ref.project(probs, r, d, z), probs, a_star, None, None, None
    v_hat = np.zeros((probs.shape[0], 1), np.float32)
    gemm(probs, z.reshape(-1, 1), v_hat)
    y = pref.td_targets(r, d, v_hat.reshape(-1), state)
    new_state = pref.update(y, state, np.float32(beta), sigma_min)
    r_norm = pref.normalize_rewards(r, d, new_state)
    return ref.project(probs, r_norm, d, z), probs, a_star, y, r_norm, new_state


def gpu_inputs(rng, B, A, K):
    z = np.linspace(-10, 10, K, dtype=np.float32)
    dz = float(z[1] - z[0])
    online = (rng.normal(size=(B, A, K)) * 1.5).astype(np.float32)
    target = (rng.normal(size=(B, A, K)) * 1.5).astype(np.float32)
    r = rng.uniform(-12, 12, B).astype(np.float32)
    r[::4] = (rng.integers(-3, 4, B)[::4] * dz).astype(np.float32)  # on the grid with d in {0, 1}
    r[r == 0] = dz  # no exact zero: with B = 1 and d = 0 a zero reward made every TD target 0 (an all-zero oracle)
    d = rng.choice(np.float32([0.0, 0.9, 0.99, 1.0]), B)
    a = rng.integers(0, A, B).astype(np.int32)
    w = rng.uniform(0.1, 1.0, B).astype(np.float32)
    return z, online, target, r, d, a, w


def empty(cp, shape, dtype=np.float32):
    x = cp.empty(shape, dtype)
    poison(x)
    return x
