"""NumPy twin of ``cuda_src/seq.cu``: the row ops the sequence encoders share (RMSNorm, the
gated RMSNorm of Mamba2, the last-position norm that makes psi, the residual add, and the
second stage of every deterministic parameter-gradient reduction).

Every function writes into the buffers it is given (like the launchers in ``cudarl/ops/seq.py``)
and computes in the dtype of those buffers: float32 buffers are the CPU backend, float64 buffers
the finite-difference oracle.

Parameter gradients are two-stage and ordered (DESIGN.md rule 3): a backward writes one partial row
per row chunk (``part [K, n]``, chunk ``k`` is rows ``[k c, (k + 1) c)`` with ``c = ceil(R / K)``,
:func:`chunk_rows`), then :func:`colsum` adds the K rows in a fixed order (:data:`COLSUM_SLICES`). The kernels use the
same chunks, so the partials mean the same on both backends.
"""

from __future__ import annotations

import numpy as np

#: Partial rows of a parameter-gradient reduction over R rows: ``min(R, PARTS)`` (one block each on the GPU).
#: 512 blocks of 8 warps fill the H200's 132 SMs; at 128 the SSM step's norm backwards ran one block an SM and
#: were latency-bound (230 us for the gated norm over 32,768 rows at bf6ed31).
PARTS = 512


def n_parts(rows: int) -> int:
    """How many partial rows a reduction over ``rows`` rows writes (``min(rows, PARTS)``, at least 1)."""
    return max(1, min(int(rows), PARTS))


def chunk_rows(rows: int, parts: int) -> list[slice]:
    """The row chunks of a reduction: ``parts`` slices of ``ceil(rows / parts)`` rows (the last ones may be
    short or empty)."""
    c = -(-int(rows) // int(parts))
    return [slice(k * c, min((k + 1) * c, rows)) for k in range(parts)]


def _chunk_sums(v: np.ndarray, part: np.ndarray) -> None:
    """``part[k] = sum of v's rows in chunk k`` (v ``[R, n]``, part ``[K, n]``)."""
    R, K = v.shape[0], part.shape[0]
    if R % K == 0:  # equal chunks: one reduction (the same row-by-row sums, without K Python calls)
        part[...] = v.reshape(K, R // K, *v.shape[1:]).sum(axis=1)
        return
    for k, sl in enumerate(chunk_rows(R, K)):
        part[k] = v[sl].sum(axis=0)


def _contract(spec: str, *operands):
    """``np.einsum(spec, *operands)`` through NumPy's contraction planner (``optimize=True``), which hands
    batched products to BLAS: 5-11x faster a contraction than the plain loop at the temporal encoders'
    CPU widths (batch 64, window 64, heads of 16; the ssd scan 2.8x forward, 2.6x backward), where the
    loop made their NumPy agents impractical. The same sums in BLAS's order: rounding differs from the
    plain loop's (float32 outputs by about 2.5e-6 relative)."""
    return np.einsum(spec, *operands, optimize=True)


def _silu(z):
    return z / (z.dtype.type(1) + np.exp(-z))


def rmsnorm_forward(x, w, out, rstd, eps: float) -> None:
    """RMSNorm (Zhang & Sennrich 2019): ``rstd = 1 / sqrt(mean_j x^2 + eps)``, ``out = x rstd w``.

    x, out ``[R, n]``; w ``[n]``; rstd ``[R]`` (written, kept for the backward).
    """
    r = x.dtype.type(1) / np.sqrt((x * x).mean(axis=1) + x.dtype.type(eps))
    rstd[...] = r
    out[...] = x * r[:, None] * w


def _rms_dx(g, xhat, rstd):
    """``rstd (g - xhat mean_j(g xhat))``: the input gradient of ``xhat = x rstd`` for ``dL/dxhat = g``."""
    return rstd[:, None] * (g - xhat * (g * xhat).mean(axis=1, keepdims=True))


def rmsnorm_backward(dout, x, w, rstd, dres, dx, dw_part) -> None:
    """Backward of :func:`rmsnorm_forward` inside a residual block.

    ``xhat = x rstd``, ``g = dout w``: ``dx = dres + rstd (g - xhat mean_j(g xhat))``, where ``dres``
    is the gradient the residual path brings to ``x``; ``dw = sum_rows dout xhat`` as partials
    ``dw_part [K, n]`` (reduce with :func:`colsum`). dout, x, dx ``[R, n]``; dres ``[R, n]`` (dx may alias it)
    or ``[R / k, n]``: the residual gradient of the last row of each group of k rows (the others have none,
    :func:`last_rows`).
    """
    xhat = x * rstd[:, None]
    dx[...] = _spread(dres, x.shape[0]) + _rms_dx(dout * w, xhat, rstd)
    _chunk_sums(dout * xhat, dw_part)


def last_rows(a, rows: int):
    """The rows of ``a [k R', ...]`` that stand for the R' rows of another operand: every k-th row from the
    k-th (the last bar of each window of k bars); k = 1 is ``a`` itself. This is how an encoder's top block
    meets the window below it when it computes the last bar only (``cudarl.nn.encoders``)."""
    k = _groups(a.shape[0], rows)
    return a if k == 1 else a[k - 1 :: k]


def _groups(big: int, small: int) -> int:
    if small < 1 or big % small:
        raise ValueError(f"{big} rows are not whole groups of the {small} rows they stand for")
    return big // small


def _spread(a, rows: int):
    """``a [R', n]`` as ``[rows, n]``: a's rows at the last of each group of ``rows / R'``, zero elsewhere."""
    if a.shape[0] == rows:
        return a
    k = _groups(rows, a.shape[0])
    out = np.zeros((rows,) + a.shape[1:], a.dtype)
    out[k - 1 :: k] = a
    return out


def last_rmsnorm_forward(h, w, out, rstd, eps: float) -> None:
    """psi of a sequence encoder: RMSNorm of the last position. h ``[B, W, n]``; out ``[B, n]``; rstd ``[B]``."""
    rmsnorm_forward(np.ascontiguousarray(h[:, -1]), w, out, rstd, eps)


def last_rmsnorm_backward(dout, h, w, rstd, dh, dw_part) -> None:
    """Backward of :func:`last_rmsnorm_forward`: dh ``[B, W, n]`` is the whole gradient w.r.t. h (zero
    before the last position); dw partials ``[K, n]`` over the B rows."""
    hl = np.ascontiguousarray(h[:, -1])
    xhat = hl * rstd[:, None]
    dh[:, :-1] = 0
    dh[:, -1] = _rms_dx(dout * w, xhat, rstd)
    _chunk_sums(dout * xhat, dw_part)


def gated_rmsnorm_forward(y, zx, w, out, rstd, eps: float) -> None:
    """Mamba2's gated RMSNorm (Dao & Gu 2024): ``g = y silu(z)``, ``out = g rstd w``,
    ``rstd = 1 / sqrt(mean g^2 + eps)``.

    The mean runs over all E channels of a row, whatever the SSM's groups G: the paper leaves the norm
    before the output projection open (LayerNorm, GroupNorm or RMSNorm); mamba_ssm's ``RMSNormGated``
    normalises each group of E / G channels on its own (``group_size = d_ssm // ngroups``), the same as
    this with G = 1 (``net.ssm_groups``' default) and not with G > 1. One RMS per row keeps the kernel
    one reduction a row (tests/unit/test_paper_oracles_aux.py holds the whole-row variant).

    y, out ``[R, E]``; ``z = zx[:, :E]`` (zx ``[R, ld]``: z is the first E columns of the in-projection,
    or ``[k R, ld]``: the last row of each group of k, :func:`last_rows`); w ``[E]``; rstd ``[R]``.
    """
    E = y.shape[1]
    g = y * _silu(last_rows(zx, y.shape[0])[:, :E])
    rmsnorm_forward(g, w, out, rstd, eps)


def gated_rmsnorm_backward(dout, y, zx, w, rstd, dy, dzx, dw_part) -> None:
    """Backward of :func:`gated_rmsnorm_forward`. With ``s = sigmoid(z)``, ``g = y z s``, ``ghat = g rstd``:
    ``dg = rstd (dout w - ghat mean(dout w ghat))``, ``dy = dg z s``, ``dz = dg y s (1 + z (1 - s))``.

    dy ``[R, E]``; dz goes to ``dzx[:, :E]`` (no other column of dzx is touched); with zx ``[k R, ld]``, to the
    rows :func:`last_rows` picks, and the other rows' z columns are written 0 (the whole gradient w.r.t. z, as
    :func:`last_rmsnorm_backward` writes dh); dw partials ``[K, E]``.
    """
    E = y.shape[1]
    z = last_rows(zx, y.shape[0])[:, :E]
    one = z.dtype.type(1)
    s = one / (one + np.exp(-z))
    g = y * (z * s)
    ghat = g * rstd[:, None]
    dg = _rms_dx(dout * w, ghat, rstd)
    dy[...] = dg * (z * s)
    if dzx.shape[0] != y.shape[0]:
        dzx[:, :E] = 0
    last_rows(dzx, y.shape[0])[:, :E] = dg * y * (s * (one + z * (one - s)))
    _chunk_sums(dout * ghat, dw_part)


def residual_add(a, b, out) -> None:
    """``out = a + b`` (the residual stream). All ``[R, n]`` (out may alias a or b), or a ``[k R, n]``: its
    last row of each group of k (:func:`last_rows`) plus b."""
    out[...] = last_rows(a, out.shape[0]) + b


#: Slices of colsum's rows (seq.cu COLSUM_SLICES): each slice summed in ascending order, then the slices'
#: sums (32 columns x COLSUM_SLICES threads a block on the GPU, so 512 parts are 8 chains of 64 adds, not one of 512).
COLSUM_SLICES = 8


def colsum(part, out) -> None:
    """``out[j] = sum_k part[k, j]`` (the second stage of every reduction), in a fixed order: the K rows in
    COLSUM_SLICES slices of ``c = ceil(K / COLSUM_SLICES)`` rows, each slice's rows added in ascending order,
    then the non-empty slices' sums in ascending order. part ``[K, n]``; out n elements (any shape: a
    parameter view such as the conv's ``[K + 1, C]``)."""
    K = part.shape[0]
    c = -(-K // COLSUM_SLICES)
    total = None
    for k0 in range(0, K, c):
        acc = part[k0].copy()
        for k in range(k0 + 1, min(k0 + c, K)):
            acc = acc + part[k]
        total = acc if total is None else total + acc
    out[...] = total.reshape(out.shape)
