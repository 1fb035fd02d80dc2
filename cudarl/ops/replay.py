"""Launchers for ``cuda_src/replay.cu`` (twin: ``cudarl/reference/replay.py``, same op names).

Each launcher checks shapes and dtypes on the host, then launches; it never allocates,
synchronises or reads a device value, so each is capture-safe. Values that only the device
can see (NaN ``td`` produced inside a graph, non-finite rows from an environment kernel) are
handled by the kernels' documented rules and status bits (see the reference's docstring).

The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 5): every
launcher also takes buffers with a leading axis of ``P`` members (:class:`ReplayBuffers` whose ``tree`` is
``[P, nodes]``: rows ``[P, C, D]`` and ``[P, C]``, ``flag [P, FLAG_WORDS]``, device scalars ``[P]``,
``levels`` shared) and its batch arrays as ``[P, B, ...]``. Each family of arrays (the ring's state rows,
its per-slot arrays, the tree, a batch's rows, its vectors, the windows) shares one member stride (each
member's row C-contiguous); one launch whose ``blockIdx.y`` is the member gets each member the bits of a
single launch on its rows. Buffers without the axis are the single launch (``gridDim.y`` 1, strides 0).
The by-value constants (``spec``: alpha, eps, the beta schedule, stream_id, the shapes) are one value for
every member (``sample_weights_members`` and ``update_priorities_members`` take each member's beta schedule,
alpha and eps as ``[P]`` arrays instead); the Philox keys are ``bufs.seed``, a member's own.
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.replay import FLAG_WORDS, ReplayBuffers, ReplaySpec, check_next_obs_arg, tree_layout
from ..reference.window import STATE_DIM, width

_ONE_BLOCK = 1024
_WARPS_PER_BLOCK = 8
_MAX_MEMBERS = 65535  # gridDim.y's limit


def _need(name: str, a, shape: tuple, dtype) -> None:
    if tuple(a.shape) != tuple(shape) or a.dtype != np.dtype(dtype):
        raise ValueError(f"{name}: expected {np.dtype(dtype)} {tuple(shape)}, got {a.dtype} {tuple(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: must be C-contiguous")


def _depth(bufs: ReplayBuffers) -> int:
    return int(bufs.levels.shape[0]) - 1


def _members(bufs: ReplayBuffers) -> int:
    """``P``: 1 for one buffer (no member axis), else the leading axis of ``bufs.tree``."""
    P = bufs.members
    if P is None:
        return 1
    if not 1 <= P <= _MAX_MEMBERS:
        raise ValueError(f"bufs: 1 to {_MAX_MEMBERS} members, got {P}")
    return P


def _family(bufs: ReplayBuffers, **arrays) -> tuple[dict, int]:
    """``(rows, s)`` of a family of arrays that share a member stride: ``arrays`` maps a name to
    ``(array, one member's shape, dtype)``. One buffer: each array that shape, ``rows`` the arrays, ``s`` 0.
    Members: each ``[P, *shape]`` with member 0's row C-contiguous, one stride ``s`` in elements for every
    array, at least a row (members do not overlap); ``rows`` the member-0 rows the kernel offsets."""
    if bufs.members is None:
        for name, (a, shape, dt) in arrays.items():
            _need(name, a, shape, dt)
        return {name: a for name, (a, _, _) in arrays.items()}, 0
    P = _members(bufs)
    rows, strides = {}, set()
    for name, (a, shape, dt) in arrays.items():
        if a.ndim != len(shape) + 1 or a.shape[0] != P:
            raise ValueError(f"{name}: expected the member axis, [{P}, *{tuple(shape)}], got {tuple(a.shape)}")
        _need(f"{name}[0]", a[0], shape, dt)
        strides.add(a.strides[0] / a.itemsize)
        rows[name] = a[0]
    if P == 1:
        return rows, 0
    s = strides.pop()
    size = int(np.prod(next(iter(arrays.values()))[1], dtype=np.int64))
    if strides or s != int(s) or s < size:
        raise ValueError(
            f"{sorted(arrays)}: one member stride of whole elements, at least a member's {size}, got "
            f"{[a.strides for a, _, _ in arrays.values()]}"
        )
    return rows, int(s)


def _scalars(bufs: ReplayBuffers, **dtypes) -> None:
    """Device scalars: ``[1]`` for one buffer, ``[P]`` (one per member) with the member axis."""
    P = _members(bufs)
    for name, dt in dtypes.items():
        a = getattr(bufs, name)
        if tuple(a.shape) != (P,) or a.dtype != np.dtype(dt):
            raise ValueError(f"bufs.{name}: expected {np.dtype(dt)} [{P}], a device scalar per member, got "
                             f"{a.dtype} {tuple(a.shape)}")  # fmt: skip


def _flag(bufs: ReplayBuffers):
    """``bufs.flag``: ``[FLAG_WORDS]``, or C-contiguous ``[P, FLAG_WORDS]`` (the kernels step by FLAG_WORDS)."""
    if bufs.members is None:
        _need("bufs.flag", bufs.flag, (FLAG_WORDS,), np.int64)
        return bufs.flag
    _need("bufs.flag", bufs.flag, (_members(bufs), FLAG_WORDS), np.int64)
    return bufs.flag


def _tree(bufs: ReplayBuffers) -> tuple:
    """``(tree, st)``: the tree (member 0's with the axis) and its member stride."""
    rows, st = _family(bufs, **{"bufs.tree": (bufs.tree, (int(bufs.tree.shape[-1]),), np.int64)})
    return rows["bufs.tree"], st


def _ring(spec: ReplaySpec, bufs: ReplayBuffers, *names: str) -> tuple[dict, int]:
    """The ring's arrays ``names`` of one family (state rows ``[C, D]`` or per-slot ``[C]``), checked."""
    C, D = spec.capacity, spec.obs_dim
    shapes = {"obs": ((C, D), np.float32), "next_obs": ((C, D), np.float32), "action": ((C,), np.int32),
              "reward": ((C,), np.float32), "discount": ((C,), np.float32), "owner": ((C,), np.int32)}  # fmt: skip
    rows, s = _family(bufs, **{f"bufs.{n}": (getattr(bufs, n), *shapes[n]) for n in names})
    return {n: rows[f"bufs.{n}"] for n in names}, s


def _batch_size(bufs: ReplayBuffers, a) -> int:
    """``B`` of a batch array ``[B, ...]`` (``[P, B, ...]`` with the member axis)."""
    k = 0 if bufs.members is None else 1
    if a.ndim <= k:
        raise ValueError(f"expected a batch array with{'out' if k == 0 else ''} the member axis, got {tuple(a.shape)}")
    return int(a.shape[k])


def _check_rows(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount, next_obs=None) -> tuple:
    """``(B, rows, sx, vectors, sv)`` of an insert's batch: obs (and next_obs) ``[B, D]``, action, reward and
    discount ``[B]`` (each ``[P, ...]`` with the member axis)."""
    B, D, C = _batch_size(bufs, obs), spec.obs_dim, spec.capacity
    if B < 1 or B > C or B % spec.n_envs:
        raise ValueError(f"obs: batch of {B} rows must be in [1, capacity={C}] and a multiple of n_envs={spec.n_envs}")
    xs = {"obs": (obs, (B, D), np.float32)}
    if next_obs is not None:
        xs["next_obs"] = (next_obs, (B, D), np.float32)
    rows, sx = _family(bufs, **xs)
    vectors, sv = _family(
        bufs, action=(action, (B,), np.int32), reward=(reward, (B,), np.float32), discount=(discount, (B,), np.float32)
    )
    return B, rows, sx, vectors, sv


def _check_next(spec: ReplaySpec, bufs: ReplayBuffers) -> None:
    if not spec.store_next_obs:
        raise ValueError("next_obs: this buffer has no next_obs ring (store_next_obs=False)")
    _ring(spec, bufs, "obs", "next_obs")


_CHECK_THREADS, _CHECK_PER_THREAD, _MAX_BLOCKS = 256, 4, 1024


def _check_grid(B: int, D: int) -> int:
    return max(1, min(_MAX_BLOCKS, -(-B * D // (_CHECK_THREADS * _CHECK_PER_THREAD))))


def _insert_check(op: str, spec: ReplaySpec, bufs: ReplayBuffers, obs, next_obs, action, reward, discount) -> None:
    B, rows, sx, v, sv = _check_rows(spec, bufs, obs, action, reward, discount, next_obs)
    _scalars(bufs, status=np.int64)
    x = (rows["obs"],) if next_obs is None else (rows["obs"], rows["next_obs"])
    launch(
        "replay",
        op,
        (_check_grid(B if next_obs is None else 2 * B, spec.obs_dim), _members(bufs)),
        _CHECK_THREADS,
        (*x, v["action"], v["reward"], v["discount"], _flag(bufs), bufs.status, B, spec.obs_dim, sx, sv),
    )


def insert_check(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """Set ``flag[FLAG_REJECT]`` (and ``status``) from the batch's values. A grid; its last block decides."""
    _insert_check("insert_check", spec, bufs, obs, None, action, reward, discount)


def insert_check_next(spec: ReplaySpec, bufs: ReplayBuffers, obs, next_obs, action, reward, discount) -> None:
    """``insert_check`` of a batch with ``next_obs`` (``store_next_obs``): a non-finite ``next_obs`` rejects it too."""
    _check_next(spec, bufs)
    _insert_check("insert_check_next", spec, bufs, obs, next_obs, action, reward, discount)


_COMMIT_THREADS = 1024  # COMMIT_THREADS in replay.cu (its __launch_bounds__)
_COMMIT_WARPS = _COMMIT_THREADS // 32


def commit_grid(spec: ReplaySpec, B: int) -> tuple[int, int]:
    """``(row_blocks, tree_blocks)`` of ``insert_commit``: a warp per batch row, and a warp per
    level-1 node over the most slots an insert of ``B`` rows can set, ``min(B + lag, C)`` (both
    loops are grid-strided, so the caps only bound the grid). A member's; members are ``gridDim.y``."""
    slots = min(B + spec.lag, spec.capacity)
    nodes = min(slots // 32 + 2, -(-spec.capacity // 32))
    return (min(_MAX_BLOCKS, -(-B // _COMMIT_WARPS)), max(1, min(_MAX_BLOCKS, -(-nodes // _COMMIT_WARPS))))


def _commit(op: str, spec: ReplaySpec, bufs: ReplayBuffers, obs, next_obs, action, reward, discount) -> None:
    B, rows, sx, v, sv = _check_rows(spec, bufs, obs, action, reward, discount, next_obs)
    ring = ("obs",) if next_obs is None else ("obs", "next_obs")
    r, sr = _ring(spec, bufs, *ring)
    c, sc = _ring(spec, bufs, "action", "reward", "discount")
    tree, st = _tree(bufs)
    _scalars(bufs, added=np.int64, max_q=np.int64)
    row_blocks, tree_blocks = commit_grid(spec, B)
    launch(
        "replay",
        op,
        (row_blocks + tree_blocks, _members(bufs)),
        _COMMIT_THREADS,
        (
            *(rows[k] for k in ring),
            v["action"],
            v["reward"],
            v["discount"],
            *(r[k] for k in ring),
            c["action"],
            c["reward"],
            c["discount"],
            tree,
            bufs.levels,
            _flag(bufs),
            bufs.added,
            bufs.max_q,
            B,
            spec.obs_dim,
            spec.capacity,
            spec.lag,
            _depth(bufs),
            row_blocks,
            sx,
            sv,
            sr,
            sc,
            st,
        ),
    )


def insert_commit(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """Unless ``flag[FLAG_REJECT]``: the rows at slots ``(added + k) mod C``, the leaves of the
    written and newly ready rows, their ancestors (the grid's last block does levels >= 2), then
    ``added += B``. 1 launch."""
    _commit("insert_commit", spec, bufs, obs, None, action, reward, discount)


def insert_commit_next(spec: ReplaySpec, bufs: ReplayBuffers, obs, next_obs, action, reward, discount) -> None:
    """``insert_commit`` that also writes ``next_obs`` into ``bufs.next_obs`` (``store_next_obs``). 1 launch."""
    _check_next(spec, bufs)
    _commit("insert_commit_next", spec, bufs, obs, next_obs, action, reward, discount)


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


def _search_args(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, qsel_out) -> tuple[int, tuple, tuple]:
    """B, the search's arguments and its strides ``(st, sv)``: shared by every searching launch."""
    B = _batch_size(bufs, indices_out)
    v, sv = _family(bufs, indices_out=(indices_out, (B,), np.int32), qsel_out=(qsel_out, (B,), np.int64))
    tree, st = _tree(bufs)
    _scalars(bufs, step=np.int64, status=np.int64, seed=np.uint64)
    args = (
        tree,
        bufs.levels,
        bufs.step,
        v["indices_out"],
        v["qsel_out"],
        bufs.status,
        B,
        _depth(bufs),
        bufs.seed,
        int(spec.stream_id),
    )
    return B, args, (st, sv)


def sample_search(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, qsel_out) -> None:
    """A warp per sample descends the tree; writes ``indices_out`` int32 ``[B]``, ``qsel_out`` int64 ``[B]``."""
    B, args, strides = _search_args(spec, bufs, indices_out, qsel_out)
    threads = 32 * _WARPS_PER_BLOCK
    launch("replay", "sample_search", (blocks_for(32 * B, threads), _members(bufs)), threads, args + strides)


def sample_weights(spec: ReplaySpec, bufs: ReplayBuffers, qsel, weights_out) -> None:
    """One block: ``weights_out`` float32 ``[B]`` from ``qsel`` int64 ``[B]``; writes ``beta``; ``step += 1``
    (members: a block each)."""
    B = _batch_size(bufs, qsel)
    v, sv = _family(bufs, qsel=(qsel, (B,), np.int64), weights_out=(weights_out, (B,), np.float32))
    _scalars(bufs, step=np.int64, beta=np.float64)
    launch(
        "replay",
        "sample_weights",
        (1, _members(bufs)),
        _ONE_BLOCK,
        (
            v["qsel"],
            v["weights_out"],
            bufs.step,
            bufs.beta,
            B,
            float(spec.beta0),
            float(spec.beta_final),
            int(spec.beta_steps),
            sv,
        ),
    )


def _member_consts(where: str, bufs: ReplayBuffers, **arrs) -> None:
    """Per-member constants (the ``_members`` ops): ``bufs`` with the member axis and each ``(array, dtype)``
    a C-contiguous ``[P]`` array of that dtype (the single kernel's by-value type)."""
    if bufs.members is None:
        raise ValueError(f"{where}: bufs must have the member axis (tree [P, nodes])")
    for name, (a, dt) in arrs.items():
        _need(name, a, (bufs.members,), dt)


def sample_weights_members(
    spec: ReplaySpec, bufs: ReplayBuffers, qsel, weights_out, beta0, beta_final, beta_steps
) -> None:
    """:func:`sample_weights` over P members each with its own beta schedule: ``beta0``, ``beta_final``
    float64 and ``beta_steps`` int64 ``[P]`` (``spec``'s schedule is not read); a block a member."""
    _member_consts("replay.sample_weights_members", bufs, beta0=(beta0, np.float64),
                   beta_final=(beta_final, np.float64), beta_steps=(beta_steps, np.int64))  # fmt: skip
    B = _batch_size(bufs, qsel)
    v, sv = _family(bufs, qsel=(qsel, (B,), np.int64), weights_out=(weights_out, (B,), np.float32))
    _scalars(bufs, step=np.int64, beta=np.float64)
    launch(
        "replay",
        "sample_weights_members",
        (1, _members(bufs)),
        _ONE_BLOCK,
        (v["qsel"], v["weights_out"], bufs.step, bufs.beta, B, beta0, beta_final, beta_steps, sv),
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
) -> tuple[tuple, tuple, dict]:
    """The gather's checked (sources, outputs), (shape constants) and strides ``{sv, sx, sr, sc}``: shared by
    every gathering launch."""
    D = spec.obs_dim
    x, sx = _family(bufs, obs_out=(obs_out, (B, D), np.float32), next_obs_out=(next_obs_out, (B, D), np.float32))
    v, sv = _family(
        bufs,
        action_out=(action_out, (B,), np.int32),
        return_out=(return_out, (B,), np.float32),
        discount_out=(discount_out, (B,), np.float32),
    )
    r, sr = _ring(spec, bufs, "obs", "next_obs") if spec.store_next_obs else _ring(spec, bufs, "obs")
    c, sc = _ring(spec, bufs, "action", "reward", "discount")
    s_next = r["next_obs"] if spec.store_next_obs else r["obs"]
    sources = (r["obs"], c["action"], c["reward"], c["discount"], s_next)
    outputs = (x["obs_out"], x["next_obs_out"], v["action_out"], v["return_out"], v["discount_out"])
    return sources + outputs, (D, spec.capacity, spec.n_envs, spec.n_step, spec.lag), dict(sv=sv, sx=sx, sr=sr, sc=sc)


def gather(
    spec: ReplaySpec, bufs: ReplayBuffers, indices, obs_out, next_obs_out, action_out, return_out, discount_out
) -> None:
    """Gather sampled rows, bootstrap rows and n-step targets; see ``reference.replay.gather``. 1 launch.

    The bootstrap row is row ``(s + lag) mod C`` of the ring ``obs`` (``lag = nE``), or of the
    stored ``next_obs`` ring (``lag = 0``) with ``store_next_obs``."""
    B = _batch_size(bufs, indices)
    arrays, shape, s = _gather_args(spec, bufs, B, obs_out, next_obs_out, action_out, return_out, discount_out)
    ix, s_ix = _family(bufs, indices=(indices, (B,), np.int32))
    if s_ix != s["sv"] and _members(bufs) > 1:
        raise ValueError(f"indices: the member stride of the batch's vectors ({s['sv']}), got {s_ix}")
    _scalars(bufs, status=np.int64)
    launch(
        "replay",
        "gather",
        (blocks_for(B * spec.obs_dim), _members(bufs)),
        256,
        arrays[:5] + (ix["indices"],) + arrays[5:] + (bufs.status, B) + shape + (s["sv"], s["sx"], s["sr"], s["sc"]),
    )


def _sample_args(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, qsel_out, *gather_out) -> tuple[int, tuple]:
    """B and the checked arguments the search-and-gather kernels take: the search's, then the gather's
    sources, outputs (``gather_out``: obs, next_obs, action, return, discount) and shape constants, then the
    strides st, sv, sx, sr, sc (``cuda_src/replay.cu``: the windows kernel takes its own arrays before the
    strides and sw after them)."""
    B, search, (st, sv) = _search_args(spec, bufs, indices_out, qsel_out)
    arrays, shape, s = _gather_args(spec, bufs, B, *gather_out)
    if s["sv"] != sv and _members(bufs) > 1:
        raise ValueError(f"action_out: the member stride of indices_out ({sv}), got {s['sv']}")
    return B, (search + arrays + shape, (st, sv, s["sx"], s["sr"], s["sc"]))


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
    B, (args, strides) = _sample_args(
        spec, bufs, indices_out, qsel_out, obs_out, next_obs_out, action_out, return_out, discount_out
    )
    threads = 32 * _WARPS_PER_BLOCK
    launch("replay", "sample_search_gather", (blocks_for(32 * B, threads), _members(bufs)), threads, args + strides)


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
    ``features [T, F]`` and ``sign [F]`` (``window.gather``'s bits), in one launch. Members: the windows
    ``[P, B, width]`` (one member stride, e.g. the halves of a ``[P, 2B, width]`` pair); one feature
    matrix for all."""
    B, (args, strides) = _sample_args(
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
    w, sw = _family(bufs, obs_win=(obs_win, (B, W), np.float32), next_win=(next_win, (B, W), np.float32))
    threads = 32 * _WARPS_PER_BLOCK
    wps = window_warps(W)
    launch(
        "replay",
        "sample_search_gather_windows",
        (blocks_for(32 * wps * B, threads), _members(bufs)),
        threads,
        args + (features, sign, w["obs_win"], w["next_win"], int(window), f_n, t_n) + strides + (sw, wps),
    )


def window_warps(width: int) -> int:
    """Warps that write one sample's two windows of ``width`` floats in ``sample_search_gather_windows``: a
    power of two up to ``_WARPS_PER_BLOCK``, about one warp per 512 floats (1 for the one-bar window of the
    MLP, where more warps would only add blocks; 8 at window 64)."""
    want = -(-int(width) // 512)
    wps = 1
    while wps < min(want, _WARPS_PER_BLOCK):
        wps *= 2
    return wps


def update_priorities(spec: ReplaySpec, bufs: ReplayBuffers, indices, td) -> None:
    """Set priorities from TD errors; see ``reference.replay.update_priorities``. 1 launch (one block;
    members: a block each)."""
    B = _batch_size(bufs, indices)
    v, sv = _family(bufs, indices=(indices, (B,), np.int32), td=(td, (B,), np.float32))
    tree, st = _tree(bufs)
    o, sc = _ring(spec, bufs, "owner")
    _scalars(bufs, max_q=np.int64, status=np.int64)
    launch(
        "replay",
        "update_priorities",
        (1, _members(bufs)),
        _ONE_BLOCK,
        (
            v["indices"],
            v["td"],
            tree,
            bufs.levels,
            o["owner"],
            bufs.max_q,
            bufs.status,
            B,
            spec.capacity,
            _depth(bufs),
            float(spec.alpha),
            float(spec.eps),
            sv,
            st,
            sc,
        ),
    )


def update_priorities_members(spec: ReplaySpec, bufs: ReplayBuffers, indices, td, alpha, eps) -> None:
    """:func:`update_priorities` over P members each with its own ``alpha`` and ``eps`` (float64 ``[P]``;
    ``spec``'s are not read); a block a member."""
    _member_consts("replay.update_priorities_members", bufs, alpha=(alpha, np.float64), eps=(eps, np.float64))
    B = _batch_size(bufs, indices)
    v, sv = _family(bufs, indices=(indices, (B,), np.int32), td=(td, (B,), np.float32))
    tree, st = _tree(bufs)
    o, sc = _ring(spec, bufs, "owner")
    _scalars(bufs, max_q=np.int64, status=np.int64)
    launch(
        "replay",
        "update_priorities_members",
        (1, _members(bufs)),
        _ONE_BLOCK,
        (v["indices"], v["td"], tree, bufs.levels, o["owner"], bufs.max_q, bufs.status, B, spec.capacity,
         _depth(bufs), alpha, eps, sv, st, sc),
    )  # fmt: skip


def tree_level(tree, src_off: int, dst_off: int, n_dst: int) -> None:
    """``tree[dst_off + p] = sum of the 32 children at src_off + 32p`` for ``p < n_dst``. A thread per node
    (members: ``tree [P, nodes]``, rows one stride apart, C-contiguous each)."""
    if tree.dtype != np.int64 or tree.ndim not in (1, 2) or not tree[(0,) * (tree.ndim - 1)].flags.c_contiguous:
        raise ValueError(f"tree: expected int64 [nodes] (or [P, nodes]), got {tree.dtype} {tuple(tree.shape)}")
    P, st = (1, 0) if tree.ndim == 1 else (int(tree.shape[0]), int(tree.strides[0] // tree.itemsize))
    if tree.ndim == 2 and (not 1 <= P <= _MAX_MEMBERS or (P > 1 and st < tree.shape[1])):
        raise ValueError(f"tree: 1 to {_MAX_MEMBERS} members that do not overlap, got {tree.shape} {tree.strides}")
    launch(
        "replay",
        "tree_level",
        (blocks_for(n_dst), P),
        256,
        (tree if tree.ndim == 1 else tree[0], int(src_off), int(dst_off), int(n_dst), 0 if P == 1 else st),
    )


def build_tree(spec: ReplaySpec, bufs: ReplayBuffers) -> None:
    """Rebuild the internal nodes from the leaves, bottom up: one launch per level (members: each launch
    every member's level)."""
    layout = tree_layout(spec.capacity)
    for (src_off, src_n), (dst_off, _) in zip(layout[:-1], layout[1:], strict=False):
        tree_level(bufs.tree, src_off, dst_off, src_n // 32)
