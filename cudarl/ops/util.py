"""Launchers for cuda_src/util.cu (twin: cudarl/reference/util.py)."""

from __future__ import annotations

from ..kernels import blocks_for, launch
from ..reference.util import check_copy


def fill_u32(dst, value: int, stream=None) -> None:
    """``dst[:] = value`` over uint32 words (view any 4-byte-aligned buffer as uint32)."""
    launch(
        "util",
        "fill_u32",
        min(blocks_for(dst.size), 4096),
        256,
        (dst, dst.size, int(value) & 0xFFFFFFFF),
        stream=stream,
    )


def copy_u32(dst, src, stream=None) -> None:
    """``dst[:] = src`` over uint32 words of one size (view float32 buffers as uint32: their bits)."""
    check_copy(dst, src)
    launch("util", "copy_u32", min(blocks_for(dst.size), 4096), 256, (dst, src, dst.size), stream=stream)


def set_u64(dst, bits: int, stream=None) -> None:
    """``dst[0] = bits`` for a 1-element uint64 array, ordered on ``stream``."""
    launch("util", "set_u64", 1, 1, (dst, int(bits)), stream=stream)


def add_i64(dst, by: int = 1, stream=None) -> None:
    """``dst[0] += by`` on the device (a step counter that advances at every replay)."""
    launch("util", "add_i64", 1, 1, (dst, int(by)), stream=stream)


def add_f32(dst, a, b, stream=None) -> None:
    """``dst = a + b`` elementwise over float32 arrays of one size (``dst`` may be ``a`` or ``b``)."""
    if not (dst.size == a.size == b.size):
        raise ValueError(f"util.add_f32: sizes {dst.size}, {a.size}, {b.size} differ")
    launch("util", "add_f32", min(blocks_for(dst.size), 4096), 256, (dst, a, b, dst.size), stream=stream)
