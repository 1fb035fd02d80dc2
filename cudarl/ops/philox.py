"""Launchers for cuda_src/philox.cu (twin: cudarl/reference/philox.py).

The reference returns a new array for ``n`` draws; the launchers fill ``out`` (``n = out.size``)
and read the counter from a 1-element uint64 device array, so a captured fill draws fresh
numbers whenever the counter moves.
"""

from __future__ import annotations

from ..kernels import blocks_for, launch


def u32(out, seed: int, counter, stream_id: int, stream=None) -> None:
    """``out[j] = draw j`` of Philox stream (seed, counter[0], stream_id); out uint32 ``[n]``."""
    launch(
        "philox",
        "u32",
        min(blocks_for((out.size + 3) // 4), 8192),
        256,
        (out, out.size, seed, counter, stream_id),
        stream=stream,
    )


def uniform(out, seed: int, counter, stream_id: int, stream=None) -> None:
    """``out[j]`` uniform in [0, 1) from draw j; out float32 ``[n]``."""
    launch(
        "philox",
        "uniform",
        min(blocks_for((out.size + 3) // 4), 8192),
        256,
        (out, out.size, seed, counter, stream_id),
        stream=stream,
    )
