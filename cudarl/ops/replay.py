"""Launchers for ``cuda_src/replay.cu`` (twin: ``cudarl/reference/replay.py``, same op names).

Each launcher checks shapes and dtypes on the host, then launches; it never allocates,
synchronises or reads a device value, so each is capture-safe. Values that only the device
can see (NaN ``td`` produced inside a graph, non-finite rows from an environment kernel) are
handled by the kernels' documented rules and status bits (see the reference's docstring).
"""
from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.replay import ReplayBuffers, ReplaySpec, check_next_obs_arg, tree_layout

_ONE_BLOCK = 1024
_WARPS_PER_BLOCK = 8


def _need(name: str, a, shape: tuple, dtype) -> None:
    if tuple(a.shape) != tuple(shape) or a.dtype != np.dtype(dtype):
        raise ValueError(f"{name}: expected {np.dtype(dtype)} {tuple(shape)}, got {a.dtype} {tuple(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: must be C-contiguous")


def _depth(bufs: ReplayBuffers) -> int:
    return int(bufs.levels.shape[0]) - 1


def _check_rows(spec: ReplaySpec, obs, action, reward, discount) -> int:
    B, D, C = int(obs.shape[0]), spec.obs_dim, spec.capacity
    _need("obs", obs, (B, D), np.float32)
    _need("action", action, (B,), np.int32)
    _need("reward", reward, (B,), np.float32)
    _need("discount", discount, (B,), np.float32)
    if B < 1 or B > C or B % spec.n_envs:
        raise ValueError(f"obs: batch of {B} rows must be in [1, capacity={C}] and a multiple of n_envs={spec.n_envs}")
    return B


def insert_check(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """Set ``flag`` (reject) and ``status`` from the batch's values. 1 block."""
    B = _check_rows(spec, obs, action, reward, discount)
    launch("replay", "insert_check", 1, _ONE_BLOCK,
           "const f32* obs, const i32* action, const f32* reward, const f32* discount, i64* flag, i64* status, i64 B, i64 D",
           (obs, action, reward, discount, bufs.flag, bufs.status, B, spec.obs_dim))


def insert_rows(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """Write the batch at slots ``(added + k) mod C`` unless ``flag``. A thread per (row, feature)."""
    B = _check_rows(spec, obs, action, reward, discount)
    D = spec.obs_dim
    launch("replay", "insert_rows", blocks_for(B * D), 256,
           "const f32* obs, const i32* action, const f32* reward, const f32* discount, f32* s_obs, i32* s_action, "
           "f32* s_reward, f32* s_discount, const i64* flag, const i64* added, i64 B, i64 D, i64 C",
           (obs, action, reward, discount, bufs.obs, bufs.action, bufs.reward, bufs.discount, bufs.flag, bufs.added,
            B, D, spec.capacity))


def _check_next(spec: ReplaySpec, bufs: ReplayBuffers, next_obs) -> int:
    if not spec.store_next_obs:
        raise ValueError("next_obs: this buffer has no next_obs ring (store_next_obs=False)")
    B = int(next_obs.shape[0])
    _need("next_obs", next_obs, (B, spec.obs_dim), np.float32)
    _need("bufs.next_obs", bufs.next_obs, (spec.capacity, spec.obs_dim), np.float32)
    if B < 1 or B > spec.capacity or B % spec.n_envs:
        raise ValueError(f"next_obs: batch of {B} rows must be in [1, capacity={spec.capacity}] and a multiple of n_envs={spec.n_envs}")
    return B


def insert_next_check(spec: ReplaySpec, bufs: ReplayBuffers, next_obs) -> None:
    """After ``insert_check``: reject the batch (``flag``, ``status``) if ``next_obs`` is not finite. 1 block."""
    B = _check_next(spec, bufs, next_obs)
    launch("replay", "insert_next_check", 1, _ONE_BLOCK, "const f32* next_obs, i64* flag, i64* status, i64 B, i64 D",
           (next_obs, bufs.flag, bufs.status, B, spec.obs_dim))


def insert_next_rows(spec: ReplaySpec, bufs: ReplayBuffers, next_obs) -> None:
    """Write ``next_obs`` at slots ``(added + k) mod C`` of ``bufs.next_obs`` unless ``flag``. A thread per element."""
    B = _check_next(spec, bufs, next_obs)
    D = spec.obs_dim
    launch("replay", "insert_next_rows", blocks_for(B * D), 256,
           "const f32* next_obs, f32* s_next_obs, const i64* flag, const i64* added, i64 B, i64 D, i64 C",
           (next_obs, bufs.next_obs, bufs.flag, bufs.added, B, D, spec.capacity))


def insert_priorities(spec: ReplaySpec, bufs: ReplayBuffers, B: int) -> None:
    """Leaves of the written and newly ready rows, and their ancestors. A thread per row (B + nE)."""
    launch("replay", "insert_priorities", blocks_for(int(B) + spec.lag), 256,
           "i64* tree, const i64* levels, const i64* flag, const i64* added, const i64* max_q, i64 B, i64 C, i64 lag, i32 depth",
           (bufs.tree, bufs.levels, bufs.flag, bufs.added, bufs.max_q, int(B), spec.capacity, spec.lag, _depth(bufs)))


def insert_advance(spec: ReplaySpec, bufs: ReplayBuffers, B: int) -> None:
    """``added += B`` unless ``flag``. 1 thread."""
    launch("replay", "insert_advance", 1, 1, "i64* added, const i64* flag, i64 B", (bufs.added, bufs.flag, int(B)))


def insert(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount, next_obs=None) -> None:
    """Append ``B`` rows; see ``reference.replay.insert``. 4 launches: check, rows, priorities,
    advance; 6 with ``store_next_obs`` (``insert_next_check`` and ``insert_next_rows`` as well)."""
    check_next_obs_arg(spec, next_obs)
    B = _check_rows(spec, obs, action, reward, discount)
    if spec.store_next_obs and _check_next(spec, bufs, next_obs) != B:
        raise ValueError(f"next_obs: {next_obs.shape[0]} rows, obs has {B}")
    insert_check(spec, bufs, obs, action, reward, discount)
    if spec.store_next_obs:
        insert_next_check(spec, bufs, next_obs)
    insert_rows(spec, bufs, obs, action, reward, discount)
    if spec.store_next_obs:
        insert_next_rows(spec, bufs, next_obs)
    insert_priorities(spec, bufs, B)
    insert_advance(spec, bufs, B)


def sample_search(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, qsel_out) -> None:
    """A warp per sample descends the tree; writes ``indices_out`` int32 ``[B]``, ``qsel_out`` int64 ``[B]``."""
    B = int(indices_out.shape[0])
    _need("indices_out", indices_out, (B,), np.int32)
    _need("qsel_out", qsel_out, (B,), np.int64)
    threads = 32 * _WARPS_PER_BLOCK
    launch("replay", "sample_search", blocks_for(32 * B, threads), threads,
           "const i64* tree, const i64* levels, const i64* step, i32* indices, i64* qsel, i64* status, i64 B, i32 depth, u64 seed, u32 stream_id",
           (bufs.tree, bufs.levels, bufs.step, indices_out, qsel_out, bufs.status, B, _depth(bufs),
            int(spec.seed) & 0xFFFFFFFFFFFFFFFF, int(spec.stream_id)))


def sample_weights(spec: ReplaySpec, bufs: ReplayBuffers, qsel, weights_out) -> None:
    """One block: ``weights_out`` float32 ``[B]`` from ``qsel`` int64 ``[B]``; writes ``beta``; ``step += 1``."""
    B = int(qsel.shape[0])
    _need("qsel", qsel, (B,), np.int64)
    _need("weights_out", weights_out, (B,), np.float32)
    launch("replay", "sample_weights", 1, _ONE_BLOCK,
           "const i64* qsel, f32* weights, i64* step, f64* beta, i64 B, f64 beta0, f64 beta_final, i64 beta_steps",
           (qsel, weights_out, bufs.step, bufs.beta, B, float(spec.beta0), float(spec.beta_final), int(spec.beta_steps)))


def sample(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, weights_out, qsel_out) -> None:
    """Stratified proportional sample of ``B = len(indices_out)`` rows; see ``reference.replay.sample``.

    Writes ``indices_out`` int32 ``[B]``, ``weights_out`` float32 ``[B]``, ``qsel_out`` int64 ``[B]``,
    then ``beta`` and ``step += 1``. 2 launches: a warp per sample, then one block for the weights.
    """
    sample_search(spec, bufs, indices_out, qsel_out)
    sample_weights(spec, bufs, qsel_out, weights_out)


def gather(spec: ReplaySpec, bufs: ReplayBuffers, indices, obs_out, next_obs_out, action_out, return_out, discount_out) -> None:
    """Gather sampled rows, bootstrap rows and n-step targets; see ``reference.replay.gather``. 1 launch.

    The bootstrap row is row ``(s + lag) mod C`` of the ring ``obs`` (``lag = nE``), or of the
    stored ``next_obs`` ring (``lag = 0``) with ``store_next_obs``."""
    B, W = int(indices.shape[0]), spec.row_width
    _need("indices", indices, (B,), np.int32)
    _need("obs_out", obs_out, (B, W), np.float32)
    _need("next_obs_out", next_obs_out, (B, W), np.float32)
    _need("action_out", action_out, (B,), np.int32)
    _need("return_out", return_out, (B,), np.float32)
    _need("discount_out", discount_out, (B,), np.float32)
    if spec.store_next_obs:
        _need("bufs.next_obs", bufs.next_obs, (spec.capacity, spec.obs_dim), np.float32)
    s_next = bufs.next_obs if spec.store_next_obs else bufs.obs
    launch("replay", "gather", blocks_for(B * W), 256,
           "const f32* s_obs, const i32* s_action, const f32* s_reward, const f32* s_discount, const f32* s_next, "
           "const i32* indices, f32* obs_out, f32* next_obs_out, i32* action_out, f32* return_out, f32* discount_out, "
           "i64* status, i64 B, i64 D, i64 W, i64 C, i64 n_envs, i32 n_step, i64 lag",
           (bufs.obs, bufs.action, bufs.reward, bufs.discount, s_next, indices, obs_out, next_obs_out, action_out,
            return_out, discount_out, bufs.status, B, spec.obs_dim, W, spec.capacity, spec.n_envs, spec.n_step,
            spec.lag))


def update_priorities(spec: ReplaySpec, bufs: ReplayBuffers, indices, td) -> None:
    """Set priorities from TD errors; see ``reference.replay.update_priorities``. 1 launch (one block)."""
    B = int(indices.shape[0])
    _need("indices", indices, (B,), np.int32)
    _need("td", td, (B,), np.float32)
    launch("replay", "update_priorities", 1, _ONE_BLOCK,
           "const i32* indices, const f32* td, i64* tree, const i64* levels, i32* owner, i64* max_q, i64* status, "
           "i64 B, i64 C, i32 depth, f64 alpha, f64 eps",
           (indices, td, bufs.tree, bufs.levels, bufs.owner, bufs.max_q, bufs.status, B, spec.capacity,
            _depth(bufs), float(spec.alpha), float(spec.eps)))


def tree_level(tree, src_off: int, dst_off: int, n_dst: int) -> None:
    """``tree[dst_off + p] = sum of the 32 children at src_off + 32p`` for ``p < n_dst``. A thread per node."""
    if tree.dtype != np.int64 or tree.ndim != 1:
        raise ValueError(f"tree: expected int64 [nodes], got {tree.dtype} {tuple(tree.shape)}")
    launch("replay", "tree_level", blocks_for(n_dst), 256, "i64* tree, i64 src_off, i64 dst_off, i64 n_dst",
           (tree, int(src_off), int(dst_off), int(n_dst)))


def build_tree(spec: ReplaySpec, bufs: ReplayBuffers) -> None:
    """Rebuild the internal nodes from the leaves, bottom up: one launch per level."""
    layout = tree_layout(spec.capacity)
    for (src_off, src_n), (dst_off, _) in zip(layout[:-1], layout[1:]):
        tree_level(bufs.tree, src_off, dst_off, src_n // 32)
