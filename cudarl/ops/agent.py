"""Launchers for cuda_src/agent.cu (twin: cudarl/reference/agent.py)."""
from __future__ import annotations

from ..kernels import blocks_for, launch


def quantile_mean(q, theta, stream=None) -> None:
    """``q [B, A] = mean over n of theta [B, N, A]``."""
    B, N, A = theta.shape
    if q.shape != (B, A):
        raise ValueError(f"q: expected [{B}, {A}], got {list(q.shape)}")
    launch("agent", "quantile_mean", blocks_for(B * A), 256, "f32* q, const f32* theta, i32 B, i32 N, i32 A",
           (q, theta, B, N, A), stream=stream)


def discount(out, done, gamma, stream=None) -> None:
    """``out = gamma[0] * (1 - done)``; gamma a float32 ``[1]`` device scalar."""
    if out.shape != done.shape:
        raise ValueError(f"out {list(out.shape)} and done {list(done.shape)} must match")
    launch("agent", "discount", min(blocks_for(out.size), 4096), 256, "f32* out, const f32* done, const f32* gamma, i64 n",
           (out, done, gamma, out.size), stream=stream)


def epsilon(eps, count, start: float, end: float, steps: int, stream=None) -> None:
    """Linear epsilon schedule from the device counter ``count`` (int64 ``[1]``, incremented)."""
    launch("agent", "epsilon", 1, 1, "f32* eps, i64* count, f64 start, f64 end, i64 steps",
           (eps, count, float(start), float(end), int(steps)), stream=stream)


def publish(ring, loss, grad_norm, step, slots: int, stream=None) -> None:
    """Copy ``loss[0]``, ``grad_norm[0]`` into slot ``step[0] % slots`` of ``ring`` (float32 ``[2 * slots]``)."""
    if ring.size != 2 * slots:
        raise ValueError(f"ring: expected {2 * slots} floats, got {ring.size}")
    launch("agent", "publish", 1, 1, "f32* ring, const f32* loss, const f32* grad_norm, const i64* step, i32 slots",
           (ring, loss, grad_norm, step, slots), stream=stream)
