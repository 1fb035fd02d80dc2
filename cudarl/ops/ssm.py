"""Launchers for ``cuda_src/ssm.cu`` (twin: ``cudarl/reference/ssm.py``, same names and arguments).

Each checks shapes here (dtype and contiguity are checked by ``kernels.launch``), writes only into
the buffers it is given, and never allocates or synchronises: safe inside a capture.
"""

from __future__ import annotations

from ..kernels import blocks_for, launch
from ..reference.ssm import CONV_MAX_K, MAX_SHARED, backward_shared, forward_shared, n_states
from ..reference.ssm import SCAN_THREADS as _SCAN_THREADS
from .seq import check_shape, check_shapes

__all__ = ["CONV_MAX_K", "MAX_SHARED", "backward_shared", "forward_shared"]  # the limits, re-exported
_CONV_THREADS = 128
_CONV_SEG = 16  # bars a conv_forward thread takes (ssm.cu CONV_SEG; any count of segments covers the window)
_STEP_THREADS = 128
_LAST_THREADS = 128  # ssm.cu LAST_THREADS
_LAST_TILE = 64  # ssm.cu LAST_TILE: bars of the window a last-bar scan block stages at a time
#: The scans' second kernels (cuda_src/ssm.cu): ``cudarl_ssm_<op>_tc``, the products on TF32 tensor cores, launched
#: by ``tf32=True`` (``net.tf32``); the same parameters, grid and block as ``cudarl_ssm_<op>``, a little more shared
#: memory (rows padded for the fragments' loads: ``forward_shared`` / ``backward_shared`` with ``tf32``), sums to
#: about 1e-3 rather than the twin's float32 rounding (tests/parity/test_ssm.py). One launcher and one twin serve
#: both (``tools/check_faces.py`` reads this literal).
KERNEL_VARIANTS = {"ssd_forward": ("tc",), "ssd_backward": ("tc",)}


def _rows(where: str, name: str, a, rows: int) -> None:
    if a.ndim < 1 or a.shape[0] != rows:
        raise ValueError(f"{where}: {name} must have {rows} rows, got shape {tuple(a.shape)}")


def _conv_dims(where: str, zx, conv, xbc_cols: int, d_inner: int) -> tuple[int, int]:
    K = conv.shape[0] - 1
    if conv.ndim != 2 or conv.shape[1] != xbc_cols or not 2 <= K <= CONV_MAX_K:
        raise ValueError(
            f"{where}: conv must be [K + 1, {xbc_cols}] with 2 <= K <= {CONV_MAX_K}, got {tuple(conv.shape)}"
        )
    if zx.ndim != 2 or zx.shape[1] < int(d_inner) + xbc_cols:
        raise ValueError(f"{where}: zx must be [rows, >= {int(d_inner) + xbc_cols}], got {tuple(zx.shape)}")
    return K, zx.shape[1]


def conv_forward(zx, conv, xbc, window: int, d_inner: int) -> None:
    """xbc ``[B W, C_c]`` = silu(causal conv of zx's columns E .. E + C_c); conv ``[K + 1, C_c]``."""
    where = "ssm.conv_forward"
    R, Cc = xbc.shape
    K, ld = _conv_dims(where, zx, conv, Cc, d_inner)
    if R % window or zx.shape[0] != R:
        raise ValueError(f"{where}: {R} rows are not whole windows of {window}, or zx has {zx.shape[0]} rows")
    launch(
        "ssm",
        "conv_forward",
        (blocks_for(Cc, _CONV_THREADS) * -(-window // _CONV_SEG), R // window),
        _CONV_THREADS,
        (zx, conv, xbc, window, d_inner, Cc, ld, K),
    )


def conv_backward(dxbc, zx, conv, dzx, dconv_part, window: int, d_inner: int) -> None:
    """din into dzx's conv columns; per-sample-chunk partials ``dconv_part [K', (K + 1) C_c]``."""
    where = "ssm.conv_backward"
    R, Cc = dxbc.shape
    K, ld = _conv_dims(where, zx, conv, Cc, d_inner)
    check_shape(where, "dzx", dzx, zx.shape)
    B = R // window
    parts = dconv_part.shape[0]
    if R % window or zx.shape[0] != R or dconv_part.shape != (parts, (K + 1) * Cc) or not 1 <= parts <= B:
        raise ValueError(f"{where}: rows {R}, window {window}, zx {zx.shape}, dconv_part {dconv_part.shape} disagree")
    launch(
        "ssm",
        "conv_backward",
        (blocks_for(Cc, _CONV_THREADS), parts),
        _CONV_THREADS,
        (dxbc, zx, conv, dzx, dconv_part, B, window, d_inner, Cc, ld, K, parts),
    )


def conv_step(zx_t, conv, conv_state, xbc_t, d_inner: int) -> None:
    """One bar: conv_state ``[B, K - 1, C_c]`` shifted in place, xbc_t ``[B, C_c]`` written."""
    where = "ssm.conv_step"
    B, Cc = xbc_t.shape
    K, ld = _conv_dims(where, zx_t, conv, Cc, d_inner)
    check_shape(where, "conv_state", conv_state, (B, K - 1, Cc))
    _rows(where, "zx_t", zx_t, B)
    launch(
        "ssm",
        "conv_step",
        blocks_for(B * Cc, _CONV_THREADS),
        _CONV_THREADS,
        (zx_t, conv, conv_state, xbc_t, B, d_inner, Cc, ld, K),
    )


def _scan_dims(where: str, xbc, zx, head, E: int, states_shape: tuple) -> tuple:
    """(B, H, P, N, G) of a scan, checked against the column layout of xbc and zx."""
    B, H, _, P, N = states_shape
    Cc = xbc.shape[1]
    GN2 = Cc - E
    if H * P != E or GN2 <= 0 or GN2 % (2 * N) or H % (GN2 // (2 * N)):
        raise ValueError(f"{where}: E={E}, H={H}, P={P}, N={N} do not fit xbc with {Cc} columns")
    check_shapes(where, ("head", head, (3, H)), ("zx", zx, (xbc.shape[0], E + Cc + H)))
    return B, H, P, N, GN2 // (2 * N)


def _shared(where: str, floats: int, shorter: str = "chunk") -> int:
    if 4 * floats > MAX_SHARED:
        raise ValueError(
            f"{where}: needs {4 * floats} bytes of shared memory (> {MAX_SHARED}); use a shorter {shorter}"
        )
    return 4 * floats


def ssd_forward(xbc, zx, head, y, dt, states, window: int, chunk: int, *, tf32: bool = False) -> None:
    """The chunked scan: y ``[B W, E]``, dt ``[B W, H]``, states ``[B, H, n_states, P, N]`` (the state entering
    each chunk after the first) written. ``tf32``: its matrix products on TF32 tensor cores (``ssd_forward_tc``)."""
    where = "ssm.ssd_forward"
    R, E = y.shape
    B, H, P, N, G = _scan_dims(where, xbc, zx, head, E, states.shape)
    _rows(where, "xbc", xbc, B * window)
    check_shapes(where, ("dt", dt, (R, H)), ("states", states, (B, H, n_states(window, chunk), P, N)))
    launch(
        "ssm",
        "ssd_forward_tc" if tf32 else "ssd_forward",
        B * H,
        _SCAN_THREADS,
        (xbc, zx, head, y, dt, states, window, H, P, N, G, chunk),
        shared_mem=_shared(where, forward_shared(chunk, P, N, tf32)),
        empty_ok=("states",),  # one chunk over the window: no states (read only entering chunk 2 on)
    )


def ssd_backward(
    dy, xbc, zx, dt, head, states, dxbc, dzx, dbc_part, dhead_part, window: int, chunk: int, *, tf32: bool = False
) -> None:
    """The scan's backward: dx into dxbc's x columns, d dt_raw into dzx's dt columns, dbc_part
    ``[B W, H, 2 N]``, dhead_part ``[B, 3, H]``. ``tf32``: its matrix products on TF32 tensor cores
    (``ssd_backward_tc``)."""
    where = "ssm.ssd_backward"
    R, E = dy.shape
    B, H, P, N, G = _scan_dims(where, xbc, zx, head, E, states.shape)
    _rows(where, "xbc", xbc, B * window)
    check_shapes(
        where,
        ("dt", dt, (R, H)),
        ("states", states, (B, H, n_states(window, chunk), P, N)),
        ("dxbc", dxbc, xbc.shape),
        ("dzx", dzx, zx.shape),
        ("dbc_part", dbc_part, (R, H, 2 * N)),
        ("dhead_part", dhead_part, (B, 3, H)),
    )
    launch(
        "ssm",
        "ssd_backward_tc" if tf32 else "ssd_backward",
        B * H,
        _SCAN_THREADS,
        (dy, xbc, zx, dt, head, states, dxbc, dzx, dbc_part, dhead_part, window, H, P, N, G, chunk),
        shared_mem=_shared(where, backward_shared(chunk, P, N, tf32)),
        empty_ok=("states",),  # one chunk over the window: no states (read only entering chunk 2 on)
    )


def _pad4(n: int) -> int:
    """ssm.cu PAD4: a shared row that may end the allocation, rounded up to 4 floats (the kernels' banner)."""
    return (int(n) + 3) & ~3


def _last_shared(window: int, P: int, N: int, backward: bool) -> int:
    """Floats of shared memory a last-bar scan block uses (ssm.cu's banner): C_T and the sums carried from tile to
    tile (y's; the backward's dC_T's, and dy_T), each padded by :func:`_pad4`; the window's 4 (backward: 6) arrays;
    and a tile of up to ``_LAST_TILE`` bars' B and x rows, ``N + 4`` and ``P + 4`` floats each."""
    tile = min(int(window), _LAST_TILE) * (int(N) + 4 + int(P) + 4)
    if backward:
        return 2 * _pad4(N) + _pad4(P) + _pad4(6 * window) + tile
    return _pad4(N) + _pad4(P) + 4 * int(window) + tile


def _last_dims(where: str, xbc, zx, head, E: int, N: int, B: int, window: int) -> tuple:
    """(H, P, N, G) of a last-bar scan over ``B`` windows, checked as :func:`_scan_dims`."""
    H = head.shape[1] if head.ndim == 2 else 0
    if H < 1 or E % H or int(N) < 1:
        raise ValueError(f"{where}: head must be [3, H] with H dividing E={E} and N={N} >= 1, got {tuple(head.shape)}")
    _rows(where, "xbc", xbc, B * window)
    _, H, P, N, G = _scan_dims(where, xbc, zx, head, E, (B, H, 1, E // H, int(N)))
    return H, P, N, G


def ssd_last_forward(xbc, zx, head, y, dt, window: int, d_state: int) -> None:
    """The last bar's scan output: y ``[B, E]``, dt ``[B W, H]`` (every bar's) written."""
    where = "ssm.ssd_last_forward"
    B, E = y.shape
    H, P, N, G = _last_dims(where, xbc, zx, head, E, d_state, B, window)
    check_shape(where, "dt", dt, (B * window, H))
    launch(
        "ssm",
        "ssd_last_forward",
        B * H,
        _LAST_THREADS,
        (xbc, zx, head, y, dt, window, H, P, N, G),
        shared_mem=_shared(where, _last_shared(window, P, N, False), "window"),
    )


def ssd_last_backward(dy, xbc, zx, dt, head, dxbc, dzx, dbc_part, dhead_part, window: int) -> None:
    """Backward of :func:`ssd_last_forward` from dy ``[B, E]``: what :func:`ssd_backward` writes."""
    where = "ssm.ssd_last_backward"
    B, E = dy.shape
    N2 = dbc_part.shape[2] if dbc_part.ndim == 3 else 0
    H, P, N, G = _last_dims(where, xbc, zx, head, E, N2 // 2, B, window)
    check_shapes(
        where,
        ("dt", dt, (B * window, H)),
        ("dxbc", dxbc, xbc.shape),
        ("dzx", dzx, zx.shape),
        ("dbc_part", dbc_part, (B * window, H, 2 * N)),
        ("dhead_part", dhead_part, (B, 3, H)),
    )
    launch(
        "ssm",
        "ssd_last_backward",
        B * H,
        _LAST_THREADS,
        (dy, xbc, zx, dt, head, dxbc, dzx, dbc_part, dhead_part, window, H, P, N, G),
        shared_mem=_shared(where, _last_shared(window, P, N, True), "window"),
    )


def bc_reduce(dbc_part, dxbc, d_inner: int) -> None:
    """dxbc's B and C columns = each group's heads' dbc_part summed in ascending order."""
    R, H, N2 = dbc_part.shape
    N = N2 // 2
    GN2 = dxbc.shape[1] - int(d_inner)
    if dxbc.shape[0] != R or N2 % 2 or GN2 <= 0 or GN2 % N2 or H % (GN2 // N2):
        raise ValueError(f"ssm.bc_reduce: dbc_part {dbc_part.shape} and dxbc {dxbc.shape} (E={d_inner}) disagree")
    G = GN2 // N2
    launch(
        "ssm",
        "bc_reduce",
        min(blocks_for(R * GN2, 256), 8192),
        256,
        (dbc_part, dxbc, R, H, N, G, d_inner),
    )


def ssd_step(xbc_t, zx_t, head, state, y_t) -> None:
    """One bar of the recurrence: state ``[B, H, P, N]`` in place, y_t ``[B, E]`` written."""
    where = "ssm.ssd_step"
    B, E = y_t.shape
    _, H, P, N, G = _scan_dims(where, xbc_t, zx_t, head, E, (B, state.shape[1], 1, state.shape[2], state.shape[3]))
    check_shape(where, "state", state, (B, H, P, N))
    _rows(where, "xbc_t", xbc_t, B)
    launch(
        "ssm",
        "ssd_step",
        B * H,
        _STEP_THREADS,
        (xbc_t, zx_t, head, state, y_t, H, P, N, G),
        shared_mem=4 * (P + 2 * N + P * (N + 1)),  # x, B, C, and the state tile with padded rows
    )
