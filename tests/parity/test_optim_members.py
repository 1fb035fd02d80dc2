"""The optimiser's member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages",
stage 3): each op of ``cuda_src/optim.cu`` the train step launches, over P members in one launch,
gives member ``i`` the bits of the single op on member ``i``'s rows and scalars; and
:class:`cudarl.optim.StackedAdam` with :class:`cudarl.optim.StackedSoftUpdate` over P members is P
single :class:`cudarl.optim.Adam` and :class:`cudarl.optim.SoftUpdate`, bit for bit.

CPU: the twins (they loop over members, so this holds by construction; the test keeps it so) and the
objects on NumPy; the launchers' refusals. GPU: each kernel at P = 1, 3, 64 against single launches
(bitwise) and against the twin (within the single op's tolerances), the objects against P single
ones, and a captured step against the eager one.
"""

import numpy as np
import pytest

from cudarl.backend import to_numpy
from cudarl.optim import Adam, Schedule, SoftUpdate, StackedAdam, StackedSoftUpdate
from cudarl.reference import optim as ref
from cudarl.testing import assert_bitwise, assert_parity, poison

B1, B2, EPS, WD, SLOTS = 0.875, 0.9990234375, 1e-8, 0.01, 3
ROW, SCALAR = "row", "scalar"  # an argument with the member axis: [P, ...] row i, or [P] element i


def _buffers(xp, rng, P: int, n: int, padded: bool) -> dict:
    """Every buffer an op below takes, for P members of n elements (``padded``: the element rows a
    multiple of 256 bytes apart, as :class:`cudarl.nn.StackedQNetwork`'s; else packed), members' values
    drawn apart. Host values go to ``xp``."""
    from cudarl.nn.params import stacked_zeros

    f32 = np.float32

    def rows(host, dtype=f32):
        a = stacked_zeros(xp, P, (n,), dtype) if padded else xp.zeros((P, n), dtype)
        a[...] = xp.asarray(host.astype(dtype))
        return a

    g = rng.standard_normal((P, n)) * rng.uniform(0.1, 3.0, (P, 1))
    t = rng.integers(1, 40, P)
    return dict(
        p=rows(rng.standard_normal((P, n))),
        g=rows(g),
        m=rows(rng.standard_normal((P, n)) * 0.01),
        v=rows(rng.uniform(0, 1e-4, (P, n))),
        mask=rows((rng.uniform(size=(P, n)) < 0.7), np.uint8),
        target=rows(rng.standard_normal((P, n))),
        online=rows(rng.standard_normal((P, n))),
        partial=xp.asarray(rng.uniform(0, 3.0, (P, ref.GN_BLOCKS))),
        ring=xp.asarray(np.full((P, 2 * SLOTS), -1.0, f32)),
        norm=xp.zeros(P, f32),
        scale=xp.zeros(P, f32),
        lr=xp.asarray(rng.uniform(1e-4, 3e-3, P).astype(f32)),
        m_scale=xp.asarray(rng.choice([0.5, 1.0], P).astype(f32)),
        bc1=xp.asarray((1 - B1**t).astype(f32)),
        bc2=xp.asarray((1 - B2**t).astype(f32)),
        clip=xp.asarray(rng.uniform(0.5, 1.0, P).astype(f32)),
        tau=xp.asarray(rng.uniform(0.01, 0.5, P).astype(f32)),
        loss=xp.asarray(rng.uniform(0.5, 2.0, P).astype(f32)),
        step=xp.asarray(t.astype(np.int64)),
        count=xp.asarray(rng.integers(0, 30, P).astype(np.int64)),
        done=xp.zeros(P, np.uint32),
        barrier=xp.zeros(P, np.uint32),
        max_norm=0.5 * float(np.sqrt(np.sum(g**2, axis=1)).min()),  # every member clips
    )


def _cases(b: dict) -> list:
    """(op, arguments) of every op with a member axis; an argument is (ROW or SCALAR, name) or a constant."""
    R = lambda *names: [(ROW, k) for k in names]  # noqa: E731
    S = lambda *names: [(SCALAR, k) for k in names]  # noqa: E731
    adam = [*R("p", "g", "m", "v", "mask"), *S("lr", "m_scale", "bc1", "bc2", "clip")]
    sched = (ref.COSINE_RESTARTS, 1e-3, 1e-5, 3, 5, 2, 0.5, B1, B2)
    cas = [
        *R("p", "g", "m", "v", "mask", "target", "partial"),
        *S("norm", "scale"),
        b["max_norm"],
        *S("done", "barrier", "lr", "m_scale", "bc1", "bc2", "tau"),
        *R("ring"),
        *S("loss", "step"),
        SLOTS,
        B1,
        B2,
        EPS,
        WD,
    ]
    return [
        ("grad_norm_partial", R("g", "partial")),
        ("grad_norm_finalize", [*R("partial"), *S("norm", "scale"), b["max_norm"]]),
        ("grad_norm", [*R("g", "partial"), *S("norm", "scale"), b["max_norm"], *S("done")]),
        ("lr_schedule", [*S("step", "lr", "m_scale", "bc1", "bc2"), *sched]),
        ("tau_schedule", [*S("count", "tau"), 0.5, 0.01, 17]),
        ("soft_update", [*R("target", "online"), *S("tau")]),
        ("adam_update", [*adam, B1, B2, EPS, WD]),
        ("adam_update_soft", [*adam[:5], *R("target"), *adam[5:], *S("tau"), B1, B2, EPS, WD]),
        ("clip_adam_soft", cas),
        (
            "grad_norm_publish",
            [*R("g", "partial"), *S("norm", "scale"), b["max_norm"], *S("done"), *R("ring"), *S("loss", "step"), SLOTS],
        ),
    ]


def _stacked_args(b: dict, spec: list) -> tuple:
    return tuple(b[a[1]] if isinstance(a, tuple) else a for a in spec)


def _member_args(b: dict, spec: list, i: int) -> tuple:
    """Copies of member ``i``'s rows and scalars in the single op's form (flat rows, ``[1]`` scalars)."""
    out = []
    for a in spec:
        if not isinstance(a, tuple):
            out.append(a)
        else:
            kind, k = a
            out.append(b[k][i].copy() if kind == ROW else b[k][i : i + 1].copy())
    return tuple(out)


def _names(spec: list) -> list:
    return [a for a in spec if isinstance(a, tuple)]


def _member_axis_is_single_calls(xp, mod, rng, P, n, padded, sync=lambda: None) -> dict:
    """Each op of :func:`_cases` once over P members against one single call of ``mod``'s op per member on
    copies of its arguments taken before: every argument, bitwise. Returns ``{op: (inputs, stacked
    results)}`` as NumPy (for the twin comparison)."""
    out = {}
    for op, _ in _cases({"max_norm": 1.0}):
        b = _buffers(xp, rng, P, n, padded)
        spec = dict(_cases(b))[op]
        if xp is not np:
            for k in ("norm", "scale"):
                poison(b[k])
        before = {k: to_numpy(b[k]).copy() for _, k in _names(spec)}
        singles = [_member_args(b, spec, i) for i in range(P)]
        getattr(mod, op)(*_stacked_args(b, spec))
        for one in singles:
            getattr(mod, op)(*one)
        sync()
        for i, one in enumerate(singles):
            args = [a for a, kind in zip(one, spec, strict=True) if isinstance(kind, tuple)]
            for (kind, k), a in zip(_names(spec), args, strict=True):
                got = b[k][i] if kind == ROW else b[k][i : i + 1]
                assert_bitwise(got, a, what=f"{op}: member {i} of {P}, {k}")
        out[op] = (before, {k: to_numpy(b[k]).copy() for _, k in _names(spec)}, spec)
    return out


# --- CPU: the twins ------------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("n", [1, 257, 3_001])
@pytest.mark.parametrize("padded", [True, False])
def test_twins_member_axis_is_single_calls(rng, P, n, padded):
    _member_axis_is_single_calls(np, ref, rng, P, n, padded)


def test_member_axis_all_or_none():
    """A twin and a launcher take every buffer with the member axis or none; the launcher's scalars are
    ``[P]`` with it; the element rows share one member stride and do not overlap."""
    from cudarl.ops import optim as ops

    rows, one = np.zeros((3, 8), np.float32), np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="member axis"):
        ref.soft_update(rows, rows[0], np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="member axis or none"):
        ops.soft_update(rows, rows[0], one)
    with pytest.raises(ValueError, match=r"tau must be \[3\]"):
        ops.soft_update(rows, rows.copy(), one)
    with pytest.raises(ValueError, match="one stride"):
        ops.soft_update(rows, np.zeros((3, 16), np.float32)[:, :8], np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="one stride"):  # members overlap
        ops.soft_update(rows, np.lib.stride_tricks.as_strided(rows, (3, 8), (16, 4)), np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.grad_norm_partial(rows, np.zeros((3, 2 * ref.GN_BLOCKS))[:, : ref.GN_BLOCKS])
    with pytest.raises(ValueError, match=r"uint32 \[3\] ticket"):
        ops.grad_norm(rows, np.zeros((3, ref.GN_BLOCKS)), np.zeros(3, np.float32), np.zeros(3, np.float32), 1.0, one)
    P, e, n, s = ops._rows("w", a=np.zeros((3, 64), np.float32)[:, :5], b=np.zeros((3, 64), np.uint8)[:, :5])
    assert (P, n, s) == (3, 5, 64) and e["a"].shape == (5,)
    assert ops._rows("w", a=np.zeros(5, np.float32))[::2] == (1, 5)


# --- CPU: the objects ----------------------------------------------------------------------------------
def _member_schedules(P: int) -> tuple[list, list]:
    """P learning-rate schedules and P tau schedules, each member's its own (every kind, warm-ups and
    restarts crossed within a few steps): ``(schedules, [(tau_start, tau_end, period)])``."""
    kinds = ("cosine_restarts", "cosine", "constant")
    scheds = [
        Schedule(kinds[i % 3], lr=1e-3 * (1 + 0.37 * i), lr_min=1e-5 * (i + 1), warmup=2 + i % 3, period=3 + i % 4,
                 mult=1 + i % 2, restart_m_scale=0.5 + 0.125 * (i % 3))
        for i in range(P)
    ]  # fmt: skip
    taus = [(0.5 - 0.03 * (i % 10), 0.01 * (1 + i % 5), 4 + i % 6) for i in range(P)]
    return scheds, taus


def _member_constants(P: int, n: int) -> list:
    """P members' own Adam constants ``dict(betas, eps, weight_decay, max_grad_norm)``, each distinct (the clip
    norm around :func:`_objects`' shared one, so some steps clip and some do not)."""
    return [
        dict(
            betas=(0.875 - 0.01 * i, 0.9990234375 - 1e-4 * (i % 7)),
            eps=1e-8 * (1 + i),
            weight_decay=WD * (i % 4),
            max_grad_norm=float(np.sqrt(n)) * (0.15 + 0.1 * (i % 3)),
        )
        for i in range(P)
    ]


def _objects(xp, P: int, n: int, seed: int, own: bool = False, swap=None):
    """A StackedAdam + StackedSoftUpdate over P members (rows padded as StackedQNetwork's) and P single
    Adam + SoftUpdate on copies of each member's row: ``(stacked, singles)``, each a dict of p, g, target,
    loss, ring, adam, soft. ``own``: each member its own learning-rate and tau schedules
    (:func:`_member_schedules`) and Adam constants (:func:`_member_constants`), single ``i`` member ``i``'s
    (``swap``: a pair of members whose stacked settings trade places, for a test that must then fail)."""
    from cudarl.nn.params import stacked_zeros

    rng = np.random.default_rng(seed)
    p0 = (rng.standard_normal((P, n)) * 0.1).astype(np.float32)
    t0 = (rng.standard_normal((P, n)) * 0.1).astype(np.float32)
    mask = (rng.uniform(size=n) < 0.8).astype(np.uint8)
    kw = dict(
        schedule=Schedule("cosine_restarts", lr=1e-3, lr_min=1e-5, warmup=2, period=4, restart_m_scale=0.5),
        weight_decay=WD,
        max_grad_norm=float(np.sqrt(n)) * 0.2,
        decay_mask=mask,
        xp=xp,
    )
    tkw = dict(tau_start=0.5, tau_end=0.01, period=5, xp=xp)
    scheds, taus = _member_schedules(P) if own else ([kw["schedule"]] * P, [(0.5, 0.01, 5)] * P)
    order = list(range(P))
    if swap is not None:
        order[swap[0]], order[swap[1]] = order[swap[1]], order[swap[0]]
    p, g, target = (stacked_zeros(xp, P, (n,)) for _ in range(3))
    p[...], target[...] = xp.asarray(p0), xp.asarray(t0)
    stacked = dict(p=p, g=g, target=target, loss=xp.zeros(P, np.float32), p0=p0)
    stacked["ring"] = xp.asarray(np.full((P, 2 * SLOTS), -1.0, np.float32))
    consts = _member_constants(P, n) if own else [{}] * P
    if own:
        per = {k: [consts[j][k] for j in order] for k in consts[0]}
        stacked["adam"] = StackedAdam(p, g, **dict(kw, schedule=[scheds[j] for j in order], **per))
        stacked["soft"] = StackedSoftUpdate(target, p, *zip(*(taus[j] for j in order), strict=True), xp=xp)
    else:
        stacked["adam"] = StackedAdam(p, g, **kw)
        stacked["soft"] = StackedSoftUpdate(target, p, **tkw)
    singles = []
    for i in range(P):
        s = dict(p=xp.asarray(p0[i].copy()), g=xp.zeros(n, np.float32), target=xp.asarray(t0[i].copy()))
        s["loss"], s["ring"] = xp.zeros(1, np.float32), xp.asarray(np.full(2 * SLOTS, -1.0, np.float32))
        s["adam"] = Adam(s["p"], s["g"], **dict(kw, schedule=scheds[i], **consts[i]))
        s["soft"] = SoftUpdate(s["target"], s["p"], *taus[i], xp=xp)
        singles.append(s)
    return stacked, singles


#: ``fused`` of :func:`_step` -> ``clip_update_publish``'s ``grid_barrier`` (True: the launcher picks; "one": its
#: one launch forced; "two": its two launches without the barrier)
_FORMS = {True: True, "one": "always", "two": False}


def _step(o: dict, fused) -> None:
    """One step: ``fused`` False, the three calls (clip_step, update_step, no publish); else
    ``clip_update_publish`` in the form :data:`_FORMS` says."""
    o["adam"].schedule_step()
    o["soft"].schedule_step()
    if fused:
        o["adam"].clip_update_publish(o["soft"], o["ring"], o["loss"], SLOTS, _FORMS[fused])
    else:
        o["adam"].clip_step()
        o["adam"].update_step(soft=o["soft"])


def _train_members(xp, P, n, steps, fused, seed=3, sync=lambda: None, run=None, own=False, swap=None):
    """``steps`` steps of the stacked objects and of the P single ones on the same gradients and losses
    (``run(stacked)``: how the stacked step runs, default eager; ``own``, ``swap``: :func:`_objects`'s);
    asserts member i == single i, bitwise."""
    stacked, singles = _objects(xp, P, n, seed, own, swap)
    rng = np.random.default_rng(seed + 1)
    clipped = set()
    for k in range(steps):
        g = (rng.standard_normal((P, n)) * (0.1 + (k + np.arange(P)[:, None]) % 3 * 0.2)).astype(np.float32)
        loss = rng.uniform(0.5, 2.0, P).astype(np.float32)
        stacked["g"][...], stacked["loss"][...] = xp.asarray(g), xp.asarray(loss)
        for i, s in enumerate(singles):
            s["g"][...], s["loss"][...] = xp.asarray(g[i]), xp.asarray(loss[i : i + 1])
        sync()
        (run or (lambda o: _step(o, fused)))(stacked)
        for s in singles:
            _step(s, bool(fused))  # the singles' own forms: one launch (fused) or the three calls
        sync()
        for i, s in enumerate(singles):
            if fused:
                assert_bitwise(stacked["ring"][i], s["ring"], what=f"step {k}: member {i} ring")
            clipped.add(bool(to_numpy(s["adam"].scalars.view("clip_scale"))[0] < 1))
    for i, s in enumerate(singles):
        for what in ("p", "target"):
            assert_bitwise(stacked[what][i], s[what], what=f"member {i} of {P}: {what}")
        want, got = s["adam"].state_dict(), stacked["adam"].member_state_dict(i)
        assert_bitwise(got["m"], want["m"], what=f"member {i}: m")
        assert_bitwise(got["v"], want["v"], what=f"member {i}: v")
        for name, value in want["scalars"].items():
            assert_bitwise(np.asarray(got["scalars"][name]), np.asarray(value), what=f"member {i}: {name}")
        assert_bitwise(stacked["adam"].partial[i], s["adam"].partial, what=f"member {i}: partials")
        assert_bitwise(stacked["soft"].scalars.get("tau")[i : i + 1], s["soft"].scalars.view("tau"), what="tau")
    assert clipped == {True, False}, "want steps that clip and steps that do not"
    assert not np.array_equal(to_numpy(stacked["p"]), stacked["p0"]), "the step did not train"
    return stacked


@pytest.mark.parametrize("fused", [True, "two", False])
def test_stacked_adam_is_p_single_adams_on_numpy(fused):
    _train_members(np, 3, 1_001, 12, fused)


@pytest.mark.parametrize("fused", [True, False])
def test_stacked_adam_members_with_their_own_schedules_on_numpy(fused):
    """Each member its own learning-rate schedule (kind, peak, floor, warm-up, period, restarts), tau schedule
    and Adam constants (betas, eps, weight decay, clip norm): member i is the single Adam + SoftUpdate of its
    settings, bit for bit; the same members with two members' settings swapped are not (the test sees which
    member runs which)."""
    stacked = _train_members(np, 4, 1_001, 12, fused, own=True)
    lrs = stacked["adam"].scalars.get("lr")
    assert len(set(lrs.tolist())) == 4 and len(set(stacked["soft"].scalars.get("tau").tolist())) == 4
    with pytest.raises(AssertionError, match="member 1"):
        _train_members(np, 4, 1_001, 12, fused, own=True, swap=(1, 2))


def _plain_steps_equal_singles(xp, P: int, n: int, steps: int, sync=lambda: None) -> None:
    """``Adam.step`` (schedule, clip, update without a target: ``adam_update_members``) of a StackedAdam whose
    members have their own settings against the single Adams, bit for bit."""
    stacked, singles = _objects(xp, P, n, 5, own=True)
    rng = np.random.default_rng(6)
    for k in range(steps):
        g = rng.standard_normal((P, n)).astype(np.float32)
        stacked["g"][...] = xp.asarray(g)
        for i, s in enumerate(singles):
            s["g"][...] = xp.asarray(g[i])
        stacked["adam"].step()
        for s in singles:
            s["adam"].step()
        sync()
        for i, s in enumerate(singles):
            for what in ("p",):
                assert_bitwise(stacked[what][i], s[what], what=f"step {k}: member {i}, {what}")
            assert_bitwise(stacked["adam"].m[i], s["adam"].m, what=f"step {k}: member {i}, m")


def test_stacked_adam_plain_step_with_each_members_constants_on_numpy():
    _plain_steps_equal_singles(np, 3, 1_001, 6)


def test_member_schedule_launchers_pass_their_kernels_c_parameters(monkeypatch):
    """The _members launchers' arguments (recorded, not launched) are what the kernels declare; the grid's y
    is P. (clip_adam_soft_members' one launch asks the device for its grid: its arguments are the GPU tests';
    its two launches without the barrier are recorded here.)"""
    from cudarl.ops import optim as ops
    from cudarl.testing import assert_launch_args

    launched = []
    monkeypatch.setattr(ops, "launch", lambda fam, op, grid, block, args: launched.append((op, grid, args)))
    stacked, _ = _objects(np, 4, 8, 0, own=True)
    adam, soft = stacked["adam"], stacked["soft"]
    for obj in (adam, soft):
        obj.ops = ops  # the launchers on host arrays: recorded, not launched
    adam.schedule_step()
    soft.schedule_step()
    adam.clip_step()
    adam.update_step(soft=soft)
    adam.update_step()
    adam.clip_update_publish(soft, stacked["ring"], stacked["loss"], SLOTS, grid_barrier=False)  # the two launches
    assert [(op, grid[1]) for op, grid, _ in launched] == [
        ("lr_schedule_members", 4),
        ("tau_schedule_members", 4),
        ("grad_norm_members", 4),
        ("adam_update_soft_members", 4),
        ("adam_update_members", 4),
        ("grad_norm_publish_members", 4),
        ("adam_update_soft_members", 4),
    ]
    for op, _, args in launched:
        assert_launch_args("optim", op, args)


def test_member_schedule_twins_are_the_single_twins():
    """``lr_schedule_members`` and ``tau_schedule_members`` (each member's constants ``[P]``) against the single
    twins with member i's constants, over warm-ups, cosines and restarts; the launchers' shape checks."""
    from cudarl.ops import optim as ops

    P = 5
    scheds, taus = _member_schedules(P)
    stacked, _ = _objects(np, P, 8, 0, own=True)
    table, ttable = stacked["adam"].schedule_table, stacked["soft"].schedule_table
    assert table["kind"].dtype == np.int32 and table["warmup"].dtype == np.int64 and table["lr_max"].dtype == np.float32
    sc = {k: np.zeros(P, np.float32) for k in ("lr", "m_scale", "bc1", "bc2", "tau")}
    step, count = np.zeros(P, np.int64), np.zeros(P, np.int64)
    one = [{k: np.zeros(1, np.float32) for k in sc} | {"step": np.zeros(1, np.int64), "count": np.zeros(1, np.int64)}
           for _ in range(P)]  # fmt: skip
    names = ("kind", "lr_max", "lr_min", "warmup", "period", "mult", "restart_m_scale")
    betas = (stacked["adam"].constant_table["beta1"], stacked["adam"].constant_table["beta2"])
    assert len(set(betas[0].tolist())) == P
    for _ in range(9):
        ref.lr_schedule_members(step, sc["lr"], sc["m_scale"], sc["bc1"], sc["bc2"], *(table[k] for k in names), *betas)
        ref.tau_schedule_members(count, sc["tau"], ttable["tau_start"], ttable["tau_end"], ttable["period"])
        for i, (s, o) in enumerate(zip(scheds, one, strict=True)):
            ref.lr_schedule(o["step"], o["lr"], o["m_scale"], o["bc1"], o["bc2"], ref.SCHEDULES[s.kind], s.lr,
                            s.lr_min, s.warmup, s.period, s.mult, s.restart_m_scale,
                            *stacked["adam"].constants[i][:2])  # fmt: skip
            ref.tau_schedule(o["count"], o["tau"], *taus[i])
            for k in (*sc, "step", "count"):
                got = (step if k == "step" else count if k == "count" else sc[k])[i : i + 1]
                assert_bitwise(got, o[k], what=f"member {i}: {k}")
    assert len(set(sc["lr"].tolist())) == P
    with pytest.raises(ValueError, match=r"lr_max must be \[5\]"):
        ops.lr_schedule_members(step, *(sc[k] for k in ("lr", "m_scale", "bc1", "bc2")),
                                *(table[k][:4] if k == "lr_max" else table[k] for k in names), *betas)  # fmt: skip
    with pytest.raises(ValueError, match=r"period must be \[5\]"):
        ops.tau_schedule_members(count, sc["tau"], ttable["tau_start"], ttable["tau_end"], ttable["period"][:1])


def test_stacked_adam_takes_stacked_network_buffers_and_checkpoints():
    """StackedQNetwork's params and grads ``[P, padded_size]``; state_dict / load_state_dict resume."""
    from cudarl.nn import StackedQNetwork

    net = StackedQNetwork(8, 3, members=2, hidden=(16,), max_batch=None)
    adam = StackedAdam(net.params, net.grads, decay_mask=net.layout.decay_mask(), weight_decay=WD)
    assert adam.mask.shape == net.params.shape and adam.scalars.view("lr").shape == (2,)
    net.grads[...] = np.random.default_rng(0).standard_normal(net.grads.shape).astype(np.float32)
    adam.step()
    state = adam.state_dict()
    saved = net.params.copy()
    adam.step()
    after = net.params.copy()
    net.params[...] = saved
    other = StackedAdam(net.params, net.grads, decay_mask=net.layout.decay_mask(), weight_decay=WD)
    other.load_state_dict(state)
    other.step()
    assert_bitwise(net.params, after, what="resumed step")
    assert list(adam.scalars.get("step")) == [2, 2]
    with pytest.raises(ValueError, match=r"\[P, n\]"):
        StackedAdam(net.params[0], net.grads[0])
    with pytest.raises(ValueError, match="flat"):
        Adam(net.params, net.grads)
    # Gradient Vaccine's folded apply is one member's launch (optim.clip_adam_soft_vaccine): refused, not ignored
    with pytest.raises(ValueError, match="no folded apply"):
        adam.clip_update_publish(None, None, None, 2, apply=(net.grads,) * 3 + (0, 1, 0))


# --- GPU -----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("n", [1, 257, 135_000])
@pytest.mark.parametrize("padded", [True, False])
def test_gpu_member_axis_is_single_launches_bitwise_and_the_twin(cp, rng, P, n, padded):
    """Each optim kernel with a member axis (blockIdx.y the member): member i equals one single launch on
    copies of its rows and scalars, bit for bit (P = 1 is the single launch); and the stacked launch
    against the stacked twin within the single op's tolerances (float64 partials, float32 1e-6)."""
    from cudarl.ops import optim as ops

    sync = cp.cuda.Device().synchronize
    results = _member_axis_is_single_calls(cp, ops, rng, P, n, padded, sync)
    for op, (before, got, spec) in results.items():
        host = {k: v.copy() for k, v in before.items()}
        getattr(ref, op)(*_stacked_args(host, spec))
        for _, k in _names(spec):
            if got[k].dtype.kind in "iu" or k in ("done", "barrier"):
                assert_bitwise(got[k], host[k], what=f"{op}: {k} against the twin")
            elif got[k].dtype == np.float64:
                assert_parity(got[k], host[k], kind="float64", what=f"{op}: {k} against the twin")
            else:
                assert_parity(got[k], host[k], rtol=1e-6, what=f"{op}: {k} against the twin")


@pytest.mark.gpu
@pytest.mark.parametrize("P", [2, 5])
def test_gpu_clip_adam_soft_members_bits_do_not_depend_on_the_grid(cp, rng, P):
    """Each member's blocks from 1 to its share of the resident limit give the same bits, and so do the two
    launches without the barrier (grad_norm_publish, adam_update_soft); more members than the limit are refused
    the one launch (forced) before a launch, and take the two launches otherwise."""
    from cudarl.kernels import resident_grid_limit
    from cudarl.ops import optim as ops

    n, limit = 135_000, resident_grid_limit()
    host = _buffers(np, rng, P, n, True)
    spec = dict(_cases(host))["clip_adam_soft"]
    outs = []
    for grid in sorted({1, 2, 3, limit // P}):
        b = {k: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in host.items()}
        ops.clip_adam_soft(*_stacked_args(b, spec), grid=grid)
        cp.cuda.Device().synchronize()
        outs.append({k: b[k].get() for _, k in _names(spec)})
        assert not outs[-1]["done"].any() and not outs[-1]["barrier"].any(), f"grid {grid}: a counter not left 0"
    for o in outs[1:]:
        for k in o:
            assert_bitwise(o[k], outs[0][k], what=f"clip_adam_soft {k} across grids")
    for form in (False, True):  # the two launches without the barrier (True: the launcher's pick at P > 1)
        b = {k: (cp.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in host.items()}
        ops.clip_adam_soft(*_stacked_args(b, spec), grid_barrier=form)
        cp.cuda.Device().synchronize()
        for k, want in outs[0].items():
            assert_bitwise(b[k].get(), want, what=f"clip_adam_soft {k}: two launches (grid_barrier={form})")
    with pytest.raises(ValueError, match="grid .*must be"):
        ops.clip_adam_soft(*_stacked_args(b, spec), grid=limit // P + 1)
    big = _buffers(cp, rng, limit + 1, 1, False)
    with pytest.raises(ValueError, match="members need"):
        ops.clip_adam_soft(*_stacked_args(big, dict(_cases(big))["clip_adam_soft"]), grid_barrier="always")
    ops.clip_adam_soft(*_stacked_args(big, dict(_cases(big))["clip_adam_soft"]))  # no refusal: the two launches


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("fused", [True, "one", "two", False])
def test_gpu_stacked_adam_is_p_single_adams(cp, P, fused):
    """StackedAdam + StackedSoftUpdate over P members of the reference network's size, 12 steps (warm-up and
    restarts crossed, steps that clip and steps that do not): every member's parameters, target, moments,
    scalars and published ring equal P single Adam + SoftUpdate, bit for bit. ``fused``: the launcher's pick,
    the one launch forced ("one", squeezed at P > 1), the two launches ("two": grad_norm_publish +
    adam_update_soft), each against single Adams' one launch; or the three calls."""
    _train_members(cp, P, 135_000, 12, fused, sync=cp.cuda.Device().synchronize)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [3, 64])
@pytest.mark.parametrize("form", ["one", "two"])
def test_gpu_stacked_adam_graphed_equals_eager_and_singles(cp, P, form):
    """The stacked schedule + clip_update_publish (its one launch forced, or its two launches) captured once
    and replayed 12 times gives P single eager optimisers' bits (so the eager stacked step's, by the test
    above)."""
    from cudarl.graph import StepGraph

    holder = {}

    def run(stacked):
        if "graph" not in holder:
            holder["graph"] = StepGraph(f"stacked_adam_{P}", [("adam", lambda: _step(stacked, form))], xp=cp)
            cp.cuda.Device().synchronize()
            holder["graph"].capture()
        holder["graph"].replay()
        holder["graph"].synchronize()

    _train_members(cp, P, 135_000, 12, form, sync=cp.cuda.Device().synchronize, run=run)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
def test_gpu_member_schedule_kernels_are_single_launches_bitwise(cp, P):
    """``optim.lr_schedule_members`` and ``optim.tau_schedule_members`` (each member's schedule ``[P]`` on the
    device) against ``optim.lr_schedule`` and ``optim.tau_schedule`` launched alone with member i's constants,
    bit for bit, over 9 steps (warm-ups, cosines, restarts); and against the twins."""
    from cudarl.ops import optim as ops

    scheds, taus = _member_schedules(P)
    stacked, _ = _objects(cp, P, 8, 0, own=True)
    table, ttable = stacked["adam"].schedule_table, stacked["soft"].schedule_table
    names = ("kind", "lr_max", "lr_min", "warmup", "period", "mult", "restart_m_scale")
    keys = ("lr", "m_scale", "bc1", "bc2", "tau")
    sc = {k: cp.full(P, np.nan, np.float32) for k in keys} | {
        "step": cp.zeros(P, np.int64),
        "count": cp.zeros(P, np.int64),
    }
    host = {k: np.zeros(P, np.float32) for k in keys} | {"step": np.zeros(P, np.int64), "count": np.zeros(P, np.int64)}
    one = [{k: cp.zeros(1, np.float32) for k in keys} | {"step": cp.zeros(1, np.int64), "count": cp.zeros(1, np.int64)}
           for _ in range(P)]  # fmt: skip
    for _ in range(9):
        for f, d in ((ops, sc), (ref, host)):
            t = table if f is ops else {k: v.get() for k, v in table.items()}
            tt = ttable if f is ops else {k: v.get() for k, v in ttable.items()}
            b = (
                stacked["adam"].constant_table
                if f is ops
                else {k: v.get() for k, v in stacked["adam"].constant_table.items()}
            )
            f.lr_schedule_members(d["step"], d["lr"], d["m_scale"], d["bc1"], d["bc2"], *(t[k] for k in names),
                                  b["beta1"], b["beta2"])  # fmt: skip
            f.tau_schedule_members(d["count"], d["tau"], tt["tau_start"], tt["tau_end"], tt["period"])
        for i, (s, o) in enumerate(zip(scheds, one, strict=True)):
            ops.lr_schedule(o["step"], o["lr"], o["m_scale"], o["bc1"], o["bc2"], ref.SCHEDULES[s.kind], s.lr,
                            s.lr_min, s.warmup, s.period, s.mult, s.restart_m_scale,
                            *stacked["adam"].constants[i][:2])  # fmt: skip
            ops.tau_schedule(o["count"], o["tau"], *taus[i])
        cp.cuda.Device().synchronize()
        for i, o in enumerate(one):
            for k in (*keys, "step", "count"):
                assert_bitwise(sc[k][i : i + 1], o[k], what=f"member {i} of {P}: {k}")
        for k in (*keys, "step", "count"):
            if k in ("step", "count"):
                assert_bitwise(sc[k], host[k], what=f"{k} against the twin")
            else:
                assert_parity(sc[k], host[k], rtol=1e-6, what=f"{k} against the twin")


@pytest.mark.gpu
@pytest.mark.parametrize("P", [3, 64])
@pytest.mark.parametrize("fused", ["one", "two", False])
def test_gpu_stacked_adam_members_with_their_own_schedules(cp, P, fused):
    """StackedAdam + StackedSoftUpdate whose members each run their own learning-rate and tau schedules and
    Adam constants (the _members kernels: lr_schedule, tau_schedule, grad_norm, adam_update_soft,
    clip_adam_soft), at the reference network's size: member i equals the single Adam + SoftUpdate of its
    settings, bit for bit."""
    _train_members(cp, P, 135_000, 12, fused, sync=cp.cuda.Device().synchronize, own=True)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
def test_gpu_stacked_adam_plain_step_with_each_members_constants(cp, P):
    """adam_update_members (Adam.step without a target) with each member's constants against single Adams."""
    _plain_steps_equal_singles(cp, P, 135_000, 6, sync=cp.cuda.Device().synchronize)
