"""Launchers for ``cuda_src/replay.cu`` (twin: ``cudarl/reference/replay.py``, same op names).

Each launcher checks shapes and dtypes on the host, then launches; it never allocates,
synchronises or reads a device value, so each is capture-safe. Values that only the device
can see (NaN ``td`` produced inside a graph, non-finite rows from an environment kernel) are
handled by the kernels' documented rules and status bits (see the reference's docstring).
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.replay import FLAG_WORDS, ReplayBuffers, ReplaySpec, check_next_obs_arg, tree_layout
from ..reference.window import STATE_DIM, width

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


def _check_next(spec: ReplaySpec, bufs: ReplayBuffers, next_obs, B: int) -> None:
    if not spec.store_next_obs:
        raise ValueError("next_obs: this buffer has no next_obs ring (store_next_obs=False)")
    _need("next_obs", next_obs, (B, spec.obs_dim), np.float32)
    _need("bufs.next_obs", bufs.next_obs, (spec.capacity, spec.obs_dim), np.float32)


def _check_flag(bufs: ReplayBuffers) -> None:
    _need("bufs.flag", bufs.flag, (FLAG_WORDS,), np.int64)


_CHECK_THREADS, _CHECK_PER_THREAD, _MAX_BLOCKS = 256, 4, 1024


def _check_grid(B: int, D: int) -> int:
    return max(1, min(_MAX_BLOCKS, -(-B * D // (_CHECK_THREADS * _CHECK_PER_THREAD))))


def insert_check(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """Set ``flag[FLAG_REJECT]`` (and ``status``) from the batch's values. A grid; its last block decides."""
    B, D = _check_rows(spec, obs, action, reward, discount), spec.obs_dim
    _check_flag(bufs)
    launch(
        "replay",
        "insert_check",
        _check_grid(B, D),
        _CHECK_THREADS,
        (obs, action, reward, discount, bufs.flag, bufs.status, B, D),
    )


def insert_check_next(spec: ReplaySpec, bufs: ReplayBuffers, obs, next_obs, action, reward, discount) -> None:
    """``insert_check`` of a batch with ``next_obs`` (``store_next_obs``): a non-finite ``next_obs`` rejects it too."""
    B, D = _check_rows(spec, obs, action, reward, discount), spec.obs_dim
    _check_next(spec, bufs, next_obs, B)
    _check_flag(bufs)
    launch(
        "replay",
        "insert_check_next",
        _check_grid(2 * B, D),
        _CHECK_THREADS,
        (obs, next_obs, action, reward, discount, bufs.flag, bufs.status, B, D),
    )


_COMMIT_THREADS = 1024  # COMMIT_THREADS in replay.cu (its __launch_bounds__)
_COMMIT_WARPS = _COMMIT_THREADS // 32


def commit_grid(spec: ReplaySpec, B: int) -> tuple[int, int]:
    """``(row_blocks, tree_blocks)`` of ``insert_commit``: a warp per batch row, and a warp per
    level-1 node over the most slots an insert of ``B`` rows can set, ``min(B + lag, C)`` (both
    loops are grid-strided, so the caps only bound the grid)."""
    slots = min(B + spec.lag, spec.capacity)
    nodes = min(slots // 32 + 2, -(-spec.capacity // 32))
    return (min(_MAX_BLOCKS, -(-B // _COMMIT_WARPS)), max(1, min(_MAX_BLOCKS, -(-nodes // _COMMIT_WARPS))))


def _commit(op: str, spec: ReplaySpec, bufs: ReplayBuffers, B: int, head: tuple, rings: tuple) -> None:
    _check_flag(bufs)
    row_blocks, tree_blocks = commit_grid(spec, B)
    launch(
        "replay",
        op,
        row_blocks + tree_blocks,
        _COMMIT_THREADS,
        (
            *head,
            *rings,
            bufs.action,
            bufs.reward,
            bufs.discount,
            bufs.tree,
            bufs.levels,
            bufs.flag,
            bufs.added,
            bufs.max_q,
            B,
            spec.obs_dim,
            spec.capacity,
            spec.lag,
            _depth(bufs),
            row_blocks,
        ),
    )


def insert_commit(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """Unless ``flag[FLAG_REJECT]``: the rows at slots ``(added + k) mod C``, the leaves of the
    written and newly ready rows, their ancestors (the grid's last block does levels >= 2), then
    ``added += B``. 1 launch."""
    B = _check_rows(spec, obs, action, reward, discount)
    _commit(
        "insert_commit",
        spec,
        bufs,
        B,
        (obs, action, reward, discount),
        (bufs.obs,),
    )


def insert_commit_next(spec: ReplaySpec, bufs: ReplayBuffers, obs, next_obs, action, reward, discount) -> None:
    """``insert_commit`` that also writes ``next_obs`` into ``bufs.next_obs`` (``store_next_obs``). 1 launch."""
    B = _check_rows(spec, obs, action, reward, discount)
    _check_next(spec, bufs, next_obs, B)
    _commit(
        "insert_commit_next",
        spec,
        bufs,
        B,
        (obs, next_obs, action, reward, discount),
        (bufs.obs, bufs.next_obs),
    )


def insert(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount, next_obs=None) -> None:
    """Append ``B`` rows; see ``reference.replay.insert``. 2 launches: ``insert_check`` and
    ``insert_commit`` (their ``_next`` variants with ``store_next_obs``)."""
    check_next_obs_arg(spec, next_obs)
    if spec.store_next_obs:
        insert_check_next(spec, bufs, obs, next_obs, action, reward, discount)
        insert_commit_next(spec, bufs, obs, next_obs, action, reward, discount)
    else:
        insert_check(spec, bufs, obs, action, reward, discount)
        insert_commit(spec, bufs, obs, action, reward, discount)


def _search_args(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, qsel_out) -> tuple[int, tuple]:
    """B and the search's arguments: shared by both searching launches."""
    B = int(indices_out.shape[0])
    _need("indices_out", indices_out, (B,), np.int32)
    _need("qsel_out", qsel_out, (B,), np.int64)
    return B, (
        bufs.tree,
        bufs.levels,
        bufs.step,
        indices_out,
        qsel_out,
        bufs.status,
        B,
        _depth(bufs),
        int(spec.seed) & 0xFFFFFFFFFFFFFFFF,
        int(spec.stream_id),
    )


def sample_search(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, qsel_out) -> None:
    """A warp per sample descends the tree; writes ``indices_out`` int32 ``[B]``, ``qsel_out`` int64 ``[B]``."""
    B, args = _search_args(spec, bufs, indices_out, qsel_out)
    threads = 32 * _WARPS_PER_BLOCK
    launch("replay", "sample_search", blocks_for(32 * B, threads), threads, args)


def sample_weights(spec: ReplaySpec, bufs: ReplayBuffers, qsel, weights_out) -> None:
    """One block: ``weights_out`` float32 ``[B]`` from ``qsel`` int64 ``[B]``; writes ``beta``; ``step += 1``."""
    B = int(qsel.shape[0])
    _need("qsel", qsel, (B,), np.int64)
    _need("weights_out", weights_out, (B,), np.float32)
    launch(
        "replay",
        "sample_weights",
        1,
        _ONE_BLOCK,
        (qsel, weights_out, bufs.step, bufs.beta, B, float(spec.beta0), float(spec.beta_final), int(spec.beta_steps)),
    )


def sample(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, weights_out, qsel_out) -> None:
    """Stratified proportional sample of ``B = len(indices_out)`` rows; see ``reference.replay.sample``.

    Writes ``indices_out`` int32 ``[B]``, ``weights_out`` float32 ``[B]``, ``qsel_out`` int64 ``[B]``,
    then ``beta`` and ``step += 1``. 2 launches: a warp per sample, then one block for the weights.
    """
    sample_search(spec, bufs, indices_out, qsel_out)
    sample_weights(spec, bufs, qsel_out, weights_out)


def _gather_args(
    spec: ReplaySpec, bufs: ReplayBuffers, B: int, obs_out, next_obs_out, action_out, return_out, discount_out
) -> tuple[tuple, tuple]:
    """The gather's checked (sources, outputs) and (shape constants): shared by both gathering launches."""
    D = spec.obs_dim
    _need("obs_out", obs_out, (B, D), np.float32)
    _need("next_obs_out", next_obs_out, (B, D), np.float32)
    _need("action_out", action_out, (B,), np.int32)
    _need("return_out", return_out, (B,), np.float32)
    _need("discount_out", discount_out, (B,), np.float32)
    if spec.store_next_obs:
        _need("bufs.next_obs", bufs.next_obs, (spec.capacity, spec.obs_dim), np.float32)
    s_next = bufs.next_obs if spec.store_next_obs else bufs.obs
    sources = (bufs.obs, bufs.action, bufs.reward, bufs.discount, s_next)
    outputs = (obs_out, next_obs_out, action_out, return_out, discount_out)
    return sources + outputs, (D, spec.capacity, spec.n_envs, spec.n_step, spec.lag)


def gather(
    spec: ReplaySpec, bufs: ReplayBuffers, indices, obs_out, next_obs_out, action_out, return_out, discount_out
) -> None:
    """Gather sampled rows, bootstrap rows and n-step targets; see ``reference.replay.gather``. 1 launch.

    The bootstrap row is row ``(s + lag) mod C`` of the ring ``obs`` (``lag = nE``), or of the
    stored ``next_obs`` ring (``lag = 0``) with ``store_next_obs``."""
    B = int(indices.shape[0])
    _need("indices", indices, (B,), np.int32)
    arrays, shape = _gather_args(spec, bufs, B, obs_out, next_obs_out, action_out, return_out, discount_out)
    launch(
        "replay",
        "gather",
        blocks_for(B * spec.obs_dim),
        256,
        arrays[:5] + (indices,) + arrays[5:] + (bufs.status, B) + shape,
    )


def _sample_args(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, qsel_out, *gather_out) -> tuple[int, tuple]:
    """B and the checked arguments the search-and-gather kernels begin with: the search's, then the
    gather's sources, outputs (``gather_out``: obs, next_obs, action, return, discount) and shape
    constants (``cuda_src/replay.cu``: the windows kernel takes its own after them)."""
    B, search = _search_args(spec, bufs, indices_out, qsel_out)
    arrays, shape = _gather_args(spec, bufs, B, *gather_out)
    return B, search + arrays + shape


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
    """:func:`sample_search` and :func:`gather` of the rows found, in one launch (a warp per sample
    finds its row and copies it): the same writes as the two launches. 1 launch."""
    B, args = _sample_args(
        spec, bufs, indices_out, qsel_out, obs_out, next_obs_out, action_out, return_out, discount_out
    )
    threads = 32 * _WARPS_PER_BLOCK
    launch("replay", "sample_search_gather", blocks_for(32 * B, threads), threads, args)


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
    """:func:`sample_search_gather` of state rows (``spec.obs_dim`` = STATE_DIM), and the observation
    windows of the rows gathered, ``obs_win``/``next_win`` float32 ``[B, window * (F + 2)]`` from
    ``features [T, F]`` and ``sign [F]`` (``window.gather``'s bits), in one launch."""
    B, args = _sample_args(
        spec, bufs, indices_out, qsel_out, obs_out, next_obs_out, action_out, return_out, discount_out
    )
    if spec.obs_dim != STATE_DIM:
        raise ValueError(
            f"the replay holds rows of {spec.obs_dim} floats; windows are gathered from state rows of {STATE_DIM}"
        )
    if features.ndim != 2 or int(window) < 1:
        raise ValueError(f"features: expected float32 [T, F] and window >= 1, got {list(features.shape)}, {window}")
    t_n, f_n = features.shape
    W = width(f_n, int(window))
    _need("features", features, (t_n, f_n), np.float32)
    _need("sign", sign, (f_n,), np.float32)
    _need("obs_win", obs_win, (B, W), np.float32)
    _need("next_win", next_win, (B, W), np.float32)
    threads = 32 * _WARPS_PER_BLOCK
    launch(
        "replay",
        "sample_search_gather_windows",
        blocks_for(32 * B, threads),
        threads,
        args + (features, sign, obs_win, next_win, int(window), f_n, t_n),
    )


def update_priorities(spec: ReplaySpec, bufs: ReplayBuffers, indices, td) -> None:
    """Set priorities from TD errors; see ``reference.replay.update_priorities``. 1 launch (one block)."""
    B = int(indices.shape[0])
    _need("indices", indices, (B,), np.int32)
    _need("td", td, (B,), np.float32)
    launch(
        "replay",
        "update_priorities",
        1,
        _ONE_BLOCK,
        (
            indices,
            td,
            bufs.tree,
            bufs.levels,
            bufs.owner,
            bufs.max_q,
            bufs.status,
            B,
            spec.capacity,
            _depth(bufs),
            float(spec.alpha),
            float(spec.eps),
        ),
    )


def tree_level(tree, src_off: int, dst_off: int, n_dst: int) -> None:
    """``tree[dst_off + p] = sum of the 32 children at src_off + 32p`` for ``p < n_dst``. A thread per node."""
    if tree.dtype != np.int64 or tree.ndim != 1:
        raise ValueError(f"tree: expected int64 [nodes], got {tree.dtype} {tuple(tree.shape)}")
    launch(
        "replay",
        "tree_level",
        blocks_for(n_dst),
        256,
        (tree, int(src_off), int(dst_off), int(n_dst)),
    )


def build_tree(spec: ReplaySpec, bufs: ReplayBuffers) -> None:
    """Rebuild the internal nodes from the leaves, bottom up: one launch per level."""
    layout = tree_layout(spec.capacity)
    for (src_off, src_n), (dst_off, _) in zip(layout[:-1], layout[1:], strict=False):
        tree_level(bufs.tree, src_off, dst_off, src_n // 32)
