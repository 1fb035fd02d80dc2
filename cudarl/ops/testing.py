"""Launchers for cuda_src/testing.cu (twin: cudarl/reference/testing.py)."""

from __future__ import annotations

from ..kernels import blocks_for, launch


def spin_then_write(dst, value: float, cycles: int, stream=None) -> None:
    """After spinning ``cycles`` clock cycles, ``dst[0] = value`` (dst float32, may be pinned)."""
    launch("testing", "spin_then_write", 1, 1, (dst, value, cycles), stream=stream)


def iota_sized(out, n, stream=None) -> None:
    """``out[i] = i + 1`` for ``i < n[0]`` else 0; ``n`` is a 1-element int64 device array."""
    launch(
        "testing",
        "iota_sized",
        min(blocks_for(out.size), 4096),
        256,
        (out, n, out.size),
        stream=stream,
    )


def axpb(x, a: float, b: float, stream=None) -> None:
    """``x = a * x + b`` in place (float32)."""
    launch(
        "testing",
        "axpb",
        min(blocks_for(x.size), 4096),
        256,
        (x, x.size, a, b),
        stream=stream,
    )


def empty(blocks: int = 1, threads: int = 32, stream=None) -> None:
    """A kernel that does nothing, on ``blocks`` x ``threads`` (the cost of a node, ``tools/bench_floor.py``)."""
    launch("testing", "empty", blocks, threads, (), stream=stream)


def fma(x, a: float, b: float, iters: int, stream=None) -> None:
    """``x = a * x + b`` repeated ``iters`` times in place (float32, one FMA each; 2 FLOPs)."""
    launch(
        "testing",
        "fma",
        min(blocks_for(x.size), 65536),
        256,
        (x, x.size, a, b, iters),
        stream=stream,
    )
