"""NumPy twin of ``cuda_src/attention.cu``: causal multi-head self-attention with rotary positions,
forward, hand-written backward, and a key/value-cache step for acting.

Notation: the QKV projection's row is ``qkv = [q (d) | k (d) | v (d)]`` with d = H heads of Dh
channels (Dh even). RoPE (Su et al. 2021) rotates the channel pairs ``(2i, 2i + 1)`` of q and k by
``p theta_i``, ``theta_i = base^(-2i / Dh)``, at position p (the angles are computed in float64 and
rounded once, on both backends). Per head, over the window's positions ``t, s``:

    S[t, s] = (rope(q_t) . rope(k_s)) / sqrt(Dh)        (s <= t; causal)
    lse_t   = log sum_s exp S[t, s],   P = exp(S - lse)
    o_t     = sum_s P[t, s] v_s

Backward (Dao et al. 2022): ``dv_s = sum_t P[t, s] do_t``; ``dP = do v^T``; ``dS = P (dP - rowsum(do o))``;
``d rope(q)_t = sum_s dS[t, s] rope(k)_s / sqrt(Dh)``, ``d rope(k)_s = sum_t dS[t, s] rope(q)_t / sqrt(Dh)``;
dq and dk rotate those back (by ``-p theta_i``).

Every function writes into the buffers it is given and computes in their dtype.
"""

from __future__ import annotations

import numpy as np


def rope_angles(positions, Dh: int, base: float):
    """cos and sin ``[T, Dh / 2]`` (float64) of ``p theta_i`` for the integer ``positions [T]``."""
    i = np.arange(Dh // 2, dtype=np.float64)
    theta = np.power(float(base), -2.0 * i / Dh)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * theta[None, :]
    return np.cos(ang), np.sin(ang)


def rope(x, cos, sin, sign: int = 1):
    """Rotate the pairs of x ``[..., T, Dh]`` by the angles (cos, sin ``[T, Dh / 2]``; ``sign=-1``: back)."""
    c, s = cos.astype(x.dtype), (sign * sin).astype(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def _heads(qkv, B, W, H):
    """q, k, v ``[B, H, W, Dh]`` from ``qkv [B W, 3 d]``."""
    d = qkv.shape[1] // 3
    t = qkv.reshape(B, W, 3, H, d // H).transpose(2, 0, 3, 1, 4)
    return t[0], t[1], t[2]


def _merge(x):
    """``[B, H, W, Dh] -> [B W, H Dh]``."""
    B, H, W, Dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B * W, H * Dh)


def _scores(qkv, B, W, H, base):
    q, k, v = _heads(qkv, B, W, H)
    Dh = q.shape[-1]
    cos, sin = rope_angles(np.arange(W), Dh, base)
    qr, kr = rope(q, cos, sin), rope(k, cos, sin)
    S = np.einsum("bhtd,bhsd->bhts", qr, kr) / np.sqrt(qkv.dtype.type(Dh))
    S = np.where(np.tril(np.ones((W, W), dtype=bool)), S, -np.inf)
    return qr, kr, v, S, cos, sin


def forward(qkv, o, lse, rope_base: float) -> None:
    """Causal attention (module docstring). qkv ``[B W, 3 d]``; o ``[B W, d]`` and lse ``[B, H, W]`` written."""
    B, H, W = lse.shape
    _, _, v, S, _, _ = _scores(qkv, B, W, H, rope_base)
    m = S.max(axis=-1, keepdims=True)
    p = np.exp(S - m)
    l = p.sum(axis=-1, keepdims=True)  # noqa: E741
    lse[...] = (m + np.log(l))[..., 0]
    o[...] = _merge(np.einsum("bhts,bhsd->bhtd", p / l, v))


def backward(do, qkv, o, lse, dqkv, rope_base: float) -> None:
    """Backward of :func:`forward` (module docstring). do, o ``[B W, d]``; dqkv ``[B W, 3 d]`` written."""
    B, H, W = lse.shape
    qr, kr, v, S, cos, sin = _scores(qkv, B, W, H, rope_base)
    Dh = qr.shape[-1]
    P = np.exp(S - lse[..., None])
    dov = do.reshape(B, W, H, Dh).transpose(0, 2, 1, 3)
    ov = o.reshape(B, W, H, Dh).transpose(0, 2, 1, 3)
    dv = np.einsum("bhts,bhtd->bhsd", P, dov)
    dP = np.einsum("bhtd,bhsd->bhts", dov, v)
    dS = P * (dP - (dov * ov).sum(axis=-1, keepdims=True)) / np.sqrt(do.dtype.type(Dh))
    dq = rope(np.einsum("bhts,bhsd->bhtd", dS, kr), cos, sin, -1)
    dk = rope(np.einsum("bhts,bhtd->bhsd", dS, qr), cos, sin, -1)
    d = o.shape[1]
    dqkv[:, :d], dqkv[:, d : 2 * d], dqkv[:, 2 * d :] = _merge(dq), _merge(dk), _merge(dv)


def _last_scores(qkv, B, W, H, base):
    """The last position's query against every key: rope(q_T) ``[B, H, Dh]``, rope(k) and v ``[B, H, W, Dh]``,
    S ``[B, H, W]``, and the angles."""
    q, k, v = _heads(qkv, B, W, H)
    Dh = q.shape[-1]
    cos, sin = rope_angles(np.arange(W), Dh, base)
    qr = rope(q[:, :, -1:], cos[-1:], sin[-1:])[:, :, 0]
    kr = rope(k, cos, sin)
    S = np.einsum("bhd,bhsd->bhs", qr, kr) / np.sqrt(qkv.dtype.type(Dh))
    return qr, kr, v, S, cos, sin


def last_forward(qkv, o, lse, rope_base: float) -> None:
    """:func:`forward`'s last position only (the top block of an encoder whose heads read the last bar): the
    last query attends to the whole window. qkv ``[B W, 3 d]``; o ``[B, d]`` and lse ``[B, H]`` written."""
    B, H = lse.shape
    _, _, v, S, _, _ = _last_scores(qkv, B, qkv.shape[0] // B, H, rope_base)
    m = S.max(axis=-1, keepdims=True)
    p = np.exp(S - m)
    l = p.sum(axis=-1, keepdims=True)  # noqa: E741
    lse[...] = (m + np.log(l))[..., 0]
    o[...] = np.einsum("bhs,bhsd->bhd", p / l, v).reshape(B, -1)


def last_backward(do, qkv, o, lse, dqkv, rope_base: float) -> None:
    """Backward of :func:`last_forward`: :func:`backward` with do zero before the last position. do, o ``[B, d]``;
    lse ``[B, H]``; dqkv ``[B W, 3 d]`` written (dq zero before the last position)."""
    B, H = lse.shape
    W = qkv.shape[0] // B
    qr, kr, v, S, cos, sin = _last_scores(qkv, B, W, H, rope_base)
    Dh = qr.shape[-1]
    P = np.exp(S - lse[..., None])
    dov, ov = do.reshape(B, H, Dh), o.reshape(B, H, Dh)
    dv = P[..., None] * dov[:, :, None]
    dP = np.einsum("bhd,bhsd->bhs", dov, v)
    dS = P * (dP - (dov * ov).sum(axis=-1, keepdims=True)) / np.sqrt(do.dtype.type(Dh))
    dq = np.zeros_like(kr)
    dq[:, :, -1] = rope(np.einsum("bhs,bhsd->bhd", dS, kr)[:, :, None], cos[-1:], sin[-1:], -1)[:, :, 0]
    dk = rope(dS[..., None] * qr[:, :, None], cos, sin, -1)
    d = o.shape[1]
    dqkv[:, :d], dqkv[:, d : 2 * d], dqkv[:, 2 * d :] = _merge(dq), _merge(dk), _merge(dv)


def step(qkv_t, kcache, vcache, pos, o_t, rope_base: float) -> None:
    """One bar of causal attention over a key/value cache (acting).

    For each environment b at its position ``p = pos[b]`` (bars since its reset): the rotated key and
    the value go to slot ``p mod W`` of ``kcache, vcache [B, H, W, Dh]``; the rotated query attends to
    the last ``min(p + 1, W)`` bars, oldest first. ``pos`` int64 ``[B]`` is read, not advanced
    (:func:`advance` does that after the last layer). qkv_t ``[B, 3 d]``; o_t ``[B, d]``.

    While ``p < W`` this is the windowed :func:`forward`'s last row over those bars. Later the cache
    holds keys and values computed from earlier windows (a deeper layer's inputs saw bars before the
    window), so a stack of layers is a sliding-window transformer, not a re-encoded window.
    """
    B, H, W, Dh = kcache.shape
    d = H * Dh
    q = qkv_t[:, :d].reshape(B, H, Dh)
    k = qkv_t[:, d : 2 * d].reshape(B, H, Dh)
    v = qkv_t[:, 2 * d :].reshape(B, H, Dh)
    for b in range(B):
        p = int(pos[b])
        cos, sin = rope_angles([p], Dh, rope_base)
        kcache[b, :, p % W] = rope(k[b][:, None], cos, sin)[:, 0]
        vcache[b, :, p % W] = v[b]
        qr = rope(q[b][:, None], cos, sin)[:, 0]  # [H, Dh]
        slots = [s % W for s in range(max(0, p - W + 1), p + 1)]  # oldest first
        S = np.einsum("hd,hsd->hs", qr, kcache[b][:, slots]) / np.sqrt(qkv_t.dtype.type(Dh))
        e = np.exp(S - S.max(axis=-1, keepdims=True))
        o_t[b] = np.einsum("hs,hsd->hd", e / e.sum(axis=-1, keepdims=True), vcache[b][:, slots]).reshape(d)


def advance(pos) -> None:
    """``pos += 1`` (int64 ``[B]``): every environment moves to its next bar."""
    pos += 1
