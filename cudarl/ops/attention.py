"""Launchers for ``cuda_src/attention.cu`` (twin: ``cudarl/reference/attention.py``, same names and arguments).

Each checks shapes here (dtype and contiguity are checked by ``kernels.launch``), writes only into
the buffers it is given, and never allocates or synchronises: safe inside a capture.
"""

from __future__ import annotations

from ..kernels import blocks_for, launch
from .seq import check_shape, check_shapes
from .ssm import MAX_SHARED

_ATT_THREADS = 256  # attention.cu ATT_THREADS
_STEP_THREADS = 128  # attention.cu STEP_THREADS
#: The fused kernels' limits: a (sample, head)'s window in shared memory.
MAX_WINDOW, MAX_HEAD_DIM = 128, 64


def _dims(where: str, d: int, H: int, W: int) -> int:
    if H < 1 or d % H or (d // H) % 2 or d // H > MAX_HEAD_DIM or not 1 <= W <= MAX_WINDOW:
        raise ValueError(
            f"{where}: d={d} in H={H} heads needs an even head dim <= {MAX_HEAD_DIM}, and 1 <= W={W} <= {MAX_WINDOW}"
        )
    return d // H


def forward_shared(W: int, Dh: int) -> int:
    """Bytes of shared memory a forward block uses (attention.cu's banner)."""
    return 4 * (3 * W * (Dh + 1) + (_ATT_THREADS // 32) * W)


def backward_shared(W: int, Dh: int) -> int:
    """Bytes of shared memory a backward block uses (attention.cu's banner)."""
    return 4 * (4 * W * (Dh + 1) + W * (W + 1) + 2 * W)


def forward(qkv, o, lse, rope_base: float) -> None:
    """Causal attention with RoPE: qkv ``[B W, 3 d]``; o ``[B W, d]`` and lse ``[B, H, W]`` written."""
    where = "attention.forward"
    B, H, W = lse.shape
    R, d = o.shape
    Dh = _dims(where, d, H, W)
    check_shapes(where, ("qkv", qkv, (R, 3 * d)), ("o", o, (B * W, d)))
    launch(
        "attention",
        "forward",
        B * H,
        _ATT_THREADS,
        (qkv, o, lse, W, H, Dh, float(rope_base)),
        shared_mem=forward_shared(W, Dh),
    )


def backward(do, qkv, o, lse, dqkv, rope_base: float) -> None:
    """Backward of :func:`forward`: dqkv ``[B W, 3 d]`` written."""
    where = "attention.backward"
    B, H, W = lse.shape
    R, d = o.shape
    Dh = _dims(where, d, H, W)
    check_shapes(where, ("do", do, (R, d)), ("qkv", qkv, (R, 3 * d)), ("o", o, (B * W, d)), ("dqkv", dqkv, (R, 3 * d)))
    smem = backward_shared(W, Dh)
    if smem > MAX_SHARED:
        raise ValueError(f"{where}: needs {smem} bytes of shared memory (> {MAX_SHARED})")
    launch(
        "attention",
        "backward",
        B * H,
        _ATT_THREADS,
        (do, qkv, o, lse, dqkv, W, H, Dh, float(rope_base)),
        shared_mem=smem,
    )


def _last_dims(where: str, qkv, o, lse) -> tuple[int, int, int, int]:
    """(B, H, W, Dh) of a last-position call: o ``[B, d]``, lse ``[B, H]``, qkv ``[B W, 3 d]``."""
    B, d = o.shape
    H = lse.shape[1] if lse.ndim == 2 else 0
    W = qkv.shape[0] // B if qkv.ndim == 2 and B else 0
    Dh = _dims(where, d, H, W)
    check_shapes(where, ("lse", lse, (B, H)), ("qkv", qkv, (B * W, 3 * d)))
    return B, H, W, Dh


def last_forward(qkv, o, lse, rope_base: float) -> None:
    """The last position's attention: qkv ``[B W, 3 d]``; o ``[B, d]`` and lse ``[B, H]`` written."""
    B, H, W, Dh = _last_dims("attention.last_forward", qkv, o, lse)
    launch(
        "attention",
        "last_forward",
        B * H,
        _ATT_THREADS,
        (qkv, o, lse, W, H, Dh, float(rope_base)),
        shared_mem=4 * (3 * W * (Dh + 1) + W),
    )


def last_backward(do, qkv, o, lse, dqkv, rope_base: float) -> None:
    """Backward of :func:`last_forward` from do ``[B, d]``: dqkv ``[B W, 3 d]`` written (dq zero before the last)."""
    where = "attention.last_backward"
    B, H, W, Dh = _last_dims(where, qkv, o, lse)
    check_shapes(where, ("do", do, o.shape), ("dqkv", dqkv, qkv.shape))
    launch(
        "attention",
        "last_backward",
        B * H,
        _ATT_THREADS,
        (do, qkv, o, lse, dqkv, W, H, Dh, float(rope_base)),
        shared_mem=4 * (3 * W * (Dh + 1) + Dh + W),
    )


def step(qkv_t, kcache, vcache, pos, o_t, rope_base: float) -> None:
    """One bar over the cache ``[B, H, W, Dh]`` at positions ``pos`` int64 ``[B]`` (read only); o_t ``[B, d]``."""
    where = "attention.step"
    B, H, W, Dh = kcache.shape
    d = _dims(where, H * Dh, H, W) * H
    check_shapes(where, ("qkv_t", qkv_t, (B, 3 * d)), ("vcache", vcache, kcache.shape), ("pos", pos, (B,)))
    check_shape(where, "o_t", o_t, (B, d))
    launch(
        "attention",
        "step",
        B * H,
        _STEP_THREADS,
        (qkv_t, kcache, vcache, pos, o_t, W, H, Dh, float(rope_base)),
        shared_mem=4 * (Dh + W + 1),
    )


def advance(pos) -> None:
    """pos += 1 (int64 ``[B]``)."""
    launch("attention", "advance", blocks_for(pos.size, 256), 256, (pos, pos.size))
