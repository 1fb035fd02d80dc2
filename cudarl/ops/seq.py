"""Launchers for ``cuda_src/seq.cu`` (twin: ``cudarl/reference/seq.py``, same names and arguments).

Each checks shapes here (dtype and contiguity are checked by ``kernels.launch``), writes only into
the buffers it is given, and never allocates or synchronises: safe inside a capture.
"""

from __future__ import annotations

from ..kernels import blocks_for, launch
from ..reference.seq import COLSUM_SLICES

_T = 256
_WARPS = 8  # seq.cu SEQ_WARPS: rows per block of the row kernels
_MAX_GRID = 8192


def check_shape(where: str, name: str, a, shape: tuple) -> None:
    """Raise ValueError naming the op and the argument when ``a`` is not ``shape``."""
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{where}: {name} must have shape {tuple(shape)}, got {tuple(a.shape)}")


def check_shapes(where: str, *entries) -> None:
    """:func:`check_shape` over ``(name, array, shape)`` triples."""
    for name, a, shape in entries:
        check_shape(where, name, a, shape)


def _parts(where: str, part, rows: int, n: int) -> int:
    k = part.shape[0]
    if part.ndim != 2 or part.shape[1] != n or not 1 <= k <= rows:
        raise ValueError(f"{where}: part must be [K, {n}] with 1 <= K <= {rows} rows, got {tuple(part.shape)}")
    return k


def rmsnorm_forward(x, w, out, rstd, eps: float) -> None:
    """out = x rstd w. x, out ``[R, n]``; w ``[n]``; rstd ``[R]`` (written)."""
    R, n = x.shape
    check_shapes("seq.rmsnorm_forward", ("w", w, (n,)), ("out", out, (R, n)), ("rstd", rstd, (R,)))
    launch(
        "seq",
        "rmsnorm_forward",
        blocks_for(R, _WARPS),
        _T,
        (x, w, out, rstd, R, n, float(eps)),
    )


def rmsnorm_backward(dout, x, w, rstd, dres, dx, dw_part) -> None:
    """dx = dres + RMSNorm'^T dout; dw partials ``[K, n]`` (see the twin). dx may alias dres; dres ``[R, n]`` or
    ``[R / k, n]`` (the last row of each group of k)."""
    where = "seq.rmsnorm_backward"
    R, n = x.shape
    g = _groups(where, "dres", R, dres.shape[0] if dres.ndim else 0)
    check_shapes(where, ("dout", dout, (R, n)), ("w", w, (n,)), ("rstd", rstd, (R,)), ("dres", dres, (R // g, n)))
    check_shape(where, "dx", dx, (R, n))
    k = _parts(where, dw_part, R, n)
    launch(
        "seq",
        "rmsnorm_backward",
        k,
        _T,
        (dout, x, w, rstd, dres, dx, dw_part, R, n, k, g),
        shared_mem=4 * _WARPS * n,
    )


def last_rmsnorm_forward(h, w, out, rstd, eps: float) -> None:
    """psi = RMSNorm(h[:, W - 1]). h ``[B, W, n]``; out ``[B, n]``; rstd ``[B]``."""
    B, W, n = h.shape
    check_shapes("seq.last_rmsnorm_forward", ("w", w, (n,)), ("out", out, (B, n)), ("rstd", rstd, (B,)))
    launch(
        "seq",
        "last_rmsnorm_forward",
        blocks_for(B, _WARPS),
        _T,
        (h, w, out, rstd, B, W, n, float(eps)),
    )


def last_rmsnorm_backward(dout, h, w, rstd, dh, dw_part) -> None:
    """dh ``[B, W, n]`` (zero before the last position); dw partials ``[K, n]`` over the B rows."""
    where = "seq.last_rmsnorm_backward"
    B, W, n = h.shape
    check_shapes(where, ("dout", dout, (B, n)), ("w", w, (n,)), ("rstd", rstd, (B,)), ("dh", dh, (B, W, n)))
    k = _parts(where, dw_part, B, n)
    launch(
        "seq",
        "last_rmsnorm_backward",
        k,
        _T,
        (dout, h, w, rstd, dh, dw_part, B, W, n, k),
        shared_mem=4 * _WARPS * n,
    )


def _groups(where: str, name: str, big: int, small: int) -> int:
    """k = big / small where ``big`` rows are k rows for each of ``small`` (the last of each group of k stands for
    one: ``reference.seq.last_rows``); ``name`` is the operand whose rows are checked."""
    if small < 1 or big < small or big % small:
        raise ValueError(f"{where}: {name}: {big} rows are not k rows for each of {small}")
    return big // small


def _zx(where: str, zx, R: int, n: int) -> tuple[int, int]:
    """(ld, k) of zx ``[k R, ld >= n]``."""
    if zx.ndim != 2 or zx.shape[1] < n:
        raise ValueError(f"{where}: zx must be [k {R}, >= {n}], got {tuple(zx.shape)}")
    return zx.shape[1], _groups(where, "zx", zx.shape[0], R)


def gated_rmsnorm_forward(y, zx, w, out, rstd, eps: float) -> None:
    """out = RMSNorm(y silu(z)) w, z = zx[:, :E]. y, out ``[R, E]``; zx ``[k R, ld]`` (z of the last row of each
    group of k); rstd ``[R]``."""
    where = "seq.gated_rmsnorm_forward"
    R, n = y.shape
    ld, g = _zx(where, zx, R, n)
    check_shapes(where, ("w", w, (n,)), ("out", out, (R, n)), ("rstd", rstd, (R,)))
    launch(
        "seq",
        "gated_rmsnorm_forward",
        blocks_for(R, _WARPS),
        _T,
        (y, zx, w, out, rstd, R, n, ld, float(eps), g),
    )


def gated_rmsnorm_backward(dout, y, zx, w, rstd, dy, dzx, dw_part) -> None:
    """dy ``[R, E]``; dz into ``dzx[:, :E]`` (nothing else of dzx; zx and dzx ``[k R, ld]``: the last row of each
    group of k, 0 in the others); dw partials ``[K, E]``."""
    where = "seq.gated_rmsnorm_backward"
    R, n = y.shape
    ld, g = _zx(where, zx, R, n)
    check_shapes(where, ("dout", dout, (R, n)), ("w", w, (n,)), ("rstd", rstd, (R,)), ("dy", dy, (R, n)))
    check_shape(where, "dzx", dzx, zx.shape)
    k = _parts(where, dw_part, R, n)
    launch(
        "seq",
        "gated_rmsnorm_backward",
        k,
        _T,
        (dout, y, zx, w, rstd, dy, dzx, dw_part, R, n, ld, k, g),
        shared_mem=4 * _WARPS * n,
    )


def residual_add(a, b, out) -> None:
    """out = a + b, all the same shape (out may alias a or b), or a ``[k R, n]`` against b, out ``[R, n]``: a's
    last row of each group of k."""
    where = "seq.residual_add"
    g = _groups(where, "a", a.shape[0] if a.ndim else 0, out.shape[0] if out.ndim else 0)
    check_shapes(where, ("b", b, out.shape), ("a", a, (g * out.shape[0],) + tuple(out.shape[1:])))
    launch(
        "seq",
        "residual_add",
        min(blocks_for(out.size, _T), _MAX_GRID),
        _T,
        (a, b, out, out.size, out.size // max(out.shape[0], 1), g),
    )


def colsum(part, out) -> None:
    """out (n elements, any shape) = sum of part's K rows ``[K, n]`` in the twin's order (slices of the rows,
    then the slices' sums; ``reference.seq.colsum``)."""
    K, n = part.shape
    if out.size != n:
        raise ValueError(f"seq.colsum: out has {out.size} elements, part has rows of {n}")
    launch("seq", "colsum", blocks_for(n, 32), (32, COLSUM_SLICES), (part, out, K, n))
