"""NumPy twin of ``cuda_src/nn.cu``: layer and head kernels, forward and backward.

Every function writes into the buffers it is given (like the launchers in
``cudarl/ops/nn.py``) and works in the dtype of those buffers, so the same code is the
float32 CPU backend and, with float64 buffers, the finite-difference oracle.

Activations are coded as integers shared with the kernels: ``0`` identity, ``1`` ReLU,
``2`` sigmoid. Derivatives are taken from the activation's *output* ``y``:
``relu'(y) = [y > 0]``, ``sigmoid'(y) = y (1 - y)``.

The functions marked :func:`members` also take their arrays with a leading axis of ``P`` members
(a population's agents) and run the single function on each member's entries in turn: member ``i``
is the single call's result by construction, as the kernels' ``blockIdx.y`` makes it on the GPU.
"""

from __future__ import annotations

import functools

import numpy as np

from . import philox

IDENTITY, RELU, SIGMOID = 0, 1, 2
ACTS = {"identity": IDENTITY, "relu": RELU, "sigmoid": SIGMOID}


def members(*ndims: int):
    """Give a twin the member axis: ``ndims`` are the ranks of its leading array arguments without it.
    When the first has one more axis, the twin runs once per member ``i`` on ``a[i]`` of each of them
    (the other arguments as given); otherwise it is the single call."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kw):
            arrays, rest = args[: len(ndims)], args[len(ndims) :]
            if arrays[0].ndim == ndims[0]:
                return fn(*args, **kw)
            P = arrays[0].shape[0]
            if any(a.ndim != nd + 1 or a.shape[0] != P for a, nd in zip(arrays, ndims, strict=True)):
                raise ValueError(f"{fn.__name__}: every array has the member axis or none does")
            for i in range(P):
                fn(*(a[i] for a in arrays), *rest, **kw)

        return run

    return wrap


def _act(z: np.ndarray, act: int) -> np.ndarray:
    if act == IDENTITY:
        return z
    if act == RELU:
        return np.maximum(z, z.dtype.type(0))
    if act == SIGMOID:
        one = z.dtype.type(1)
        return one / (one + np.exp(-z))
    raise ValueError(f"unknown activation code {act}")


def _act_grad(dout: np.ndarray, y: np.ndarray, act: int) -> np.ndarray:
    if act == IDENTITY:
        return dout.copy()
    if act == RELU:
        return np.where(y > 0, dout, dout.dtype.type(0))
    if act == SIGMOID:
        return dout * (y * (y.dtype.type(1) - y))
    raise ValueError(f"unknown activation code {act}")


def bias_act_forward(y: np.ndarray, bias: np.ndarray, out: np.ndarray, act: int) -> None:
    """``out = act(y + bias)``. y, out ``[B, N]``; bias ``[N]``. ``out`` may alias ``y``."""
    out[...] = _act(y + bias, act)


@members(2, 2, 2, 1)
def bias_act_backward(dout: np.ndarray, out: np.ndarray, dz: np.ndarray, dbias: np.ndarray, act: int) -> None:
    """``dz = dout * act'(out)``, ``dbias = sum_b dz[b]``.

    dout, out, dz ``[B, N]`` (``dz`` may alias ``dout``); dbias ``[N]`` (overwritten).
    """
    g = _act_grad(dout, out, act)
    dz[...] = g
    dbias[...] = g.sum(axis=0)


@members(2, 2, 2)
def act_backward(dout: np.ndarray, out: np.ndarray, dz: np.ndarray, act: int) -> None:
    """``dz = dout * act'(out)`` (:func:`bias_act_backward` without ``dbias``); ``dz`` may alias ``dout``."""
    dz[...] = _act_grad(dout, out, act)


def layernorm_forward(x, gamma, beta, out, mean, rstd, eps: float, act: int) -> None:
    """Row LayerNorm then activation (Ba et al. 2016).

    ``mu = mean_j x``, ``var = mean_j (x - mu)^2``, ``rstd = 1/sqrt(var + eps)``,
    ``out = act(gamma * (x - mu) * rstd + beta)``.
    x, out ``[B, N]``; gamma, beta ``[N]``; mean, rstd ``[B]`` (written, kept for backward).
    """
    mu = x.mean(axis=1)
    d = x - mu[:, None]
    var = (d * d).mean(axis=1)
    r = x.dtype.type(1) / np.sqrt(var + x.dtype.type(eps))
    mean[...] = mu
    rstd[...] = r
    out[...] = _act(d * r[:, None] * gamma + beta, act)


def layernorm_backward(dout, out, x, gamma, mean, rstd, dx, dgamma, dbeta, act: int) -> None:
    """Backward of :func:`layernorm_forward` (both parts below).

    With ``dy = dout * act'(out)`` and ``xhat = (x - mu) rstd``:
    ``dgamma = sum_b dy xhat``, ``dbeta = sum_b dy``,
    ``dx = rstd (g - mean_j g - xhat mean_j(g xhat))`` where ``g = dy gamma``.
    dx ``[B, N]`` (overwritten); dgamma, dbeta ``[N]`` (overwritten).
    """
    layernorm_backward_params(dout, out, x, mean, rstd, dgamma, dbeta, act)
    layernorm_backward_input(dout, out, x, gamma, mean, rstd, dx, act)


def layernorm_backward_input(dout, out, x, gamma, mean, rstd, dx, act: int) -> None:
    """``dx = rstd (g - mean_j g - xhat mean_j(g xhat))``, ``g = dout act'(out) gamma``. dx ``[B, N]``."""
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = _act_grad(dout, out, act) * gamma
    dx[...] = rstd[:, None] * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))


def layernorm_backward_params(dout, out, x, mean, rstd, dgamma, dbeta, act: int) -> None:
    """``dgamma = sum_b dy xhat``, ``dbeta = sum_b dy`` with ``dy = dout act'(out)``. dgamma, dbeta ``[N]``."""
    dy = _act_grad(dout, out, act)
    xhat = (x - mean[:, None]) * rstd[:, None]
    dgamma[...] = (dy * xhat).sum(axis=0)
    dbeta[...] = dy.sum(axis=0)


@members(2, 3)
def dueling_forward(va: np.ndarray, logits: np.ndarray) -> None:
    """Dueling combine per atom (Wang et al. 2016, applied to C51 logits).

    ``va [B, (1 + A) * Z]`` holds the value stream ``V [B, Z]`` then the advantage stream
    ``Adv [B, A, Z]``; ``logits[b, a, z] = (V[b, z] + Adv[b, a, z]) - (sum_a' Adv[b, a', z]) / A``.
    logits ``[B, A, Z]`` (written).
    """
    B, A, Z = logits.shape
    v = va[:, :Z]
    adv = va[:, Z:].reshape(B, A, Z)
    s = adv[:, 0, :].copy()
    for a in range(1, A):  # the kernel's order
        s = s + adv[:, a, :]
    logits[...] = (v[:, None, :] + adv) - (s / va.dtype.type(A))[:, None, :]


@members(3, 2)
def dueling_backward(dlogits: np.ndarray, dva: np.ndarray, accumulate: bool = False) -> None:
    """``dV[b, z] = sum_a dL[b, a, z]``; ``dAdv[b, a, z] = dL[b, a, z] - dV[b, z] / A``. dva ``[B, (1+A) Z]``
    (written, or with ``accumulate`` added into)."""
    B, A, Z = dlogits.shape
    s = dlogits[:, 0, :].copy()
    for a in range(1, A):
        s = s + dlogits[:, a, :]
    adv = (dlogits - (s / dva.dtype.type(A))[:, None, :]).reshape(B, A * Z)
    if accumulate:
        dva[:, :Z] += s
        dva[:, Z:] += adv
    else:
        dva[:, :Z] = s
        dva[:, Z:] = adv


def iqn_sample_tau(tau: np.ndarray, counter: np.ndarray, seed: int, stream_id: int) -> None:
    """Quantile fractions ``tau[b, n] = uniform(seed, counter[0], stream_id)[b * N + n]`` in [0, 1).

    tau ``[B, N]`` float32 (written); counter ``[1]`` uint64 (read, a step counter).
    """
    tau[...] = philox.uniform(seed, int(counter[0]), stream_id, tau.size).reshape(tau.shape).astype(tau.dtype)


def iqn_cos_embed(tau: np.ndarray, cos: np.ndarray) -> None:
    """Cosine embedding of IQN (Dabney et al. 2018): ``cos[b*N + n, i] = cos(pi * i * tau[b, n])``, i = 0..C-1.

    Computed in float64 and rounded once, as the kernel does. tau ``[B, N]``; cos ``[B*N, C]``.
    """
    C = cos.shape[1]
    ang = np.pi * np.arange(C, dtype=np.float64)[None, :] * tau.reshape(-1, 1).astype(np.float64)
    cos[...] = np.cos(ang).astype(cos.dtype)


def iqn_mix_forward(psi: np.ndarray, phi: np.ndarray, h: np.ndarray) -> None:
    """Multiplicative interaction ``h[b*N + n, d] = psi[b, d] * phi[b*N + n, d]``.

    psi ``[B, D]``; phi, h ``[B*N, D]``.
    """
    B, D = psi.shape
    N = phi.shape[0] // B
    h[...] = (phi.reshape(B, N, D) * psi[:, None, :]).reshape(B * N, D)


def iqn_mix_backward(dh: np.ndarray, psi: np.ndarray, phi: np.ndarray, dpsi: np.ndarray, dphi: np.ndarray) -> None:
    """``dphi = dh * psi[b]``; ``dpsi[b, d] = sum_n dh[b, n, d] phi[b, n, d]`` (n ascending).

    dpsi ``[B, D]`` and dphi ``[B*N, D]`` are overwritten.
    """
    B, D = psi.shape
    N = phi.shape[0] // B
    dh3, phi3 = dh.reshape(B, N, D), phi.reshape(B, N, D)
    acc = dh3[:, 0, :] * phi3[:, 0, :]
    for n in range(1, N):
        acc = acc + dh3[:, n, :] * phi3[:, n, :]
    dphi[...] = (dh3 * psi[:, None, :]).reshape(B * N, D)
    dpsi[...] = acc


def plan_gate(plan: np.ndarray, scale: np.ndarray, threshold: float = 0.5) -> None:
    """Readiness gate of the plan head.

    ``plan [B, 2]`` holds (conviction, readiness), both in [0, 1]. ``scale[b] = conviction[b]`` if
    ``readiness[b] >= threshold`` else exactly ``1``: conviction may scale a reward or a position
    only once the plan head is ready (the seed scaled every reward by ~0.1 at init).
    """
    scale[...] = np.where(plan[:, 1] >= plan.dtype.type(threshold), plan[:, 0], scale.dtype.type(1))


def plan_loss(
    plan: np.ndarray,
    q: np.ndarray,
    actions: np.ndarray,
    ret: np.ndarray,
    levels: np.ndarray,
    dplan: np.ndarray,
    stats: np.ndarray,
    hurdle: float,
    threshold: float = 0.5,
) -> None:
    """The plan head's loss: readiness trained by a loss that targets it, conviction by its own.

    Rows that teach it: the data action is the greedy one (the first maximum of ``q [B, A]``) and not
    flat (``levels [A]``, the env's positions): ``m_b``, ``n = sum m``. With the batch's n-step returns
    ``R = ret [B]``, ``Rbar = sum m |R| / n``, ``w+ = max(R, 0) / Rbar``, ``w- = max(-R, 0) / Rbar``::

        L = (1/n) sum_b m_b [-w+ log c - w- log(1 - c) - w+ log r - (w- + h) log(1 - r)]

    (``c``, ``r`` = ``plan[:, 0]``, ``plan[:, 1]``, clamped to [1e-6, 1 - 1e-6] in the gradient). Its
    minimisers, per state: conviction ``c = E[R+] / E[|R|]`` (the return-weighted share of wins) and
    readiness ``r = E[R+] / (E[|R|] + h Rbar)``, which is >= 1/2 exactly when ``E[R | s] >= h Rbar``: the
    gate opens where the greedy trade's expected return clears the hurdle ``h`` (in units of the batch's
    mean |R|), and on a market without an edge it stays below 1/2 (``1 / (2 (1 + h))``).

    Writes ``dplan [B, 2] = dL/dplan`` (zero where ``m_b = 0``, and everywhere when ``n = 0``) and
    ``stats [2]`` = (share of rows with readiness >= threshold, mean of the gate's scale :func:`plan_gate`).
    """
    B, A = q.shape
    dt = plan.dtype.type
    m = (np.asarray(actions) == np.argmax(q, axis=1)) & (np.asarray(levels)[np.argmax(q, axis=1)] != 0)
    n = dt(m.sum())
    abs_r = dt(np.abs(ret[m]).sum(dtype=np.float64))
    learn = n > 0 and abs_r > 0
    rbar = abs_r / n if learn else dt(1)
    wp, wn = np.maximum(ret, dt(0)) / rbar, np.maximum(-ret, dt(0)) / rbar
    lo, hi = dt(1e-6), dt(1) - dt(1e-6)
    c, r = np.clip(plan[:, 0], lo, hi), np.clip(plan[:, 1], lo, hi)
    dc = (-wp / c + wn / (dt(1) - c)) / n if learn else np.zeros(B, dt)
    dr = (-wp / r + (wn + dt(hurdle)) / (dt(1) - r)) / n if learn else np.zeros(B, dt)
    dplan[:, 0] = np.where(m, dc, dt(0))
    dplan[:, 1] = np.where(m, dr, dt(0))
    scale = np.empty(B, dt)
    plan_gate(plan, scale, threshold)
    open_ = plan[:, 1] >= dt(threshold)
    stats[0] = dt(open_.sum()) / dt(B)
    stats[1] = dt(scale.sum(dtype=np.float64)) / dt(B)
