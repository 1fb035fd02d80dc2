"""Stratified proportional sampling from the sum tree (Philox targets, exact integer strata) and the
importance weights ``(q_min / q_j)**beta`` with beta annealed on the device."""

from __future__ import annotations

import numpy as np

from .. import philox
from ..window import gather as gather_windows
from .buffers import STATUS_EMPTY, ReplayBuffers, ReplaySpec, members
from .nstep import gather


def beta_at(spec: ReplaySpec, step: int) -> float:
    """``beta0 + (beta_final - beta0) * min(1, step / beta_steps)`` in float64."""
    frac = min(1.0, float(step) / float(spec.beta_steps))
    return float(np.float64(spec.beta0) + np.float64(spec.beta_final - spec.beta0) * np.float64(frac))


def _mulhi64(r: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``floor(r * w / 2**64)`` for uint64 arrays, exact (Python integers)."""
    return np.array([(int(a) * int(b)) >> 64 for a, b in zip(r, w, strict=True)], dtype=np.uint64)


@members()
def sample_search(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, qsel_out) -> None:
    """Stratified proportional search: ``indices_out`` int32 ``[B]``, ``qsel_out`` int64 ``[B]``
    (the sampled leaves), from the stream ``(seed, step, stream_id)`` (``seed``: ``bufs.seed``, the
    device's copy of ``spec.seed``, a member's own with the member axis). Reads ``step``, does not
    advance it. An empty tree gives index 0, leaf 0 and ``STATUS_EMPTY``."""
    B = indices_out.shape[0]
    leaves = bufs.tree[: spec.capacity]
    incl = np.cumsum(leaves)  # exact: int64 with T < 2**63
    T = int(incl[-1])
    if T == 0:
        indices_out[:] = 0
        qsel_out[:] = 0
        bufs.status[0] |= STATUS_EMPTY
        return
    blk = philox.blocks(int(bufs.seed[0]), int(bufs.step[0]), spec.stream_id, np.arange(B, dtype=np.uint32))
    r = (blk[:, 1].astype(np.uint64) << np.uint64(32)) | blk[:, 0].astype(np.uint64)
    j = np.arange(B + 1, dtype=np.uint64)
    qB, rB = np.uint64(T // B), np.uint64(T % B)
    lo = j * qB + (j * rB) // np.uint64(B)
    target = lo[:-1] + _mulhi64(r, lo[1:] - lo[:-1])
    idx = np.searchsorted(incl, target.astype(np.int64), side="right")
    indices_out[:] = idx.astype(np.int32)
    qsel_out[:] = leaves[idx]


@members()
def sample_weights(spec: ReplaySpec, bufs: ReplayBuffers, qsel, weights_out) -> None:
    """``weights_out[j] = (min_k q_k / q_j)**beta(step)`` (float64, then float32; 0 if a leaf is 0);
    writes ``beta``, then ``step += 1``."""
    step = int(bufs.step[0])
    beta = beta_at(spec, step)
    q = np.asarray(qsel).astype(np.float64)
    qmin = q.min()
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where((q == 0) | (qmin == 0), 0.0, np.power(qmin / q, np.float64(beta)))
    weights_out[:] = w.astype(np.float32)
    bufs.beta[0] = beta
    bufs.step[0] = step + 1


def sample_weights_members(spec: ReplaySpec, bufs: ReplayBuffers, qsel, weights_out, beta0, beta_final, beta_steps):
    """:func:`sample_weights` over the member axis (``bufs`` with it, ``qsel`` and ``weights_out`` ``[P, B]``)
    whose members each run their own beta schedule: ``beta0``, ``beta_final``, ``beta_steps`` ``[P]``,
    member ``i`` the single call with ``spec``'s schedule replaced by its own."""
    from dataclasses import replace

    for i in range(bufs.members):
        one = replace(spec, beta0=float(beta0[i]), beta_final=float(beta_final[i]), beta_steps=int(beta_steps[i]))
        sample_weights(one, bufs.member(i), qsel[i], weights_out[i])


@members()
def sample(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, weights_out, qsel_out) -> None:
    """Stratified proportional sampling of ``B = len(indices_out)`` rows; then ``step += 1``.

    Writes ``indices_out`` int32 ``[B]``, ``weights_out`` float32 ``[B]``
    (``(q_min / q_j)**beta``), ``qsel_out`` int64 ``[B]`` (the sampled leaves), ``beta``.
    """
    sample_search(spec, bufs, indices_out, qsel_out)
    sample_weights(spec, bufs, qsel_out, weights_out)


@members()
def sample_search_gather(
    spec: ReplaySpec,
    bufs: ReplayBuffers,
    indices_out,
    qsel_out,
    obs_out,
    next_obs_out,
    action_out,
    return_out,
    discount_out,
) -> None:
    """:func:`sample_search` then :func:`gather` of the rows found (the GPU does both in one launch)."""
    sample_search(spec, bufs, indices_out, qsel_out)
    gather(spec, bufs, indices_out, obs_out, next_obs_out, action_out, return_out, discount_out)


@members("features", "sign")
def sample_search_gather_windows(
    spec: ReplaySpec,
    bufs: ReplayBuffers,
    indices_out,
    qsel_out,
    obs_out,
    next_obs_out,
    action_out,
    return_out,
    discount_out,
    features,
    sign,
    window: int,
    obs_win,
    next_win,
) -> None:
    """:func:`sample_search_gather` of state rows, then the windows of the rows gathered:
    ``window.gather(obs_out, features, sign, obs_win, window)`` and the same of ``next_obs_out`` into
    ``next_win`` (the GPU does all of it in one launch)."""
    sample_search_gather(spec, bufs, indices_out, qsel_out, obs_out, next_obs_out, action_out, return_out, discount_out)
    gather_windows(obs_out, features, sign, obs_win, window)
    gather_windows(next_obs_out, features, sign, next_win, window)
