"""Philox4x32-10 in NumPy, bit-identical to ``cuda_src/include/cudarl/philox.cuh``.

A stream is keyed by ``(seed, counter, stream_id)``; draw ``j`` is lane ``j % 4`` of
``philox4x32(ctr=(j // 4, stream_id, counter_lo, counter_hi), key=(seed_lo, seed_hi))``.
Uniform float32 draws are ``(x >> 8) * 2**-24`` in [0, 1), exact in float32.
"""

from __future__ import annotations

import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


def philox4x32(ctr: np.ndarray, key: np.ndarray, rounds: int = 10) -> np.ndarray:
    """The Philox4x32 block function.

    Args:
        ctr: uint32 ``[..., 4]`` counters.
        key: uint32 ``[2]`` or ``[..., 2]`` keys (broadcast against ``ctr``).
        rounds: 10 for Philox4x32-10.
    Returns:
        uint32 ``[..., 4]``.
    """
    c = np.asarray(ctr, dtype=np.uint32)
    k = np.asarray(key, dtype=np.uint32)
    c0, c1, c2, c3 = (c[..., i].astype(np.uint64) for i in range(4))
    k0 = np.broadcast_to(k[..., 0], c0.shape).astype(np.uint32)
    k1 = np.broadcast_to(k[..., 1], c0.shape).astype(np.uint32)
    with np.errstate(over="ignore"):
        for r in range(rounds):
            if r > 0:
                k0 = k0 + W0
                k1 = k1 + W1
            p0 = M0 * c0
            p1 = M1 * c2
            c0, c1, c2, c3 = (
                (p1 >> _SHIFT) ^ c1 ^ k0.astype(np.uint64),
                p1 & _MASK32,
                (p0 >> _SHIFT) ^ c3 ^ k1.astype(np.uint64),
                p0 & _MASK32,
            )
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def key_of(seed: int) -> np.ndarray:
    """The Philox key ``(seed & 0xffffffff, seed >> 32)`` of a 64-bit seed."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32)


def blocks(seed: int, counter: int, stream_id: int, b: np.ndarray) -> np.ndarray:
    """Blocks ``b`` (uint32 ``[n]``) of stream ``(seed, counter, stream_id)``: uint32 ``[n, 4]``."""
    b = np.asarray(b, dtype=np.uint32)
    counter = int(counter) & 0xFFFFFFFFFFFFFFFF
    ctr = np.empty(b.shape + (4,), dtype=np.uint32)
    ctr[..., 0] = b
    ctr[..., 1] = np.uint32(int(stream_id) & 0xFFFFFFFF)
    ctr[..., 2] = np.uint32(counter & 0xFFFFFFFF)
    ctr[..., 3] = np.uint32(counter >> 32)
    return philox4x32(ctr, key_of(seed))


def u32(seed: int, counter: int, stream_id: int, n: int, offset: int = 0) -> np.ndarray:
    """Draws ``offset .. offset + n - 1`` of the stream: uint32 ``[n]``."""
    j = np.arange(offset, offset + n, dtype=np.uint64)
    first, last = int(offset) // 4, (int(offset) + max(n, 1) - 1) // 4
    blk = blocks(seed, counter, stream_id, np.arange(first, last + 1, dtype=np.uint64).astype(np.uint32))
    flat = blk.reshape(-1)
    return flat[(j - np.uint64(first * 4)).astype(np.int64)]


def to_uniform(x: np.ndarray) -> np.ndarray:
    """uint32 -> float32 in [0, 1): ``(x >> 8) * 2**-24`` (exact)."""
    return ((np.asarray(x, dtype=np.uint32) >> np.uint32(8)).astype(np.float32)) * np.float32(2.0**-24)


def uniform(seed: int, counter: int, stream_id: int, n: int, offset: int = 0) -> np.ndarray:
    """Uniform float32 ``[n]`` in [0, 1): ``to_uniform(u32(...))``."""
    return to_uniform(u32(seed, counter, stream_id, n, offset))
