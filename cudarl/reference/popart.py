"""PopArt in NumPy, the twin of ``cuda_src/popart.cu``.

van Hasselt, Guez, Hessel, Mnih & Silver (2016), "Learning values across many orders of
magnitude". Statistics of the return-space TD targets ``y`` (step size ``beta``, bias-corrected
like Adam so the first batch already counts)::

    m1 <- (1 - beta) m1 + beta mean(y),  m2 <- (1 - beta) m2 + beta mean(y^2),  decay <- decay (1 - beta)
    mu = m1 / (1 - decay),  sigma = sqrt(max(m2 / (1 - decay) - mu^2, sigma_min^2))

Fitting the support: values live in the normalised coordinate ``y_hat = (y - mu) / s`` with
``s = sigma / scale``, where ``scale`` is support units per standard deviation (for C51 with
support ``[-v, v]`` choose ``scale = v / n_sigma``: ``n_sigma`` standard deviations of return
reach the edge atom). Preserving outputs: after each update a value-producing last layer
``y_hat = h W + b`` (``W [n_in, n_out]``, as :class:`cudarl.nn.Linear` stores it) is rescaled so
``s y_hat + mu`` is unchanged (left as it is when the statistics did not move)::

    W <- W s_prev / s,  b <- (s_prev b + mu_prev - mu) / s

The first update starts from the initial identity (``decay = 1``: no statistics yet) and sets
``mu_prev, sigma_prev`` to its own result: there is nothing to preserve, and a fresh network's
random outputs are read as normalised values (preserving them as returns would multiply them by
``sigma_0 / sigma_1``, about 70 for bar returns of 1.5%).

``state`` is float32 ``[8]``: ``mu, sigma, mu_prev, sigma_prev, m1, m2, decay, scale``.

The functions marked :func:`members` also take a leading axis of ``P`` members (a population's agents,
each with its own statistics): ``state [P, 8]``, ``beta [P]``, the arrays ``[P, ...]``; each result gains
the axis. Member ``i`` is the single call on member ``i``'s arguments, as the kernels' ``blockIdx.y``
makes it.
"""

from __future__ import annotations

import numpy as np

from ._members import members

MU, SIGMA, MU_PREV, SIGMA_PREV, M1, M2, DECAY, SCALE = range(8)
STATE_SIZE = 8


def init_state(scale: float = 1.0) -> np.ndarray:
    """Identity statistics (``mu = 0``, ``sigma = 1``): float32 ``[8]``."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    s = np.zeros(STATE_SIZE, np.float32)
    s[SIGMA] = s[SIGMA_PREV] = 1
    s[DECAY] = 1
    s[SCALE] = scale
    return s


def _s(state, prev=False):
    return state[SIGMA_PREV if prev else SIGMA] / state[SCALE]


@members(y=1, state=1, beta=0)
def update(y, state, beta, sigma_min=1e-4, compute_dtype=np.float32):
    """New state after one batch of return-space targets ``y [B]`` (``state`` is not modified)."""
    y = np.asarray(y, compute_dtype)
    st = np.array(state, compute_dtype, copy=True)
    bt = compute_dtype(beta)
    one = compute_dtype(1)
    mean = compute_dtype(y.sum(dtype=np.float64) / y.size)
    mean2 = compute_dtype((y.astype(np.float64) ** 2).sum() / y.size)
    first = st[DECAY] == one
    st[MU_PREV], st[SIGMA_PREV] = st[MU], st[SIGMA]
    st[M1] = (one - bt) * st[M1] + bt * mean
    st[M2] = (one - bt) * st[M2] + bt * mean2
    st[DECAY] = st[DECAY] * (one - bt)
    c = one - st[DECAY]
    st[MU] = st[M1] / c
    st[SIGMA] = np.sqrt(max(st[M2] / c - st[MU] * st[MU], compute_dtype(sigma_min) ** 2))
    if first:
        st[MU_PREV], st[SIGMA_PREV] = st[MU], st[SIGMA]
    return st


@members(y=1, r_t=1, discount_t=1, state=1, beta=0)
def update_normalize_rewards(y, r_t, discount_t, state, beta, sigma_min=1e-4):
    """:func:`update` with ``y``, then :func:`normalize_rewards` with the updated statistics (one
    kernel on the GPU): returns ``(state' [8], r_norm [B])``; ``state`` is not modified."""
    new_state = update(y, state, beta, sigma_min)
    return new_state, normalize_rewards(r_t, discount_t, new_state)


@members(W=2, b=1, state=1)
def rescale(W, b, state, compute_dtype=np.float32):
    """Last layer ``W [n_in, n_out]``, ``b [n_out]`` after an update: returns new ``(W, b)`` (copies of
    the inputs when the statistics did not move)."""
    W = np.array(W, compute_dtype)
    b = np.array(b, compute_dtype)
    state = np.asarray(state, compute_dtype)
    s, s_prev = _s(state), _s(state, prev=True)
    if s == s_prev and state[MU] == state[MU_PREV]:
        return W, b
    return W * (s_prev / s), (s_prev * b + state[MU_PREV] - state[MU]) / s


@members(state=1, x=None)
def normalize(x, state, inverse=False, compute_dtype=np.float32):
    """``(x - mu) / s``, or ``s x + mu`` with ``inverse=True``: ``x``'s shape."""
    x = np.asarray(x, compute_dtype)
    state = np.asarray(state, compute_dtype)
    s = _s(state)
    return (s * x + state[MU]) if inverse else (x - state[MU]) / s


@members(r_t=1, discount_t=1, state=1)
def normalize_rewards(r_t, discount_t, state):
    """Rewards of a target in normalised coordinates: ``(r - (1 - d) mu) / s`` (discount unchanged).

    ``(r + d (s z + mu) - mu) / s = (r - (1 - d) mu) / s + d z``, so the C51 projection and the
    quantile targets run unchanged on these rewards.
    """
    r = np.asarray(r_t, np.float32)
    d = np.asarray(discount_t, np.float32)
    return (r - (np.float32(1) - d) * state[MU]) / _s(state)


@members(r_t=1, discount_t=1, v_hat=1, state=1)
def td_targets(r_t, discount_t, v_hat, state):
    """Return-space TD targets ``y = r + d (s v_hat + mu)`` from normalised next values ``v_hat [B]``."""
    r = np.asarray(r_t, np.float32)
    d = np.asarray(discount_t, np.float32)
    v = np.asarray(v_hat, np.float32)
    return r + d * (_s(state) * v + state[MU])
