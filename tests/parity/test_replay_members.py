"""The replay's member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 5):
each op of ``cuda_src/replay.cu`` over P members' stacked buffers, in one launch, gives member ``i`` the
bits of the single op on member ``i``'s buffers and batch; and a :class:`StackedPrioritizedReplay` over P
members is P single :class:`PrioritizedReplay` (member ``i`` with ``seed=seeds[i]``), bit for bit.

CPU: the twins (they loop over members, so this holds by construction; the test keeps it so), the
objects on NumPy, draws that do not depend on P or the member's index, and the launchers' arguments
and refusals. GPU: each kernel at P = 1, 3, 64 against single launches on copies (bitwise) and against
the twin, the objects against P single ones, and a captured stacked step against the eager one.
Members hold distinct rows, priorities and seeds, so a member read from another's slice fails.
"""

import numpy as np
import pytest

from cudarl.backend import to_numpy
from cudarl.ops.replay import window_warps
from cudarl.reference import replay as ref
from cudarl.replay import Batch, PrioritizedReplay
from cudarl.stacked_replay import StackedPrioritizedReplay
from cudarl.testing import assert_bitwise, assert_launch_args, assert_parity, poison

T_N, F_N, WINDOW = 60, 3, 4  # the shared feature matrix of the windows: bars, features, window
ROW, PAIR = "row", "pair"  # an argument with the member axis ([P, ...], row i), or a [P, 2B, W] pair's halves


def _state_rows(rng, shape) -> np.ndarray:
    """Valid state rows ``[*shape, 4]`` (bar, mirror 0/1, position, hold fraction), bars near 0 too."""
    rows = np.zeros((*shape, 4), np.float32)
    rows[..., 0] = np.where(rng.random(shape) < 0.3, rng.integers(0, 3, shape), rng.integers(0, T_N, shape))
    rows[..., 1] = rng.random(shape) < 0.5
    rows[..., 2] = rng.choice(np.array([-1, 0, 1], np.float32), shape)
    rows[..., 3] = rng.random(shape)
    return rows


def _batch(rng, P: int, B: int, store_next: bool) -> dict:
    """A batch of B rows for each of P members, values drawn apart (an episode end here and there)."""
    d = np.full((P, B), 0.9, np.float32)
    d[rng.random((P, B)) < 0.05] = 0.0
    out = dict(
        obs=_state_rows(rng, (P, B)),
        action=rng.integers(0, 3, (P, B)).astype(np.int32),
        reward=(rng.standard_normal((P, B)) * rng.uniform(0.5, 2.0, (P, 1))).astype(np.float32),
        discount=d,
    )
    if store_next:
        out["next_obs"] = _state_rows(rng, (P, B))
    return out


def _member_priorities(P: int) -> dict:
    """P members' own alpha, eps and beta schedule (every value distinct)."""
    return {
        "alpha": [0.7 - 0.1 * i / P for i in range(P)],
        "eps": [1e-3 * (1 + i) for i in range(P)],
        "beta0": [0.3 + 0.2 * i / P for i in range(P)],
        "beta_final": [1.0 - 0.1 * i / P for i in range(P)],
        "beta_steps": [5 + 2 * i for i in range(P)],
    }


def _objects(xp, backend, rng, P, C, n, E, store_next, fill, seeds=None, own=False, swap=None):
    """A stacked replay of P members and P single replays (member ``i``'s seed), fed the same rows: each
    member's own ``fill`` rows (in three adds), then one round of sample and priority updates, so the
    members' rows, priorities, counters and seeds all differ. ``own``: each member its own alpha, eps, beta
    schedule (:func:`_member_priorities`) and an initial priority of 2 (so its first leaves depend on its
    alpha), single ``i`` member ``i``'s (``swap``: two members' values traded in the stacked replay only).
    Returns ``(stacked, singles)``."""
    seeds = rng.integers(0, 1 << 62, P) if seeds is None else np.asarray(seeds)
    kw = dict(n_step=n, n_envs=E, store_next_obs=store_next, beta_steps=7, backend=backend)
    if not own:
        stacked = StackedPrioritizedReplay(P, C, 4, seeds=seeds, **kw)
        singles = [PrioritizedReplay(C, 4, seed=int(s), **kw) for s in seeds]
    else:
        values = _member_priorities(P)
        order = list(range(P))
        if swap is not None:
            order[swap[0]], order[swap[1]] = order[swap[1]], order[swap[0]]
        kw["initial_priority"] = 2.0
        stacked = StackedPrioritizedReplay(
            P, C, 4, seeds=seeds, **{**kw, **{k: [v[j] for j in order] for k, v in values.items()}}
        )
        singles = [
            PrioritizedReplay(C, 4, seed=int(s), **{**kw, **{k: v[i] for k, v in values.items()}})
            for i, s in enumerate(seeds)
        ]
    per = max(E, (fill // 3) // E * E)
    for _ in range(3):
        _add(xp, stacked, singles, _batch(rng, P, per, store_next))
    B = min(16, int(stacked.ready().min()))
    idx, _ = stacked.sample(B)
    td = rng.standard_normal((P, B)).astype(np.float32) * 3
    stacked.update_priorities(idx, xp.asarray(td))
    for i, r in enumerate(singles):
        r.sample(B)
        r.update_priorities(r._batches[B][0], xp.asarray(td[i]))
    return stacked, singles


def _add(xp, stacked, singles, batch: dict) -> None:
    keys = ("obs", "action", "reward", "discount")
    kw = {"next_obs": xp.asarray(batch["next_obs"])} if "next_obs" in batch else {}
    stacked.add(*(xp.asarray(batch[k]) for k in keys), **kw)
    for i, r in enumerate(singles):
        one = {"next_obs": xp.asarray(batch["next_obs"][i])} if kw else {}
        r.add(*(xp.asarray(batch[k][i]) for k in keys), **one)


def _copy(xp, bufs: ref.ReplayBuffers) -> ref.ReplayBuffers:
    """A deep copy of one member's (or a whole stacked) buffers."""
    return ref.ReplayBuffers(**{k: None if v is None else xp.array(v, copy=True) for k, v in vars(bufs).items()})


def _cases(xp, rng, spec, P: int, B: int, features, sign) -> list:
    """(op, arguments after ``spec, bufs``) of every op with a member axis; an argument is (ROW, array
    ``[P, ...]``), (PAIR, array ``[P, 2B, W]``: its halves) or a constant. Indices and priorities are
    drawn apart per member: duplicates (the last occurrence wins), a NaN td, an index out of range and a
    rejected batch land in some members only."""
    C, W = spec.capacity, (F_N + 2) * WINDOW
    i32, i64, f32 = np.int32, np.int64, np.float32

    def out(*shape, dtype=f32):
        a = xp.zeros((P, *shape), dtype)
        if xp is not np:
            poison(a)
        return (ROW, a)

    idx = rng.integers(0, C, (P, B)).astype(i32)
    idx[:, : B // 4] = idx[:, B // 4 : B // 2]  # duplicates
    td = (rng.standard_normal((P, B)) * rng.pareto(1.0, (P, B))).astype(f32)
    td[P // 2, -1] = np.nan  # one member's non-finite td (a last occurrence): left unchanged, its status bit
    bad_idx = idx.copy()
    bad_idx[-1, -1] = C + 5  # the last member's out-of-range index: a zero row and its status bit
    qsel = rng.integers(1, 1 << 30, (P, B)).astype(i64)
    batch = _batch(rng, P, spec.n_envs * max(1, B // spec.n_envs), spec.store_next_obs)
    batch["reward"][min(1, P - 1), 0] = np.inf  # one member's batch is rejected whole
    rows = [(ROW, xp.asarray(batch[k])) for k in ("obs", "action", "reward", "discount")]
    check = rows  # insert_check_next takes next_obs after obs, insert last
    if spec.store_next_obs:
        check = [rows[0], (ROW, xp.asarray(batch["next_obs"])), *rows[1:]]
        rows = [*rows, check[1]]
    gather_out = [out(B, 4), out(B, 4), out(B, dtype=i32), out(B), out(B)]
    pair = xp.zeros((P, 2 * B, W), f32)
    if xp is not np:
        poison(pair)
    return [
        ("insert_check_next" if spec.store_next_obs else "insert_check", check),
        ("insert", rows),
        ("sample_search", [out(B, dtype=i32), out(B, dtype=i64)]),
        ("sample_weights", [(ROW, xp.asarray(qsel)), out(B)]),
        ("sample", [out(B, dtype=i32), out(B), out(B, dtype=i64)]),
        ("gather", [(ROW, xp.asarray(bad_idx)), *gather_out]),
        ("sample_search_gather", [out(B, dtype=i32), out(B, dtype=i64), *gather_out]),
        (
            "sample_search_gather_windows",
            [out(B, dtype=i32), out(B, dtype=i64), *gather_out, features, sign, WINDOW, (PAIR, pair)],
        ),
        ("update_priorities", [(ROW, xp.asarray(idx)), (ROW, xp.asarray(td))]),
        ("build_tree", []),
    ]


def _stacked_args(spec: list) -> tuple:
    out = []
    for a in spec:
        if isinstance(a, tuple) and a[0] == PAIR:
            B = a[1].shape[1] // 2
            out += [a[1][:, :B], a[1][:, B:]]
        else:
            out.append(a[1] if isinstance(a, tuple) else a)
    return tuple(out)


def _member_args(xp, spec: list, i: int) -> tuple[tuple, list]:
    """Copies of member ``i``'s batch arrays in the single op's form, and ``[(stacked, copy)]`` to compare."""
    args, pairs = [], []
    for a in spec:
        if not isinstance(a, tuple):
            args.append(a)
            continue
        c = xp.array(a[1][i], copy=True)
        pairs.append((a[1], c))
        if a[0] == PAIR:
            B = c.shape[0] // 2
            args += [c[:B], c[B:]]
        else:
            args.append(c)
    return tuple(args), pairs


def _member_axis_is_single_ops(xp, mod, stacked, rng, sync=lambda: None) -> dict:
    """Each op of :func:`_cases` once over the stacked buffers against the single op of ``mod`` on copies of
    each member's buffers and batch taken before: every buffer and batch array, bitwise. Ops run in the
    list's order on the stacked buffers (each sees the state the ops before it left). Returns ``{op:
    (stacked buffers before, batch arrays before, buffers after, batch arrays after)}`` as NumPy."""
    spec, bufs, P = stacked.spec, stacked.bufs, stacked.members
    feats = xp.asarray(rng.standard_normal((T_N, F_N)).astype(np.float32))
    sign = xp.asarray(np.where(rng.random(F_N) < 0.5, -1, 1).astype(np.float32))
    B = min(13, int(stacked.ready().min()))
    out = {}
    for op, args in _cases(xp, rng, spec, P, B, feats, sign):
        if op == "build_tree":  # internal nodes poisoned: the rebuild writes each from the leaves
            bufs.tree[:, spec.capacity :] = -7
        singles = [(_copy(xp, bufs.member(i)), *_member_args(xp, args, i)) for i in range(P)]
        before = (_numpy_bufs(bufs), [to_numpy(a[1]).copy() for a in args if isinstance(a, tuple)])
        getattr(mod, op)(spec, bufs, *_stacked_args(args))
        for one, margs, _ in singles:
            getattr(mod, op)(spec, one, *margs)
        sync()
        for i, (one, _, pairs) in enumerate(singles):
            for k, v in vars(bufs.member(i)).items():
                if v is not None:
                    assert_bitwise(v, getattr(one, k), what=f"{op}: member {i} of {P}, bufs.{k}")
            for n, (a, c) in enumerate(pairs):
                assert_bitwise(a[i], c, what=f"{op}: member {i} of {P}, argument {n}")
        after = (_numpy_bufs(bufs), [to_numpy(a[1]).copy() for a in args if isinstance(a, tuple)])
        out[op] = (before, after, args, feats, sign)
    return out


def _numpy_bufs(bufs):
    return ref.ReplayBuffers(**{k: None if v is None else to_numpy(v).copy() for k, v in vars(bufs).items()})


# --- CPU: the twins ------------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("C, n, E, store_next", [(300, 3, 4, False), (97, 1, 1, True), (1025, 3, 8, False)])
def test_twins_member_axis_is_single_calls(rng, P, C, n, E, store_next):
    stacked, _ = _objects(np, "numpy", rng, P, C, n, E, store_next, fill=C + 40)
    out = _member_axis_is_single_ops(np, ref, stacked, rng)
    status = out["update_priorities"][1][0].status
    assert status[P // 2] & ref.STATUS_BAD_TD and (P == 1 or not status[0 if P // 2 else 1] & ref.STATUS_BAD_TD)
    assert out["gather"][1][0].status[-1] & ref.STATUS_BAD_INDEX
    flag = out["insert"][1][0].flag[:, ref.FLAG_REJECT]
    assert flag[min(1, P - 1)] == 1 and (P == 1 or flag[0] == 0), "one member's batch rejected, the others' not"


def test_members_hold_distinct_rows_and_draws(rng):
    """The fixture's members differ (rows, priorities, seeds), so a member read from another's slice fails;
    two members with one seed and one history draw the same rows."""
    s, _ = _objects(np, "numpy", rng, 3, 300, 3, 4, False, fill=300)
    assert not np.array_equal(s.bufs.obs[0], s.bufs.obs[1]) and not np.array_equal(s.bufs.tree[0], s.bufs.tree[1])
    idx, _ = s.sample(16)
    assert not np.array_equal(idx[0], idx[1]) and not np.array_equal(idx[1], idx[2])
    same = StackedPrioritizedReplay(2, 100, 4, n_step=1, seeds=[5, 5], backend="numpy")
    b = _batch(rng, 1, 80, False)
    same.add(*(np.repeat(b[k], 2, axis=0) for k in ("obs", "action", "reward", "discount")))
    idx, w = same.sample(16)
    assert_bitwise(idx[0], idx[1])
    assert_bitwise(w[0], w[1])


# --- CPU: the objects -----------------------------------------------------------------------------------
def _stream_equals_singles(
    xp, backend, rng, P, C, n, E, store_next, steps, seeds=None, sync=lambda: None, own=False, swap=None
):
    """``steps`` rounds of add, sample with windows (search, gather and windows in one launch; weights) and
    priority updates on a stacked replay and on P single ones: every output and buffer bitwise (``own``,
    ``swap``: :func:`_objects`'s)."""
    from cudarl.window import Windows

    stacked, singles = _objects(xp, backend, rng, P, C, n, E, store_next, fill=C // 2, seeds=seeds, own=own, swap=swap)
    win = Windows(
        xp.asarray(rng.standard_normal((T_N, F_N)).astype(np.float32)),
        xp.asarray(np.where(rng.random(F_N) < 0.5, -1, 1).astype(np.float32)),
        WINDOW,
        xp,
    )
    B = 24
    for step in range(steps):
        _add(xp, stacked, singles, _batch(rng, P, E * int(rng.integers(1, 40 // E + 2)), store_next))
        out = Batch(*(xp.zeros((P, *a.shape), a.dtype) for a in _one_batch(xp, B)))
        pair = xp.zeros((P, 2 * B, win.width), np.float32)
        idx, w = stacked.sample(B, out=out, windows=win, windows_out=pair)
        td = (rng.standard_normal((P, B)) * rng.pareto(1.0, (P, B))).astype(np.float32)
        stacked.update_priorities(idx, xp.asarray(td), device_rules=True)
        for i, r in enumerate(singles):
            one, pair1 = Batch(*_one_batch(xp, B)), xp.zeros((2 * B, win.width), np.float32)
            i1, w1 = r.sample(B, out=one, windows=win, windows_out=pair1)
            r.update_priorities(i1, xp.asarray(td[i]), device_rules=True)
            sync()
            what = f"step {step}, member {i} of {P}"
            assert_bitwise(idx[i], i1, what=f"{what}: indices")
            assert_bitwise(w[i], w1, what=f"{what}: weights")
            assert_bitwise(pair[i], pair1, what=f"{what}: windows")
            for name, x, y in zip(Batch._fields, out, one, strict=True):
                assert_bitwise(x[i], y, what=f"{what}: {name}")
    sync()
    for i, r in enumerate(singles):
        for k, v in vars(r.bufs).items():
            if v is not None and k != "levels":
                assert_bitwise(getattr(stacked.bufs.member(i), k), v, what=f"member {i} of {P}: bufs.{k}")
    assert np.array_equal(stacked.added(), [r.added() for r in singles])
    return stacked, singles


def _one_batch(xp, B):
    return (xp.zeros((B, 4), np.float32), xp.zeros((B, 4), np.float32), xp.zeros(B, np.int32),
            xp.zeros(B, np.float32), xp.zeros(B, np.float32))  # fmt: skip


@pytest.mark.parametrize("P, store_next", [(1, False), (3, False), (3, True)])
def test_stacked_replay_is_p_single_replays(rng, P, store_next):
    _stream_equals_singles(np, "numpy", rng, P, 500, 1 if store_next else 3, 4, store_next, steps=6)


@pytest.mark.parametrize("P, store_next", [(1, False), (3, False), (3, True)])
def test_stacked_replay_members_with_their_own_alpha_and_beta_are_single_replays(rng, P, store_next):
    """Each member its own alpha, eps and beta schedule (``[P]`` device arrays read by sample_weights_members
    and update_priorities_members): member i is the single replay of its values, bit for bit (weights,
    trees, beta, running maximum); two members' values swapped fail."""
    stacked, singles = _stream_equals_singles(
        np, "numpy", rng, P, 500, 1 if store_next else 3, 4, store_next, steps=6, own=True
    )
    assert [stacked.member_spec(i).alpha for i in range(P)] == _member_priorities(P)["alpha"]
    assert len(set(stacked.bufs.beta.tolist())) == P
    if P > 1:
        with pytest.raises(AssertionError, match="member (0|2) of 3"):
            _stream_equals_singles(np, "numpy", rng, P, 500, 3, 4, False, steps=6, own=True, swap=(0, 2))
    with pytest.raises(ValueError, match="alpha: one value or 3"):
        StackedPrioritizedReplay(3, 100, 4, n_step=1, seeds=[1, 2, 3], alpha=[0.5, 0.6], backend="numpy")
    with pytest.raises(ValueError, match=r"beta0: expected a finite number in \[0.0, 1.0\]"):
        StackedPrioritizedReplay(2, 100, 4, n_step=1, seeds=[1, 2], beta0=[0.5, 1.5], backend="numpy")


def test_a_members_draws_do_not_depend_on_p_or_its_index(rng):
    """Member ``i`` equals the replay alone with its seed, wherever it stands: a seed at index 2 of 3 and
    the same seed alone (P = 1) give the same stream (each compared with its single replay)."""
    seeds = [int(s) for s in rng.integers(0, 1 << 62, 3)]
    s3, singles3 = _stream_equals_singles(np, "numpy", np.random.default_rng(9), 3, 400, 3, 4, False, 4, seeds)
    s1, singles1 = _stream_equals_singles(np, "numpy", np.random.default_rng(9), 1, 400, 3, 4, False, 4, seeds[2:])
    assert s3.seeds[2] == s1.seeds[0] and s3.member_spec(2).seed == seeds[2]


def test_stacked_replay_refuses_what_it_cannot_be():
    with pytest.raises(ValueError, match="seeds: expected 3"):
        StackedPrioritizedReplay(3, 100, 4, n_step=1, seeds=[1, 2], backend="numpy")
    with pytest.raises(ValueError, match="seeds, one per member"):
        StackedPrioritizedReplay(2, 100, 4, n_step=1, seeds=[1, 2], seed=3, backend="numpy")
    with pytest.raises(ValueError, match="members"):
        StackedPrioritizedReplay(0, 100, 4, n_step=1, seeds=[], backend="numpy")
    r = StackedPrioritizedReplay(2, 100, 4, n_step=1, seeds=[1, 2], backend="numpy")
    with pytest.raises(ValueError, match=r"obs: expected a float32 array \[P, B, 4\]"):
        r.add(np.zeros((8, 4), np.float32), np.zeros(8, np.int32), np.zeros(8, np.float32), np.zeros(8, np.float32))
    with pytest.raises(ValueError, match=r"indices: expected an int32 array \[P, B\]"):
        r.update_priorities(np.zeros(4, np.int32), np.zeros(4, np.float32))
    assert r.state_dict()["added"].shape == (2,)  # checkpoints per member: tests/parity/test_state_members.py


# --- CPU: the launchers ----------------------------------------------------------------------------------
def _single_args(spec: list) -> tuple:
    """:func:`_cases`' arguments of one member without the member axis (member 0's rows)."""
    out = []
    for a in spec:
        if isinstance(a, tuple) and a[0] == PAIR:
            B = a[1].shape[1] // 2
            out += [a[1][0, :B], a[1][0, B:]]
        else:
            out.append(a[1][0] if isinstance(a, tuple) else a)
    return tuple(out)


def _recorded(monkeypatch, spec, bufs, P, rng, single=False) -> dict:
    """``{op: (grid, args)}`` the launchers build for every op of :func:`_cases` (recorded, not launched):
    with the member axis, or (``single``) one buffer's single forms."""
    from cudarl.ops import replay as ops

    launched = {}
    monkeypatch.setattr(ops, "launch", lambda family, op, grid, block, args: launched.setdefault(op, (grid, args)))
    feats = rng.standard_normal((T_N, F_N)).astype(np.float32)
    sign = np.ones(F_N, np.float32)
    for op, args in _cases(np, rng, spec, P, 9, feats, sign):
        getattr(ops, op)(spec, bufs, *(_single_args(args) if single else _stacked_args(args)))
    return launched


@pytest.mark.parametrize("store_next", [False, True])
def test_launchers_pass_the_member_axis_and_strides(monkeypatch, rng, store_next):
    """CPU: with the member axis each launcher's arguments are what cuda_src/replay.cu declares, its grid's
    y the members, and the strides each family's (the windows: the halves of a [P, 2B, W] pair); one member
    without the axis is the single launch (grid y 1, every stride 0)."""
    P, C, B, W = 3, 200, 9, (F_N + 2) * WINDOW
    stacked, singles = _objects(np, "numpy", rng, P, C, 1 if store_next else 3, 1, store_next, fill=150)
    launched = _recorded(monkeypatch, stacked.spec, stacked.bufs, P, rng)
    assert {"insert_check", "insert_commit", "gather", "sample_search_gather_windows", "tree_level"} <= {
        op.removesuffix("_next") for op in launched
    }
    nodes = ref.tree_nodes(C)
    for op, (grid, args) in launched.items():
        assert_launch_args("replay", op, args)
        assert grid[1] == P, op
    *_, st, sv, sx, sr, sc, sw, wps = launched["sample_search_gather_windows"][1]
    assert (st, sv, sx, sr, sc, sw) == (nodes, B, B * 4, C * 4, C, 2 * B * W)
    assert wps == window_warps(W)  # the warps a sample's windows take (1 at this small window)
    assert launched["update_priorities"][1][-3:] == (B, nodes, C)
    one = _recorded(monkeypatch, singles[0].spec, singles[0].bufs, 1, rng, single=True)
    assert one.keys() == launched.keys()
    for op, (grid, args) in one.items():
        assert grid[1] == 1, op
        assert_launch_args("replay", op, args)
    assert one["sample_search_gather_windows"][1][-7:] == (0,) * 6 + (window_warps(W),)
    assert one["update_priorities"][1][-3:] == (0, 0, 0)


def test_member_constant_launchers_pass_their_kernels_c_parameters(monkeypatch, rng):
    """CPU: sample_weights_members and update_priorities_members (recorded, not launched) pass what
    cuda_src/replay.cu declares, grid y the members and the single launches' strides; they refuse
    constants of another length or dtype, and buffers without the member axis."""
    from cudarl.ops import replay as ops

    P, C, B = 3, 200, 9
    stacked, singles = _objects(np, "numpy", rng, P, C, 3, 1, False, fill=150, own=True)
    t = stacked.member_table
    launched = {}
    monkeypatch.setattr(ops, "launch", lambda family, op, grid, block, args: launched.setdefault(op, (grid, args)))
    idx, w, qsel = np.zeros((P, B), np.int32), np.zeros((P, B), np.float32), np.ones((P, B), np.int64)
    ops.sample_weights_members(stacked.spec, stacked.bufs, qsel, w, t["beta0"], t["beta_final"], t["beta_steps"])
    ops.update_priorities_members(stacked.spec, stacked.bufs, idx, w, t["alpha"], t["eps"])
    ops.sample_weights(stacked.spec, stacked.bufs, qsel, w)
    ops.update_priorities(stacked.spec, stacked.bufs, idx, w)
    for op in ("sample_weights", "update_priorities"):
        (g, args), (g1, args1) = launched[op + "_members"], launched[op]
        assert_launch_args("replay", op + "_members", args)
        assert g == g1 == (1, P)
        # the same batch, shapes and strides (the single kernel's by-value beta_steps aside)
        ints = [a for a in args if isinstance(a, int)]
        skip = 7 if op == "sample_weights" else None
        assert ints == [a for k, a in enumerate(args1) if isinstance(a, int) and k != skip], op
    with pytest.raises(ValueError, match=r"alpha: expected float64 \(3,\)"):
        ops.update_priorities_members(stacked.spec, stacked.bufs, idx, w, t["alpha"][:2], t["eps"])
    with pytest.raises(ValueError, match=r"beta_steps: expected int64 \(3,\)"):
        ops.sample_weights_members(stacked.spec, stacked.bufs, qsel, w, t["beta0"], t["beta_final"], t["beta0"])
    one = singles[0]
    with pytest.raises(ValueError, match="member axis"):
        ops.update_priorities_members(one.spec, one.bufs, idx[0], w[0], t["alpha"][:1], t["eps"][:1])


def test_launchers_refuse_a_partial_member_axis(rng):
    from cudarl.ops import replay as ops

    stacked, _ = _objects(np, "numpy", rng, 3, 200, 3, 1, False, fill=150)
    spec, bufs = stacked.spec, stacked.bufs
    i32, f32 = np.int32, np.float32
    with pytest.raises(ValueError, match="member axis"):
        ops.update_priorities(spec, bufs, np.zeros(8, i32), np.zeros(8, f32))
    with pytest.raises(ValueError, match="one member stride"):
        ops.update_priorities(spec, bufs, np.zeros((3, 8), i32), np.zeros((3, 16), f32)[:, :8])
    with pytest.raises(ValueError, match="one member stride"):  # members overlap
        ops.sample_weights(spec, bufs, np.lib.stride_tricks.as_strided(np.zeros(16, np.int64), (3, 8), (8, 8)),
                           np.zeros((3, 8), f32))  # fmt: skip
    with pytest.raises(ValueError, match=r"bufs.step: expected int64 \[3\]"):
        ops.sample_weights(spec, ref.ReplayBuffers(**{**vars(bufs), "step": bufs.step[:1]}), np.zeros((3, 8), np.int64),
                           np.zeros((3, 8), f32))  # fmt: skip
    with pytest.raises(ValueError, match="bufs.flag"):
        ops.insert_check(spec, ref.ReplayBuffers(**{**vars(bufs), "flag": bufs.flag[:, :2]}),
                         np.zeros((3, 4, 4), f32), *(np.zeros((3, 4), t) for t in (i32, f32, f32)))  # fmt: skip
    with pytest.raises(ValueError, match="tree"):
        ops.tree_level(np.lib.stride_tricks.as_strided(bufs.tree, (3, 64), (8, 8)), 0, 32, 1)


# --- GPU ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("C, n, E, store_next", [(300, 3, 4, False), (97, 1, 1, True), (5003, 3, 8, False)])
def test_gpu_member_axis_is_single_launches(cp, rng, P, C, n, E, store_next):
    """Each kernel over P members in one launch against one single launch per member on copies of its
    buffers and batch (bitwise, every buffer and output); then the stacked launch against the stacked
    twin from the same inputs (bitwise but the weights, within 1e-6 as the single op's)."""
    from cudarl.ops import replay as ops

    stacked, _ = _objects(cp, "cupy", rng, P, C, n, E, store_next, fill=C + 40)
    out = _member_axis_is_single_ops(cp, ops, stacked, rng, cp.cuda.Device().synchronize)
    for op, (before, after, args, _, _) in out.items():
        bufs = _copy(np, before[0])
        arrays = iter(before[1])
        host = [(a[0], next(arrays)) if isinstance(a, tuple) else a for a in args]
        host = [to_numpy(a) if hasattr(a, "device") else a for a in host]
        getattr(ref, op)(stacked.spec, bufs, *_stacked_args(host))
        for k, v in vars(bufs).items():
            if v is not None:
                assert_bitwise(getattr(after[0], k), v, what=f"{op}: bufs.{k} against the twin")
        got = iter(after[1])
        for n_arg, a in enumerate(x for x in host if isinstance(x, tuple)):
            g = next(got)
            if op in ("sample_weights", "sample") and n_arg == 1:  # the weights: float64 pow on both faces
                assert_parity(g, a[1], rtol=1e-6, what=f"{op}: weights against the twin")
            else:
                assert_bitwise(g, a[1], what=f"{op}: argument {n_arg} against the twin")


@pytest.mark.gpu
@pytest.mark.parametrize("P, store_next", [(1, False), (3, False), (3, True), (64, False)])
def test_gpu_stacked_replay_is_p_single_replays(cp, rng, P, store_next):
    _stream_equals_singles(
        cp, "cupy", rng, P, 700, 1 if store_next else 3, 4, store_next, steps=5, sync=cp.cuda.Device().synchronize
    )


@pytest.mark.gpu
@pytest.mark.parametrize("P, store_next", [(1, False), (3, False), (3, True), (64, False)])
def test_gpu_stacked_replay_members_with_their_own_alpha_and_beta_are_single_replays(cp, rng, P, store_next):
    """sample_weights_members and update_priorities_members (each member's alpha, eps and beta schedule on
    the device): member i equals the single replay of its values, bit for bit."""
    _stream_equals_singles(
        cp, "cupy", rng, P, 700, 1 if store_next else 3, 4, store_next, steps=5, sync=cp.cuda.Device().synchronize,
        own=True,
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("P", [3, 64])
def test_gpu_stacked_step_graphed_equals_eager(cp, rng, P):
    """Insert, sample with windows and priority updates over P members captured once and replayed equal
    the eager calls bit for bit (the counters advance in device memory)."""
    from cudarl.graph import StepGraph
    from cudarl.window import Windows

    seeds = rng.integers(0, 1 << 62, P)
    feats = cp.asarray(rng.standard_normal((T_N, F_N)).astype(np.float32))
    sign = cp.asarray(np.ones(F_N, np.float32))
    B, E = 32, 4
    td_host = rng.standard_normal((P, B)).astype(np.float32)  # one draw: both runs update the same priorities
    runs = []
    for _ in range(2):
        r = StackedPrioritizedReplay(P, 900, 4, n_step=3, n_envs=E, seeds=seeds, backend="cupy")
        r.add(*(cp.asarray(v) for v in _batch(np.random.default_rng(3), P, 400, False).values()))
        win = Windows(feats, sign, WINDOW, cp)
        r.reserve(B)
        rows = {k: cp.asarray(v) for k, v in _batch(np.random.default_rng(4), P, 2 * E, False).items()}
        out = Batch(*(cp.zeros((P, *a.shape), a.dtype) for a in _one_batch(cp, B)))
        pair = cp.zeros((P, 2 * B, win.width), np.float32)
        td = cp.asarray(td_host)

        def step(r=r, win=win, rows=rows, out=out, pair=pair, td=td):
            r.add(rows["obs"], rows["action"], rows["reward"], rows["discount"])
            idx, _ = r.sample(B, out=out, windows=win, windows_out=pair)
            r.update_priorities(idx, td, device_rules=True)

        runs.append((r, out, pair, step))
    cp.cuda.Device().synchronize()
    g = StepGraph("stacked_replay_graphed", [("step", runs[1][3])], xp=cp)
    g.capture()
    for k in range(4):
        runs[0][3]()
        g.replay()
        g.synchronize()
        cp.cuda.Device().synchronize()
        (e, out_e, pair_e, _), (gr, out_g, pair_g, _) = runs
        for x, y in zip((*out_g, pair_g, gr.bufs.tree, gr.bufs.step), (*out_e, pair_e, e.bufs.tree, e.bufs.step),
                        strict=True):  # fmt: skip
            assert_bitwise(x, y, what=f"replay {k}")
