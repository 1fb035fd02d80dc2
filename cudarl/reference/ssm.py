"""NumPy twin of ``cuda_src/ssm.cu``: the selective state-space layer of Mamba2 (SSD, Dao & Gu 2024),
forward, hand-written backward, and the one-step recurrent form for acting.

Notation (per sample, per head h of H; time t of a window of W bars):

* The in-projection's output row is ``zx = [z (E) | x (E) | B (G N) | C (G N) | dt_raw (H)]``:
  E = expand * d_model channels split into H heads of P = E / H, G groups of N state dimensions
  (head h reads group ``h // (H / G)``).
* A short causal depthwise convolution of kernel K over ``[x | B | C]`` (the ``C_c = E + 2 G N``
  channels), then SiLU: ``xbc[t] = silu(b + sum_k w[k] in[t - (K - 1) + k])`` (zero before t = 0).
  Its parameter is one tensor ``conv [K + 1, C_c]``: K weight rows, then the bias row.
* ``dt = softplus(dt_raw + dt_bias)`` (softplus(v) = v above 20, as PyTorch), ``A = -exp(A_log)``,
  ``a_t = dt_t A`` per head. The per-head parameters are one tensor ``head [3, H]`` =
  ``(A_log, D, dt_bias)``.
* The scan: ``S_t = exp(a_t) S_{t-1} + dt_t x_t B_t^T`` (``S [P, N]``, ``S_{-1} = 0``),
  ``y_t = S_t C_t + D x_t``.

The training forward evaluates the scan chunk by chunk (chunk length Q): inside a chunk, with
``cum_t = sum_{r <= t} a_r`` (within the chunk) and ``u_s = dt_s x_s``,
``y_t = sum_{s <= t} (C_t . B_s) exp(cum_t - cum_s) u_s + exp(cum_t) S_in C_t + D x_t`` and
``S_out = exp(cum_end) S_in + sum_s exp(cum_end - cum_s) u_s B_s^T``: the same numbers as the
recurrence up to rounding (tests/parity/test_ssm.py). ``states [B, H, n_chunks - 1, P, N]`` keeps
``S_out`` of every chunk but the last for the backward (its ``S_in``); the state after the window is not
computed (nothing in training reads it; acting keeps its own by the recurrence), which saves the last chunk's
``[P, N]`` product and its store: all of it when one chunk covers the window.

Every function writes into the buffers it is given and computes in their dtype (float64 buffers
are the finite-difference oracle). Parameter gradients are per-sample partials reduced by
``seq.colsum`` (DESIGN.md rule 3); the per-head gradients of the shared B and C are summed over a
group's heads by :func:`bc_reduce`.
"""

from __future__ import annotations

import numpy as np

from .seq import _chunk_sums, _contract

#: softplus(v) = v above this (PyTorch's threshold), log(1 + exp(v)) below.
SOFTPLUS_THRESHOLD = 20.0

# The kernels' limits, here so that the configuration can check them without the launchers.
CONV_MAX_K = 8  # ssm.cu CONV_MAX_K: the longest causal convolution
SCAN_THREADS = 256  # ssm.cu SCAN_THREADS: threads of a scan block
#: Shared memory one block may have on the GPUs cudarl targets (H100/H200: 227 KiB).
MAX_SHARED = 227 * 1024


def tc_pad(n: int) -> int:
    """ssm.cu tc_pad: a shared row of n floats in the _tc scans, padded to n' >= n with n' = 4 (mod 8)."""
    return n + (12 - n % 8) % 8


def forward_shared(Q: int, P: int, N: int, tf32: bool = False) -> int:
    """Floats of shared memory an ssd_forward block uses (ssm.cu's banner): its B, C and S rows are N + 4 floats
    where N and Q P are multiples of 4 (rows on 16 bytes), else N + 1. ``tf32`` (ssd_forward_tc): its x, B, C, S
    and M rows padded by :func:`tc_pad`."""
    if tf32:
        return Q * tc_pad(P) + 2 * Q * tc_pad(N) + P * tc_pad(N) + Q * tc_pad(Q) + 3 * Q
    n1 = N + 4 if N % 4 == 0 and (Q * P) % 4 == 0 else N + 1
    return Q * P + 2 * Q * n1 + P * n1 + Q * (Q + 1) + 3 * Q


def backward_shared(Q: int, P: int, N: int, tf32: bool = False) -> int:
    """Floats of shared memory an ssd_backward block uses (ssm.cu's banner): its x rows are P + 4 floats and its
    B, C, S_in and dS rows N + 4 where N and P are multiples of 4 (rows on 16 bytes), else P + 1 and N + 1.
    ``tf32`` (ssd_backward_tc): its x, dy, B, C, S_in, dS, M, dCB and Z rows padded by :func:`tc_pad`."""
    if tf32:
        p1, n1, q1 = tc_pad(P), tc_pad(N), tc_pad(Q)
        return 2 * Q * p1 + 3 * Q * P + 2 * Q * n1 + 2 * P * n1 + 3 * Q * q1 + 6 * Q + SCAN_THREADS
    pad = 4 if N % 4 == 0 and P % 4 == 0 else 1
    return Q * (P + pad) + 4 * Q * P + 2 * Q * (N + pad) + 2 * P * (N + pad) + 3 * Q * (Q + 1) + 6 * Q + SCAN_THREADS


def softplus(v):
    t = v.dtype.type(SOFTPLUS_THRESHOLD)
    return np.where(v > t, v, np.log1p(np.exp(np.minimum(v, t))))


def softplus_grad(v):
    """d softplus / dv = sigmoid(v) below the threshold, 1 above it."""
    one = v.dtype.type(1)
    return np.where(v > v.dtype.type(SOFTPLUS_THRESHOLD), one, one / (one + np.exp(-v)))


def _sigmoid(v):
    one = v.dtype.type(1)
    return one / (one + np.exp(-v))


def dims(zx_cols: int, d_inner: int, heads: int, d_state: int) -> dict:
    """The column layout of an in-projection row: offsets of z, x, B, C, dt and the group count."""
    E, H, N = int(d_inner), int(heads), int(d_state)
    gn2 = zx_cols - 2 * E - H
    if gn2 <= 0 or gn2 % (2 * N) or E % H:
        raise ValueError(f"in-projection width {zx_cols} does not split as 2E + 2GN + H with E={E}, H={H}, N={N}")
    G = gn2 // (2 * N)
    if H % G:
        raise ValueError(f"{H} heads do not split into {G} groups")
    return dict(
        E=E, H=H, N=N, G=G, P=E // H, GN=G * N, Cc=E + G * N * 2, x=E, B=2 * E, C=2 * E + G * N, dt=2 * E + 2 * G * N
    )


def n_chunks(window: int, chunk: int) -> int:
    return -(-int(window) // int(chunk))


def n_states(window: int, chunk: int) -> int:
    """Chunk states :func:`ssd_forward` keeps: one entering each chunk after the first."""
    return n_chunks(window, chunk) - 1


# --- the convolution --------------------------------------------------------------------------------
def _conv_pre(inp, conv):
    """Pre-activation of the causal depthwise conv: inp ``[B, W, C]``, conv ``[K + 1, C]`` -> ``[B, W, C]``.
    The sum runs bias first, then k ascending (the kernels' order)."""
    K = conv.shape[0] - 1
    W = inp.shape[1]
    pre = np.broadcast_to(conv[K], inp.shape).copy()
    for k in range(K):
        m = K - 1 - k  # the tap k reads in[t - m]
        pre[:, m:] = pre[:, m:] + conv[k] * inp[:, : W - m]
    return pre


def conv_forward(zx, conv, xbc, window: int, d_inner: int) -> None:
    """``xbc = silu(causal_conv(zx[:, E : E + C_c]))``. zx ``[B W, ld]``; conv ``[K + 1, C_c]``; xbc ``[B W, C_c]``."""
    E, Cc = int(d_inner), xbc.shape[1]
    inp = zx[:, E : E + Cc].reshape(-1, window, Cc)
    pre = _conv_pre(inp, conv)
    xbc[...] = (pre * _sigmoid(pre)).reshape(-1, Cc)


def conv_backward(dxbc, zx, conv, dzx, dconv_part, window: int, d_inner: int) -> None:
    """Backward of :func:`conv_forward`: ``g = dxbc silu'(pre)``; ``dzx[:, E:E+C_c]`` gets
    ``din[s] = sum_k w[k] g[s + K - 1 - k]``; the per-sample-chunk partials of ``dconv`` go to
    ``dconv_part [K', (K + 1) C_c]`` (chunks of samples, ``seq.chunk_rows``; reduce with ``seq.colsum``).
    No other column of dzx is touched."""
    E, Cc = int(d_inner), dxbc.shape[1]
    K = conv.shape[0] - 1
    inp = zx[:, E : E + Cc].reshape(-1, window, Cc)
    Bn, W = inp.shape[0], window
    pre = _conv_pre(inp, conv)
    s = _sigmoid(pre)
    g = dxbc.reshape(Bn, W, Cc) * (s * (1 + pre * (1 - s)))
    din = np.zeros_like(inp)
    dw = np.zeros((Bn, K + 1, Cc), dtype=dxbc.dtype)
    for k in range(K):
        m = K - 1 - k
        din[:, : W - m] += conv[k] * g[:, m:]
        dw[:, k] = (g[:, m:] * inp[:, : W - m]).sum(axis=1)
    dw[:, K] = g.sum(axis=1)
    dzx[:, E : E + Cc] = din.reshape(-1, Cc)
    _chunk_sums(dw.reshape(Bn, -1), dconv_part)


def conv_step(zx_t, conv, conv_state, xbc_t, d_inner: int) -> None:
    """One bar of :func:`conv_forward` for acting. conv_state ``[B, K - 1, C_c]`` holds the last K - 1
    inputs, oldest first; it is shifted and the new input appended. zx_t ``[B, ld]``; xbc_t ``[B, C_c]``."""
    E, Cc = int(d_inner), xbc_t.shape[1]
    K = conv.shape[0] - 1
    inp = zx_t[:, E : E + Cc]
    pre = np.broadcast_to(conv[K], inp.shape).copy()
    for k in range(K - 1):
        pre = pre + conv[k] * conv_state[:, k]
    pre = pre + conv[K - 1] * inp
    conv_state[:, :-1] = conv_state[:, 1:].copy()
    conv_state[:, -1] = inp
    xbc_t[...] = pre * _sigmoid(pre)


# --- the scan ---------------------------------------------------------------------------------------
def _split(xbc, zx, head, E, H, N, window):
    """x ``[B, W, H, P]``, B and C per head ``[B, W, H, N]``, dt_raw + dt_bias ``[B, W, H]``."""
    d = dims(zx.shape[1], E, H, N)
    Bn = xbc.shape[0] // window
    rep = H // d["G"]
    x = xbc[:, :E].reshape(Bn, window, H, d["P"])
    Bm = np.repeat(xbc[:, E : E + d["GN"]].reshape(Bn, window, d["G"], N), rep, axis=2)
    Cm = np.repeat(xbc[:, E + d["GN"] :].reshape(Bn, window, d["G"], N), rep, axis=2)
    v = zx[:, d["dt"] :].reshape(Bn, window, H) + head[2]
    return d, x, Bm, Cm, v


def _decay(cum):
    """``L[b, h, t, s] = exp(cum_t - cum_s)`` for s <= t, else 0. cum ``[B, Q, H]``."""
    Q = cum.shape[1]
    diff = cum[:, :, None, :] - cum[:, None, :, :]  # [B, t, s, H]
    mask = np.tril(np.ones((Q, Q), dtype=bool))[None, :, :, None]
    L = np.where(mask, np.exp(np.where(mask, diff, 0)), 0)
    return L.transpose(0, 3, 1, 2)


def ssd_forward(xbc, zx, head, y, dt, states, window: int, chunk: int, *, tf32: bool = False) -> None:
    """The chunked SSD scan (module docstring). xbc ``[B W, C_c]``; zx ``[B W, ld]`` (dt_raw columns);
    head ``[3, H]``; y ``[B W, E]`` and dt ``[B W, H]`` written; states ``[B, H, n_states, P, N]`` written
    (:func:`n_states`: the state entering each chunk after the first). ``tf32`` is the launcher's (the GPU's
    tensor-core kernel); the twin computes in its buffers' dtype either way: it is the oracle of both."""
    E = y.shape[1]
    Bn, H, ns, P, N = states.shape
    nc = n_chunks(window, chunk)
    if ns != nc - 1:
        raise ValueError(
            f"states has {ns} chunk states; a window of {window} in chunks of {chunk} has {nc - 1} "
            "(one entering each chunk after the first)"
        )
    d, x, Bm, Cm, v = _split(xbc, zx, head, E, H, N, window)
    dtv = softplus(v)
    dt[...] = dtv.reshape(-1, H)
    A = -np.exp(head[0])
    D = head[1]
    S = np.zeros((Bn, H, P, N), dtype=y.dtype)
    yv = np.empty((Bn, window, H, P), dtype=y.dtype)
    for c in range(nc):
        sl = slice(c * chunk, min((c + 1) * chunk, window))
        cum = np.cumsum(dtv[:, sl] * A, axis=1)  # [B, Q, H]
        M = _contract("bthn,bshn->bhts", Cm[:, sl], Bm[:, sl]) * _decay(cum)
        u = dtv[:, sl, :, None] * x[:, sl]
        yv[:, sl] = (
            _contract("bhts,bshp->bthp", M, u)
            + np.exp(cum)[..., None] * _contract("bhpn,bthn->bthp", S, Cm[:, sl])
            + D[:, None] * x[:, sl]
        )
        if c + 1 == nc:
            break  # the state after the window (module docstring)
        f = np.exp(cum[:, -1:] - cum)  # exp(cum_end - cum_s) [B, Q, H]
        S = np.exp(cum[:, -1])[:, :, None, None] * S + _contract("bsh,bshp,bshn->bhpn", f, u, Bm[:, sl])
        states[:, :, c] = S
    y[...] = yv.reshape(-1, E)


def ssd_backward(
    dy, xbc, zx, dt, head, states, dxbc, dzx, dbc_part, dhead_part, window: int, chunk: int, *, tf32: bool = False
) -> None:
    """Backward of :func:`ssd_forward`, chunk by chunk from the last (module docstring for the forward);
    ``tf32`` as there (ignored: the twin computes in its buffers' dtype).

    Writes ``dxbc[:, :E]`` (dx, with the D skip), ``dzx[:, dt columns]`` (d dt_raw), the per-head
    gradients of B and C ``dbc_part [B W, H, 2 N]`` (dB then dC; :func:`bc_reduce` sums a group's
    heads into dxbc) and per-sample parameter partials ``dhead_part [B, 3, H]`` (dA_log, dD, ddt_bias;
    reduce with ``seq.colsum``). No other column of dxbc or dzx is touched.
    """
    E = dy.shape[1]
    Bn, H, _, P, N = states.shape
    nc = n_chunks(window, chunk)
    d, x, Bm, Cm, v = _split(xbc, zx, head, E, H, N, window)
    dtv = dt.reshape(Bn, window, H)
    A = -np.exp(head[0])
    D = head[1]
    dyv = dy.reshape(Bn, window, H, P)
    dx = np.empty_like(x)
    ddt = np.empty_like(dtv)
    dB = np.empty_like(Bm)
    dC = np.empty_like(Cm)
    dA = np.zeros((Bn, H), dtype=dy.dtype)
    dS = np.zeros((Bn, H, P, N), dtype=dy.dtype)  # dL/dS_out of the chunk being processed
    for c in range(nc - 1, -1, -1):
        sl = slice(c * chunk, min((c + 1) * chunk, window))
        S_in = states[:, :, c - 1] if c > 0 else np.zeros_like(dS)
        xs, Bs, Cs, dys, dts = x[:, sl], Bm[:, sl], Cm[:, sl], dyv[:, sl], dtv[:, sl]
        cum = np.cumsum(dts * A, axis=1)
        L = _decay(cum)
        CB = _contract("bthn,bshn->bhts", Cs, Bs)
        M = CB * L
        u = dts[..., None] * xs
        e = np.exp(cum)  # [B, Q, H]
        f = np.exp(cum[:, -1:] - cum)
        # intra-chunk
        dM = _contract("bthp,bshp->bhts", dys, u)  # above the diagonal it meets only zeros of L and M
        dCB = dM * L
        Z = dM * M
        du = _contract("bhts,bthp->bshp", M, dys)
        dCs = _contract("bhts,bshn->bthn", dCB, Bs)
        dBs = _contract("bhts,bthn->bshn", dCB, Cs)
        dcum = Z.sum(axis=3).transpose(0, 2, 1) - Z.sum(axis=2).transpose(0, 2, 1)  # rows minus columns
        # the incoming state
        dCs += e[..., None] * _contract("bhpn,bthp->bthn", S_in, dys)
        dcum += e * _contract("bthp,bhpn,bthn->bth", dys, S_in, Cs)
        # the outgoing state
        wS = _contract("bhpn,bshn->bshp", dS, Bs)  # dS_out B_s
        du += f[..., None] * wS
        dBs += f[..., None] * _contract("bhpn,bshp->bshn", dS, u)
        q = f * (u * wS).sum(axis=3)
        dcum -= q
        dcum[:, -1] += np.exp(cum[:, -1]) * (dS * S_in).sum(axis=(2, 3)) + q.sum(axis=1)
        da = np.flip(np.cumsum(np.flip(dcum, axis=1), axis=1), axis=1)  # da_r = sum_{t >= r} dcum_t
        dx[:, sl] = dts[..., None] * du + D[:, None] * dys
        ddt[:, sl] = (xs * du).sum(axis=3) + da * A
        dA += (da * dts).sum(axis=1)
        dB[:, sl], dC[:, sl] = dBs, dCs
        dS = np.exp(cum[:, -1])[:, :, None, None] * dS + _contract("bth,bthp,bthn->bhpn", e, dys, Cs)
    draw = ddt * softplus_grad(v)
    dxbc[:, :E] = dx.reshape(-1, E)
    dzx[:, d["dt"] :] = draw.reshape(-1, H)
    dbc_part[:, :, :N] = dB.reshape(-1, H, N)
    dbc_part[:, :, N:] = dC.reshape(-1, H, N)
    dhead_part[:, 0] = dA * A  # A = -exp(A_log): dA/dA_log = A
    dhead_part[:, 1] = (dyv * x).sum(axis=(1, 3))
    dhead_part[:, 2] = draw.sum(axis=1)


def _last_terms(x, Bm, Cm, dtv, A):
    """The last bar's terms of the scan over the whole window: ``suf_s = sum_{r > s} a_r`` (added from the
    last bar down), ``e_s = exp(suf_s)`` (the decay from s to the last bar), ``cb_s = C_T . B_s`` and
    ``m_s = cb_s e_s dt_s``, all ``[B, W, H]``."""
    a = dtv * A
    suf = np.zeros_like(a)
    suf[:, :-1] = np.flip(np.cumsum(np.flip(a[:, 1:], axis=1), axis=1), axis=1)
    e = np.exp(suf)
    cb = _contract("bhn,bshn->bsh", Cm[:, -1], Bm)
    return e, cb, cb * e * dtv


def ssd_last_forward(xbc, zx, head, y, dt, window: int, d_state: int) -> None:
    """The scan's output at the last bar only: ``y_T = sum_{s <= T} (C_T . B_s) exp(sum_{s < r <= T} a_r)
    dt_s x_s + D x_T``, the last row of :func:`ssd_forward`'s y (the same numbers up to rounding), without
    its states: the top block of an encoder whose heads read only the last bar (psi) runs this, not the
    chunked scan. xbc ``[B W, C_c]``; zx ``[B W, ld]``; head ``[3, H]``; y ``[B, E]`` written; dt ``[B W, H]``
    written (every bar's: the backward needs them); d_state = N."""
    E = y.shape[1]
    H = head.shape[1]
    d, x, Bm, Cm, v = _split(xbc, zx, head, E, H, int(d_state), window)
    dtv = softplus(v)
    dt[...] = dtv.reshape(-1, H)
    _, _, m = _last_terms(x, Bm, Cm, dtv, -np.exp(head[0]))
    y[...] = (_contract("bsh,bshp->bhp", m, x) + head[1][:, None] * x[:, -1]).reshape(-1, E)


def ssd_last_backward(dy, xbc, zx, dt, head, dxbc, dzx, dbc_part, dhead_part, window: int) -> None:
    """Backward of :func:`ssd_last_forward`, dy ``[B, E]`` the gradient of the last bar's y (the window's other
    bars have none). With ``g_s = x_s . dy_T`` per head: ``dx_s = m_s dy_T`` (``+ D dy_T`` at T);
    ``dB_s = g_s e_s dt_s C_T``; ``dC_T = sum_s g_s e_s dt_s B_s`` (zero at the other bars);
    ``d dt_s = g_s cb_s e_s + A sum_{r < s} g_r m_r`` (a_s scales the decay of every earlier bar);
    ``dA = sum_s dt_s sum_{r < s} g_r m_r``; ``dD = x_T . dy_T``. Writes what :func:`ssd_backward` writes:
    ``dxbc[:, :E]``, ``dzx``'s dt columns, ``dbc_part [B W, H, 2 N]`` and ``dhead_part [B, 3, H]``."""
    E = dy.shape[1]
    H, N = head.shape[1], dbc_part.shape[2] // 2
    d, x, Bm, Cm, v = _split(xbc, zx, head, E, H, N, window)
    Bn = x.shape[0]
    dtv = dt.reshape(Bn, window, H)
    A = -np.exp(head[0])
    D = head[1]
    e, cb, m = _last_terms(x, Bm, Cm, dtv, A)
    dyv = dy.reshape(Bn, H, -1)
    g = _contract("bshp,bhp->bsh", x, dyv)
    dx = m[..., None] * dyv[:, None]
    dx[:, -1] += D[:, None] * dyv
    dcb = g * e * dtv
    dB = dcb[..., None] * Cm[:, -1][:, None]
    dC = np.zeros_like(dB)
    dC[:, -1] = _contract("bsh,bshn->bhn", dcb, Bm)
    z = g * m
    da = np.zeros_like(z)  # da_s = sum_{r < s} z_r
    da[:, 1:] = np.cumsum(z, axis=1)[:, :-1]
    draw = (g * cb * e + da * A) * softplus_grad(v)
    dxbc[:, :E] = dx.reshape(-1, E)
    dzx[:, d["dt"] :] = draw.reshape(-1, H)
    dbc_part[:, :, :N] = dB.reshape(-1, H, N)
    dbc_part[:, :, N:] = dC.reshape(-1, H, N)
    dhead_part[:, 0] = (da * dtv).sum(axis=1) * A
    dhead_part[:, 1] = (dyv * x[:, -1]).sum(axis=2)
    dhead_part[:, 2] = draw.sum(axis=1)


def bc_reduce(dbc_part, dxbc, d_inner: int) -> None:
    """``dxbc[:, B columns of group g] = sum over g's heads (ascending) of dbc_part[:, h, :N]``, the same for C.
    dbc_part ``[R, H, 2 N]``; dxbc ``[R, C_c]`` (only its B and C columns are written)."""
    E = int(d_inner)
    R, H, N2 = dbc_part.shape
    N = N2 // 2
    G = (dxbc.shape[1] - E) // N2
    rep = H // G
    for g in range(G):
        acc = dbc_part[:, g * rep].copy()
        for h in range(g * rep + 1, (g + 1) * rep):
            acc = acc + dbc_part[:, h]
        dxbc[:, E + g * N : E + (g + 1) * N] = acc[:, :N]
        dxbc[:, E + G * N + g * N : E + G * N + (g + 1) * N] = acc[:, N:]


def ssd_step(xbc_t, zx_t, head, state, y_t) -> None:
    """One bar of the recurrence for acting: ``S = exp(dt A) S + dt x B^T``, ``y = S C + D x``.

    xbc_t ``[B, C_c]``; zx_t ``[B, ld]``; head ``[3, H]``; state ``[B, H, P, N]`` (updated in place); y_t ``[B, E]``.
    """
    E = y_t.shape[1]
    Bn, H, P, N = state.shape
    d, x, Bm, Cm, v = _split(xbc_t, zx_t, head, E, H, N, 1)
    dtv = softplus(v)[:, 0]  # [B, H]
    A = -np.exp(head[0])
    x, Bm, Cm = x[:, 0], Bm[:, 0], Cm[:, 0]
    state[...] = np.exp(dtv * A)[:, :, None, None] * state + (dtv[..., None] * x)[..., None] * Bm[:, :, None, :]
    y_t[...] = (np.einsum("bhpn,bhn->bhp", state, Cm) + head[1][:, None] * x).reshape(Bn, E)
