"""The collect step's member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages",
stage 5b): each act op of ``cuda_src/agent.cu`` (the fused act kernels, the epsilon schedule, the
publishes) and each env op of ``cuda_src/env.cu`` with draws (reset, step, record_step, act), over P
members in one launch, gives member ``i`` the bits of the single op on member ``i``'s buffers; a
member's draws are keyed by its own seed, so they do not depend on P or its index.

CPU: the twins (they loop over members, so this holds by construction; the test keeps it so), the
launchers' arguments and grids, and their refusals. GPU: each kernel at P = 1, 3, 64 against single
launches on copies (bitwise) and against the twin. Members hold distinct heads, env states, counters,
seeds and schedules, so a member read from another's slice fails; the per-env rows are laid out packed
and padded (members a few elements more than a row apart).
"""

from functools import partial

import numpy as np
import pytest

from cudarl.backend import to_numpy
from cudarl.reference import agent as agent_ref
from cudarl.reference import env as env_ref
from cudarl.reference.env import EnvData, EnvParams, EnvState, Transitions, rows_per_step
from cudarl.reference.window import STATE_DIM, width
from cudarl.testing import assert_bitwise, assert_launch_args, assert_parity, poison

F32 = np.float32
ROW, SCALAR = "row", "scalar"  # a buffer with the member axis: [P, ...] (entry i) or a device scalar [P]
SCHEDULE = (1.0, 0.05, 9)  # eps start, end, steps: from exploring everything to mostly greedy
SLOTS = 3
T_N, F_N, WINDOW = 60, 3, 2  # the shared market: bars, features, window
STATE = EnvState._fields
OUT = Transitions._fields


def _rows(xp, host: np.ndarray, padded: bool):
    """``host [P, *row]`` on ``xp``; ``padded``: members 5 elements more than a row apart (any dtype: the
    member stride in elements is then the same for every row family of one length)."""
    if not padded:
        return xp.asarray(host)
    P, n = host.shape[0], int(np.prod(host.shape[1:]))
    a = xp.zeros((P, n + 5), host.dtype)
    v = a[:, :n].reshape(host.shape)
    v[...] = xp.asarray(host)
    return v


def _scalar(xp, host):
    return xp.asarray(np.asarray(host))


# --- the cases: (op, {name: (kind, array)}, call) ---------------------------------------------------
def _act_case(xp, rng, P: int, padded: bool, kind: str, shared_support: bool = True):
    """A fused act op's buffers for P members of n envs: heads, env counters, seeds and schedule
    counters drawn apart (epsilon from 1 to 0.05 across members, so both branches run)."""
    n, A, K, N = 37, 3, 17, 5
    head = {
        "c51": (n, A, K),
        "c51_dueling": (n, (1 + A) * K),
        "c51_risk": (n, A, K),
        "iqn": (n, N, A),
        "quantile_risk": (n, N, A),
    }[kind]
    support = np.linspace(-10, 10, K, dtype=F32)
    b = {
        "actions": (ROW, _rows(xp, np.full((P, n), -7, np.int32), padded)),
        "q": (ROW, _rows(xp, np.full((P, n, A), np.nan, F32), padded)),
        "head": (ROW, _rows(xp, (rng.standard_normal((P, *head)) * 3).astype(F32), padded)),
        "env_count": (ROW, _rows(xp, rng.integers(0, 2**40, (P, n), dtype=np.uint64), padded)),
        "seed": (SCALAR, _scalar(xp, rng.integers(0, 2**63, P, dtype=np.uint64))),
        "eps": (SCALAR, _scalar(xp, np.zeros(P, F32))),
        "count": (SCALAR, _scalar(xp, rng.integers(0, 12, P).astype(np.int64))),
        "arrivals": (SCALAR, _scalar(xp, np.zeros(P, np.uint32))),
    }
    if kind.startswith("c51"):
        sup = support if shared_support else (support[None] * rng.uniform(0.5, 2, (P, 1))).astype(F32)
        b["support"] = ("shared", xp.asarray(sup)) if shared_support else (ROW, _rows(xp, sup, padded))
    risk = {"c51_risk": (agent_ref.CVAR, 0.3, 0.0), "quantile_risk": (agent_ref.MEAN_STD, 1.0, 0.5)}.get(kind, ())

    def call(fam, a):
        sched = (a["eps"], a["count"], a["arrivals"], *SCHEDULE)
        if kind.startswith("c51"):
            lead = (a["actions"], a["q"], a["head"], a["support"], a["env_count"], a["seed"])
        else:
            lead = (a["actions"], a["q"], a["head"], a["env_count"], a["seed"])
        getattr(fam, "act_" + kind)(*lead, *risk, *sched)

    return "act_" + kind, b, call


def _epsilon_case(xp, rng, P: int, padded: bool):
    b = {
        "eps": (SCALAR, _scalar(xp, np.full(P, np.nan, F32))),
        "count": (SCALAR, _scalar(xp, rng.integers(0, 12, P).astype(np.int64))),
    }
    return "epsilon", b, lambda fam, a: fam.epsilon(a["eps"], a["count"], *SCHEDULE)


def _publish_case(xp, rng, P: int, padded: bool):
    b = {
        "ring": (ROW, xp.asarray(np.full((P, 2 * SLOTS), -1.0, F32))),
        "loss": (SCALAR, _scalar(xp, rng.uniform(0.5, 2, P).astype(F32))),
        "grad_norm": (SCALAR, _scalar(xp, rng.uniform(0.5, 2, P).astype(F32))),
        "step": (SCALAR, _scalar(xp, rng.integers(0, 40, P).astype(np.int64))),
    }
    return "publish", b, lambda fam, a: fam.publish(a["ring"], a["loss"], a["grad_norm"], a["step"], SLOTS)


def _publish_row_case(xp, rng, P: int, padded: bool):
    n = 11
    b = {
        "ring": (ROW, xp.asarray(np.full((P, SLOTS * n), -1.0, F32))),
        "values": (ROW, _rows(xp, rng.standard_normal((P, n)).astype(F32), padded)),
        "step": (SCALAR, _scalar(xp, rng.integers(0, 40, P).astype(np.int64))),
    }
    return "publish_row", b, lambda fam, a: fam.publish_row(a["ring"], a["values"], a["step"], SLOTS)


AGENT_CASES = {
    **{f"act_{k}": partial(_act_case, kind=k) for k in ("c51", "c51_dueling", "c51_risk", "iqn", "quantile_risk")},
    "epsilon": _epsilon_case,
    "publish": _publish_case,
    "publish_row": _publish_row_case,
}


def _market(xp, rng):
    feats = rng.standard_normal((T_N, F_N)).astype(F32)
    ret = (rng.standard_normal(T_N) * 0.01).astype(F32)
    sign = np.where(rng.random(F_N) < 0.5, F32(-1), F32(1)).astype(F32)
    return EnvData(xp.asarray(feats), xp.asarray(ret), xp.asarray(np.array([-1, 0, 1], F32)), xp.asarray(sign))


def _env_case(xp, rng, P: int, padded: bool, op: str, cf: bool = True, mirror: bool = True):
    """An env op's buffers for P members of n envs over one shared market: states (bars, positions,
    holds, episode ends close), counters, actions, scales, seeds and gammas drawn apart per member."""
    n, A = 37, 3
    params = EnvParams(3, T_N - 3 - 7 - 1, 7, 4, True, 2.0, 1.0, 0, cf, mirror)
    data = _market(xp, rng)
    left = rng.integers(1, 8, (P, n)).astype(np.int32)
    t = rng.integers(3, 3 + params.n_starts, (P, n)).astype(np.int32)
    state = {
        "t": t,
        "start": t - (7 - left),
        "steps_left": left,
        "position": rng.choice(np.array([-1, 0, 1], F32), (P, n)),
        "hold": rng.integers(0, 6, (P, n)).astype(np.int32),
        "count": rng.integers(0, 2**40, (P, n), dtype=np.uint64),
    }
    b = {f"state.{k}": (ROW, _rows(xp, v, padded)) for k, v in state.items()}
    b["seed"] = (SCALAR, _scalar(xp, rng.integers(0, 2**63, P, dtype=np.uint64)))
    b["rows"] = (ROW, _rows(xp, np.full((P, n, STATE_DIM), np.nan, F32), padded))
    m = rows_per_step(A, cf, mirror) * n
    if op in ("step", "record_step"):
        b["reward"] = (ROW, _rows(xp, np.full((P, n), np.nan, F32), padded))
        b["done"] = (ROW, _rows(xp, np.full((P, n), np.nan, F32), padded))
        b["actions"] = (ROW, _rows(xp, rng.integers(-1, A + 1, (P, n)).astype(np.int32), padded))
        b["scale"] = (ROW, _rows(xp, rng.choice(np.array([1, 0.5, 0.25], F32), (P, n)), padded))
    if op == "record_step":
        b["gamma"] = (SCALAR, _scalar(xp, rng.uniform(0.9, 0.999, P).astype(F32)))
        b["discount"] = (ROW, _rows(xp, np.full((P, m), np.nan, F32), padded))
        b["obs"] = (ROW, _rows(xp, np.full((P, n, width(F_N, WINDOW)), np.nan, F32), padded))
        for k, shape, dt in (("obs", (m, STATE_DIM), F32), ("action", (m,), np.int32), ("reward", (m,), F32)):
            b[f"out.{k}"] = (ROW, _rows(xp, np.zeros((P, *shape), dt), padded))
        b["out.next_obs"] = (ROW, _rows(xp, np.zeros((P, m, STATE_DIM), F32), padded))
        b["out.done"] = (ROW, _rows(xp, np.zeros((P, m), F32), padded))
    if op == "act":
        b = {
            "actions": (ROW, _rows(xp, np.full((P, n), -7, np.int32), padded)),
            "q": (ROW, _rows(xp, rng.standard_normal((P, n, A)).astype(F32), padded)),
            "epsilon": (SCALAR, _scalar(xp, rng.uniform(0, 1, P).astype(F32))),
            "count": (ROW, _rows(xp, rng.integers(0, 2**40, (P, n), dtype=np.uint64), padded)),
            "seed": b["seed"],
        }

    def call(fam, a):
        st = EnvState(*(a[f"state.{k}"] for k in STATE)) if op != "act" else None
        d = EnvData(*(to_numpy(x) for x in data)) if fam is env_ref else data
        if op == "reset":
            fam.reset(st, a["rows"], params, a["seed"])
        elif op == "step":
            fam.step(st, a["rows"], a["reward"], a["done"], a["actions"], a["scale"], d, params, a["seed"])
        elif op == "record_step":
            out = Transitions(*(a[f"out.{k}"] for k in OUT))
            fam.record_step(out, a["discount"], a["gamma"], st, a["rows"], a["reward"], a["done"], a["obs"],
                            a["actions"], a["scale"], d, params, a["seed"], WINDOW)  # fmt: skip
        else:
            fam.act(a["actions"], a["q"], a["epsilon"], a["count"], a["seed"])

    return op, b, call


ENV_CASES = {
    **{op: partial(_env_case, op=op) for op in ("reset", "step", "record_step", "act")},
    "record_step plain": partial(_env_case, op="record_step", cf=False, mirror=False),
}


def _member(xp, b: dict, i: int) -> dict:
    """Copies of member ``i``'s buffers in the single op's form (``[1]`` device scalars)."""
    out = {}
    for k, (kind, a) in b.items():
        out[k] = a if kind == "shared" else a[i].copy() if kind == ROW else a[i : i + 1].copy()
    return out


def _stacked(b: dict) -> dict:
    return {k: a for k, (_, a) in b.items()}


def _assert_members_are_singles(xp, fam, make, rng, P: int, padded: bool) -> dict:
    """One stacked call of the op, and the single op on copies of each member's buffers: every
    buffer of member ``i`` equal bit for bit. Returns the stacked buffers after the call."""
    op, b, call = make(xp, rng, P, padded)
    singles = [_member(xp, b, i) for i in range(P)]
    stacked = _stacked(b)
    call(fam, stacked)
    for i, one in enumerate(singles):
        call(fam, one)
        for k, (kind, a) in b.items():
            if kind != "shared":
                got = a[i] if kind == ROW else a[i : i + 1]
                assert_bitwise(got, one[k], what=f"{op}: member {i} of {P}, {k}")
    return stacked


def _family(xp, name: str):
    from cudarl.backend import family

    return family(name, xp)


# --- CPU ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(AGENT_CASES))
@pytest.mark.parametrize("P", [1, 3])
def test_agent_twin_members_are_single_twins(rng, case, P):
    """CPU: each agent twin over P members equals the single twin on member ``i``'s copies."""
    _assert_members_are_singles(np, agent_ref, AGENT_CASES[case], rng, P, padded=P == 3)


@pytest.mark.parametrize("case", sorted(ENV_CASES))
@pytest.mark.parametrize("P", [1, 3])
def test_env_twin_members_are_single_twins(rng, case, P):
    """CPU: each env twin over P members equals the single twin on member ``i``'s copies."""
    _assert_members_are_singles(np, env_ref, ENV_CASES[case], rng, P, padded=P == 3)


def test_act_twin_support_per_member_and_swapped_members_differ(rng):
    """CPU: a support per member is each member's own; two members swapped give other outputs (the
    data are distinct, so a member read from another's slice would fail the tests above)."""
    _assert_members_are_singles(
        np, agent_ref, partial(_act_case, kind="c51_dueling", shared_support=False), rng, 3, True
    )
    op, b, call = _act_case(np, rng, 2, False, "c51")
    swapped = {k: (kind, a[::-1].copy() if kind != "shared" else a) for k, (kind, a) in b.items()}
    call(agent_ref, _stacked(b))
    call(agent_ref, _stacked(swapped))
    assert not np.array_equal(b["q"][1][0], swapped["q"][1][0])


def _schedules(P: int) -> list:
    """P distinct epsilon schedules (start, end, steps), from exploring everything to mostly greedy."""
    return [(1.0 - 0.7 * i / P, 0.05 + 0.2 * i / P, 9 + 3 * i) for i in range(P)]


def _assert_own_schedules_are_singles(xp, fam, rng, P: int, padded: bool, swap=None) -> dict:
    """``act_c51_dueling_members`` (member ``i``'s epsilon schedule at ``i`` of ``[P]`` arrays) against
    ``act_c51_dueling`` alone on copies of member ``i``'s buffers with its schedule, bit for bit (``swap``:
    two members' schedules traded in the stacked call, which must then fail). Returns the stacked buffers."""
    _, b, _ = _act_case(xp, rng, P, padded, "c51_dueling")
    sched = _schedules(P)
    order = list(range(P))
    if swap is not None:
        order[swap[0]], order[swap[1]] = order[swap[1]], order[swap[0]]
    table = [
        xp.asarray(np.array([sched[j][k] for j in order], dt))
        for k, dt in enumerate((np.float64, np.float64, np.int64))
    ]
    singles = [_member(xp, b, i) for i in range(P)]
    a = _stacked(b)
    keys = ("actions", "q", "head", "support", "env_count", "seed", "eps", "count", "arrivals")
    fam.act_c51_dueling_members(*(a[k] for k in keys), *table)
    for i, one in enumerate(singles):
        fam.act_c51_dueling(*(one[k] for k in keys), *sched[i])
        for k, (kind, arr) in b.items():
            if kind != "shared":
                got = arr[i] if kind == ROW else arr[i : i + 1]
                assert_bitwise(got, one[k], what=f"act_c51_dueling_members: member {i} of {P}, {k}")
    return a


@pytest.mark.parametrize("P", [1, 3])
def test_act_twin_with_each_members_epsilon_schedule_is_single_twins(monkeypatch, rng, P):
    """CPU: ``act_c51_dueling_members`` is the single twin with member i's schedule; members' epsilons
    differ; two schedules swapped fail; the launcher's arguments (recorded) are the kernel's C
    parameters, and it checks the schedule arrays."""
    from cudarl.ops import agent as agent_ops

    a = _assert_own_schedules_are_singles(np, agent_ref, rng, P, padded=P == 3)
    assert len(set(a["eps"].tolist())) == P
    if P > 1:
        with pytest.raises(AssertionError, match="member 0 of 3, (q|actions|eps)"):
            _assert_own_schedules_are_singles(np, agent_ref, rng, P, True, swap=(0, 2))
    _, b, _ = _act_case(np, rng, 3, False, "c51_dueling")
    a = _stacked(b)
    keys = ("actions", "q", "head", "support", "env_count", "seed", "eps", "count", "arrivals")
    with pytest.raises(ValueError, match=r"start: expected a C-contiguous float64 array \[3\]"):
        agent_ops.act_c51_dueling_members(*(a[k] for k in keys), np.ones(3, F32), np.ones(3), np.ones(3, np.int64))
    with pytest.raises(ValueError, match=r"steps: expected a C-contiguous int64 array \[3\]"):
        agent_ops.act_c51_dueling_members(*(a[k] for k in keys), np.ones(3), np.ones(3), np.ones(2, np.int64))
    launched = _recorded(monkeypatch, agent_ops)
    agent_ops.act_c51_dueling_members(*(a[k] for k in keys), np.ones(3), np.ones(3), np.ones(3, np.int64))
    ((_, op, grid, args),) = launched
    assert op == "act_c51_dueling_members" and grid[1] == 3
    assert_launch_args("agent", op, args)


def _recorded(monkeypatch, module) -> list:
    launched = []
    monkeypatch.setattr(
        module,
        "launch",
        lambda family, op, grid, block, args, stream=None: launched.append((family, op, grid, args)),
    )
    return launched


@pytest.mark.parametrize("padded", [False, True])
def test_launchers_pass_their_kernels_c_parameters(monkeypatch, rng, padded):
    """CPU: the stacked and single launches' arguments (recorded, not launched) are what the kernels
    declare, the grid's y is P (1 for the single forms), and the strides are the members' (0 single)."""
    from cudarl.ops import agent as agent_ops
    from cudarl.ops import env as env_ops

    got = {"agent": _recorded(monkeypatch, agent_ops), "env": _recorded(monkeypatch, env_ops)}
    for fam, cases, ops in (("agent", AGENT_CASES, agent_ops), ("env", ENV_CASES, env_ops)):
        for name in sorted(cases):
            op, b, call = cases[name](np, rng, 3, padded)
            call(ops, _stacked(b))
            call(ops, _member(np, b, 1))
            (_, op3, grid3, args3), (_, op1, grid1, args1) = got[fam][-2:]
            assert op3 == op1 and op3 in (op, "act")
            assert_launch_args(fam, op3, args3)
            assert_launch_args(fam, op1, args1)
            assert grid3[1] == 3 and grid1[1] == 1 and grid3[0] == grid1[0], (name, grid3, grid1)
            diff = [i for i, (x, y) in enumerate(zip(args3, args1, strict=True)) if isinstance(x, int) and x != y]
            assert all(args1[i] == 0 for i in diff), f"{name}: a single launch's stride is not 0"
            if op not in ("epsilon", "publish"):  # their members are one scalar or ring apart: no stride
                assert diff, f"{name}: no member stride passed"


def test_launchers_refuse_mixed_member_axes(rng):
    """CPU: the member axis on some buffers only, or scalars of another length, is refused."""
    from cudarl.ops import agent as agent_ops
    from cudarl.ops import env as env_ops

    _, b, call = _act_case(np, rng, 3, False, "c51")
    bad = {**_stacked(b), "seed": np.zeros(2, np.uint64)}
    with pytest.raises(ValueError, match="seed"):
        call(agent_ops, bad)
    bad = {**_stacked(b), "q": b["q"][1][0]}
    with pytest.raises(ValueError, match="member axis"):
        call(agent_ops, bad)
    _, b, call = _env_case(np, rng, 3, False, "step")
    bad = {**_stacked(b), "scale": b["scale"][1][0]}
    with pytest.raises(ValueError, match="member axis"):
        call(env_ops, bad)
    bad = {**_stacked(b), "seed": np.zeros(1, np.uint64)}
    with pytest.raises(ValueError, match="seed"):
        call(env_ops, bad)


# --- GPU ----------------------------------------------------------------------------------------------
def _gpu_vs_twin(cp, fam_name: str, make, P: int, padded: bool) -> None:
    """The kernel's stacked outputs against the stacked twin on host copies of the same inputs (outputs
    poisoned): bitwise but the fused act's Q (float32 rounding: assert_parity) and its actions, which
    must be the twin's epsilon-greedy rule applied to the kernel's Q."""
    op, b, call = make(cp, np.random.default_rng(P), P, padded)
    host = {k: (kind, to_numpy(a).copy()) for k, (kind, a) in b.items()}
    for k in ("q", "rows", "reward", "done", "obs", "discount", "eps"):  # outputs the op writes whole
        if k in b and not (op == "act" and k == "q"):
            poison(b[k][1])
    call(_family(cp, fam_name), _stacked(b))
    twin = agent_ref if fam_name == "agent" else env_ref
    call(twin, _stacked(host))
    for k, (_, a) in b.items():
        if op.startswith("act_") and k in ("q", "actions"):
            continue
        assert_bitwise(a, host[k][1], what=f"{op} P={P}: {k} against the twin")
    if op.startswith("act_"):
        assert_parity(b["q"][1], host["q"][1], what=f"{op} P={P}: q against the twin")
        actions = np.zeros(host["actions"][1].shape, np.int32)
        q = to_numpy(b["q"][1]).copy()
        env_ref.act(actions, q, host["eps"][1], host["env_count"][1], host["seed"][1])
        assert_bitwise(b["actions"][1], actions, what=f"{op} P={P}: actions, the twin's rule on the kernel's q")


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("case", sorted(AGENT_CASES))
def test_gpu_agent_members_are_single_launches(cp, rng, case, P, padded):
    """Each agent kernel over P members equals P single launches on copies (bitwise), and the twin."""
    _assert_members_are_singles(cp, _family(cp, "agent"), AGENT_CASES[case], rng, P, padded)
    _gpu_vs_twin(cp, "agent", AGENT_CASES[case], P, padded)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("padded", [False, True])
def test_gpu_act_with_each_members_epsilon_schedule_is_single_launches(cp, rng, P, padded):
    """act_c51_dueling_members (each member's epsilon schedule [P] on the device) equals act_c51_dueling
    launched alone on copies of member i's buffers with its schedule, bit for bit; its epsilon and counter
    equal the twin's, its Q within the single op's tolerance."""
    a = _assert_own_schedules_are_singles(cp, _family(cp, "agent"), rng, P, padded)
    _, b, _ = _act_case(np, np.random.default_rng(P), P, padded, "c51_dueling")
    dev = {k: cp.asarray(v) for k, (_, v) in b.items()}
    host = {k: v.copy() for k, (_, v) in b.items()}
    keys = ("actions", "q", "head", "support", "env_count", "seed", "eps", "count", "arrivals")
    sched = _schedules(P)
    for fam, d, xp in ((_family(cp, "agent"), dev, cp), (agent_ref, host, np)):
        table = [
            xp.asarray(np.array([s[k] for s in sched], dt)) for k, dt in enumerate((np.float64, np.float64, np.int64))
        ]
        fam.act_c51_dueling_members(*(d[k] for k in keys), *table)
    for k in ("eps", "count", "arrivals"):
        assert_bitwise(dev[k], host[k], what=f"P={P}: {k} against the twin")
    assert_parity(dev["q"], host["q"], what=f"P={P}: q against the twin")
    if P <= 3:
        assert len(set(to_numpy(a["eps"]).tolist())) == P


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
def test_gpu_act_support_per_member(cp, rng, P):
    """act_c51_dueling with a support per member ([P, K]) equals single launches on copies."""
    make = partial(_act_case, kind="c51_dueling", shared_support=False)
    _assert_members_are_singles(cp, _family(cp, "agent"), make, rng, P, True)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("case", sorted(ENV_CASES))
def test_gpu_env_members_are_single_launches(cp, rng, case, P, padded):
    """Each env kernel over P members equals P single launches on copies (bitwise), and the twin."""
    _assert_members_are_singles(cp, _family(cp, "env"), ENV_CASES[case], rng, P, padded)
    _gpu_vs_twin(cp, "env", ENV_CASES[case], P, padded)


# --- the object: StackedTradingEnv against P single TradingEnvs --------------------------------------
def _member_costs(P: int) -> list:
    """P members' own (cost_bps, slippage_bps), every rate distinct."""
    return [(0.5 + 1.5 * i, 0.25 * (i % 3)) for i in range(P)]


def _member_envs(P: int) -> list:
    """P members' own costs and reward options (EnvConfig overrides): rates and hold caps distinct, fills
    alternating, antisymmetric levels of three sizes."""
    out = []
    for i, (c, sl) in enumerate(_member_costs(P)):
        lv = 1.0 - 0.25 * (i % 3)
        out.append(
            dict(cost_bps=c, slippage_bps=sl, hold_cap=3 + i, fill=("open", "close")[i % 2], levels=(-lv, 0.0, lv))
        )
    return out


def _env_objects(backend: str, rng, P: int, cf: bool, mirror: bool, own: bool = False, swap=None):
    """A stacked env of P members and P single envs (member ``i``'s seed) over one market (``own``: member
    ``i``'s costs and reward options :func:`_member_envs`, the single env's too; ``swap``: two members'
    traded in the stacked env only)."""
    from dataclasses import replace

    from cudarl.env import EnvConfig, TradingEnv
    from cudarl.stacked_env import StackedTradingEnv

    close = (100 * np.exp(np.cumsum(rng.normal(0, 0.01, T_N)))).astype(F32)
    open_ = (close * (1 + rng.normal(0, 0.0025, T_N))).astype(F32)
    market = (open_, close, rng.normal(size=(T_N, F_N)).astype(F32), rng.random(F_N) < 0.5)
    cfg = EnvConfig(n_envs=37, episode_len=6, n_actions=3, cost_bps=2.0, hold_cap=4, counterfactual=cf, mirror=mirror)
    seeds = rng.integers(0, 2**63, P, dtype=np.uint64)
    kw = dict(window=WINDOW, backend=backend)
    configs = [replace(cfg, **o) for o in _member_envs(P)] if own else [cfg] * P
    order = list(range(P))
    if swap is not None:
        order[swap[0]], order[swap[1]] = order[swap[1]], order[swap[0]]
    stacked = StackedTradingEnv(P, *market, cfg, seeds=seeds, configs=[configs[j] for j in order], **kw)
    singles = [TradingEnv(*market, replace(c, seed=int(s)), **kw) for s, c in zip(seeds, configs, strict=True)]
    if swap is None:
        assert all(stacked.member_config(i) == s.config for i, s in enumerate(singles))
    return stacked, singles


def _assert_env_members(stacked, singles, what: str) -> None:
    for i, one in enumerate(singles):
        for k in ("rows", "obs", "reward", "done", "actions", "scale", *(f"state.{f}" for f in STATE)):
            get = (lambda e: getattr(e.state, k[6:])) if k.startswith("state.") else (lambda e: getattr(e, k))  # noqa: B023
            assert_bitwise(get(stacked)[i], get(one), what=f"{what}: member {i}, {k}")


def _env_stream(xp, stacked, singles, rng, steps: int = 9) -> None:
    """act, record_step (every step) and a plain step (every third) with fresh Q, epsilon, gamma and
    scales per member; every buffer compared after each call."""
    P, n, A = stacked.members, stacked.n_envs, stacked.n_actions
    out, disc = stacked.make_transitions(), xp.zeros((P, stacked.rows_per_step * n), F32)
    outs = [s.make_transitions() for s in singles]
    discs = [xp.zeros(s.rows_per_step * n, F32) for s in singles]
    _assert_env_members(stacked, singles, "after reset")
    for t in range(steps):
        q = xp.asarray(rng.standard_normal((P, n, A)).astype(F32))
        eps = xp.asarray(rng.uniform(0, 1, P).astype(F32))
        gamma = xp.asarray(rng.uniform(0.9, 0.999, P).astype(F32))
        stacked.act(q, eps)
        for i, s in enumerate(singles):
            s.act(q[i].copy(), eps[i : i + 1].copy())
        _assert_env_members(stacked, singles, f"act {t}")
        if t % 3 == 2:
            scale = xp.asarray(rng.choice(np.array([1, 0.5], F32), (P, n)))
            stacked.record(out)
            stacked.step(scale=scale)
            for i, s in enumerate(singles):
                s.record(outs[i])
                s.step(scale=scale[i].copy())
        else:
            stacked.record_step(out, disc, gamma)
            for i, s in enumerate(singles):
                s.record_step(outs[i], discs[i], gamma[i : i + 1].copy())
                assert_bitwise(disc[i], discs[i], what=f"record_step {t}: member {i}, discount")
        for i in range(P):
            for f in OUT:
                assert_bitwise(getattr(out, f)[i], getattr(outs[i], f), what=f"step {t}: member {i}, out.{f}")
        _assert_env_members(stacked, singles, f"step {t}")
    stacked.reset()
    for s in singles:
        s.reset()
    _assert_env_members(stacked, singles, "reset")


@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("cf,mirror", [(False, False), (True, True)])
def test_stacked_env_is_single_envs_on_numpy(rng, P, cf, mirror):
    """CPU: a StackedTradingEnv over P members equals P single TradingEnvs (member i's seed) through
    act, record_step, record + step and reset, every buffer bit for bit."""
    stacked, singles = _env_objects("numpy", rng, P, cf, mirror)
    _env_stream(np, stacked, singles, rng)


@pytest.mark.parametrize("P", [1, 3])
def test_stacked_env_members_with_their_own_costs_and_reward_options_are_single_envs_on_numpy(rng, P):
    """CPU: each member its own cost_bps, slippage_bps, hold_cap, fill and levels (rates and hold caps [P],
    returns and levels rows, read by env.record_step_members and env.step_members; record with the member's
    data and params): member i equals the single env of its config through act, record_step, record + step
    and reset, bit for bit; two members' settings swapped fail."""
    stacked, singles = _env_objects("numpy", rng, P, True, True, own=True)
    assert len(set(stacked.rates.tolist())) == P and len(set(stacked.hold_caps.tolist())) == P
    assert stacked.member_data.ret.ndim == (2 if P > 1 else 1) and stacked.member_data.levels.ndim == (
        2 if P > 1 else 1
    )
    _env_stream(np, stacked, singles, rng)
    if P > 1:
        stacked, singles = _env_objects("numpy", rng, P, True, True, own=True, swap=(0, 2))
        with pytest.raises(AssertionError, match="member (0|2)"):
            _env_stream(np, stacked, singles, rng)
    from dataclasses import replace

    from cudarl.env import EnvConfig
    from cudarl.stacked_env import StackedTradingEnv

    market = (np.full(T_N, 100, F32), np.full(T_N, 100, F32), np.zeros((T_N, F_N), F32), np.zeros(F_N, bool))
    cfg = EnvConfig(n_envs=4, episode_len=6)
    with pytest.raises(ValueError, match=r"configs\[1\]: members differ in env.episode_len"):
        StackedTradingEnv(2, *market, cfg, seeds=[1, 2], configs=[cfg, replace(cfg, episode_len=5)], backend="numpy")


def _assert_own_rates_are_singles(xp, fam, rng, P: int, padded: bool, op: str) -> None:
    """``env.<op>_members`` (member i's cost rate and hold cap at i of ``[P]`` arrays, its returns and levels
    rows of ``[P, T]`` and ``[P, A]``) against ``env.<op>`` alone on copies of member i's buffers with its
    data and params, bit for bit."""
    from cudarl.reference.env import with_rate

    _, b, call = _env_case(xp, rng, P, padded, op)
    params = EnvParams(3, T_N - 3 - 7 - 1, 7, 4, True, 2.0, 1.0, 0, True, True)  # _env_case's
    envs = _member_envs(P)
    member_params = [
        params._replace(cost_bps=e["cost_bps"], slippage_bps=e["slippage_bps"], hold_cap=e["hold_cap"]) for e in envs
    ]
    rates = xp.asarray(np.array([p.rate for p in member_params], F32))
    hold_caps = xp.asarray(np.array([p.hold_cap for p in member_params], np.int32))
    assert all(with_rate(params, r).rate == p.rate for r, p in zip(to_numpy(rates), member_params, strict=True))
    base = _market(np, np.random.default_rng(5))
    ret = (rng.standard_normal((P, T_N)) * 0.01).astype(F32)
    levels = np.array([e["levels"] for e in envs], F32)
    data = EnvData(*(xp.asarray(a) for a in (base.features, ret, levels, base.sign)))
    d = EnvData(*(to_numpy(x) for x in data)) if fam is env_ref else data
    singles = [_member(xp, b, i) for i in range(P)]
    a = _stacked(b)
    st = EnvState(*(a[f"state.{k}"] for k in STATE))
    if op == "step":
        fam.step_members(st, a["rows"], a["reward"], a["done"], a["actions"], a["scale"], d, params, a["seed"], rates,
                         hold_caps)  # fmt: skip
    else:
        out = Transitions(*(a[f"out.{k}"] for k in OUT))
        fam.record_step_members(out, a["discount"], a["gamma"], st, a["rows"], a["reward"], a["done"], a["obs"],
                                a["actions"], a["scale"], d, params, a["seed"], WINDOW, rates, hold_caps)  # fmt: skip
    for i, one in enumerate(singles):
        st1 = EnvState(*(one[f"state.{k}"] for k in STATE))
        d1 = d._replace(ret=d.ret[i].copy(), levels=d.levels[i].copy())
        if op == "step":
            fam.step(st1, one["rows"], one["reward"], one["done"], one["actions"], one["scale"], d1, member_params[i],
                     one["seed"])  # fmt: skip
        else:
            fam.record_step(Transitions(*(one[f"out.{k}"] for k in OUT)), one["discount"], one["gamma"], st1,
                            one["rows"], one["reward"], one["done"], one["obs"], one["actions"], one["scale"], d1,
                            member_params[i], one["seed"], WINDOW)  # fmt: skip
        for k, (kind, arr) in b.items():
            got = arr[i] if kind == ROW else arr[i : i + 1]
            assert_bitwise(got, one[k], what=f"{op}_members: member {i} of {P}, {k}")


@pytest.mark.parametrize("op", ["step", "record_step"])
def test_env_twin_with_each_members_rate_is_single_twins(monkeypatch, rng, op):
    """CPU: step_members and record_step_members twins are the single twins with member i's costs; the
    launchers pass their kernels' C parameters (recorded) and refuse rates of another length."""
    from cudarl.ops import env as env_ops

    _assert_own_rates_are_singles(np, env_ref, rng, 3, True, op)
    launched = _recorded(monkeypatch, env_ops)
    _assert_own_rates_are_singles(np, env_ops, rng, 3, False, op)  # launches recorded: compare nothing
    (_, name, grid, args), *_ = launched
    assert name == f"{op}_members" and grid[1] == 3
    assert_launch_args("env", name, args)
    assert args[-2:] == (T_N, 3)  # the returns' and levels' member strides: [P, T] and [P, A] rows
    _, b, _ = _env_case(np, rng, 3, False, "step")
    a = _stacked(b)
    st = EnvState(*(a[f"state.{k}"] for k in STATE))
    step_args = (st, a["rows"], a["reward"], a["done"], a["actions"], a["scale"], _market(np, rng))
    params = EnvParams(3, T_N - 3 - 7 - 1, 7, 4, True, 2.0, 1.0, 0, True, True)
    with pytest.raises(ValueError, match=r"rates: expected float32 \[3\]"):
        env_ops.step_members(*step_args, params, a["seed"], np.ones(2, F32), np.ones(3, np.int32))
    with pytest.raises(ValueError, match=r"hold_caps: expected int32 \[3\]"):
        env_ops.step_members(*step_args, params, a["seed"], np.ones(3, F32), np.ones(3, np.int64))


def test_stacked_env_refuses_bad_members_and_seeds(rng):
    from cudarl.stacked_env import StackedTradingEnv

    market = (np.full(T_N, 100, F32), np.full(T_N, 100, F32), np.zeros((T_N, F_N), F32), np.zeros(F_N, bool))
    with pytest.raises(ValueError, match="members"):
        StackedTradingEnv(0, *market, seeds=[], backend="numpy")
    with pytest.raises(ValueError, match="seeds"):
        StackedTradingEnv(2, *market, seeds=[1], backend="numpy")
    with pytest.raises(ValueError, match="seeds"):
        StackedTradingEnv(2, *market, seeds=[1, -1], backend="numpy")
    with pytest.raises(ValueError, match="seeds"):
        StackedTradingEnv(2, *market, seeds=[1, 2**64], backend="numpy")
    # Python ints on both sides of 2**63 (a trainer's stream_seed keys) are taken exactly, as uint64
    from cudarl.env import EnvConfig

    small = EnvConfig(n_envs=2, episode_len=8)
    big = StackedTradingEnv(2, *market, small, seeds=[0, 2**64 - 1], backend="numpy")
    assert big.seed.dtype == np.uint64 and [int(s) for s in big.seed] == [0, 2**64 - 1]


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
def test_gpu_stacked_env_is_single_envs(cp, rng, P):
    """A StackedTradingEnv over P members equals P single TradingEnvs on the GPU, every buffer bitwise."""
    stacked, singles = _env_objects("cupy", rng, P, True, True)
    _env_stream(cp, stacked, singles, rng, steps=6)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
def test_gpu_stacked_env_members_with_their_own_costs_and_reward_options_are_single_envs(cp, rng, P):
    """A StackedTradingEnv whose members each have their own costs, hold cap, fill and levels equals the single
    TradingEnvs of those configs on the GPU, every buffer bitwise."""
    stacked, singles = _env_objects("cupy", rng, P, True, True, own=True)
    _env_stream(cp, stacked, singles, rng, steps=6)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("op", ["step", "record_step"])
def test_gpu_env_with_each_members_rate_is_single_launches(cp, rng, P, padded, op):
    """env.step_members and env.record_step_members (each member's cost rate and hold cap [P], returns and
    levels rows on the device) equal env.step and env.record_step launched alone on copies of member i's
    buffers with its values, bitwise."""
    _assert_own_rates_are_singles(cp, _family(cp, "env"), rng, P, padded, op)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [3, 64])
def test_gpu_stacked_collect_graphed_equals_eager(cp, rng, P):
    """The stacked collect step's kernels (act_c51_dueling then record_step over P members) captured once
    and replayed equal eager launches bit for bit, with new heads and gammas written between replays."""
    from cudarl.graph import StepGraph
    from cudarl.ops import agent as agent_ops

    envs = [_env_objects("cupy", np.random.default_rng(5), P, True, True)[0] for _ in range(2)]
    n, A, K = envs[0].n_envs, envs[0].n_actions, 11
    sup = cp.asarray(np.linspace(-5, 5, K, dtype=F32))
    va, gamma = cp.zeros((P, n, (1 + A) * K), F32), cp.zeros(P, F32)
    bufs = []
    for e in envs:
        sched = (cp.zeros(P, F32), cp.asarray(np.arange(P, dtype=np.int64)), cp.zeros(P, np.uint32))
        bufs.append((cp.zeros((P, n, A), F32), sched, e.make_transitions(), cp.zeros((P, e.rows_per_step * n), F32)))

    def collect(e, b):
        q, sched, out, disc = b
        agent_ops.act_c51_dueling(e.actions, q, va, sup, e.state.count, e.seed, *sched, *SCHEDULE)
        e.record_step(out, disc, gamma)

    g = StepGraph(f"collect_members_{P}", [("collect", lambda: collect(envs[0], bufs[0]))], xp=cp)
    cp.cuda.Device().synchronize()  # construction (reset) ran on the default stream; the graph's is non-blocking
    g.capture()
    for t in range(5):
        va.set((rng.standard_normal(va.shape) * 3).astype(F32))
        gamma.set(rng.uniform(0.9, 0.999, P).astype(F32))
        cp.cuda.Device().synchronize()
        g.replay()
        g.synchronize()
        collect(envs[1], bufs[1])
        cp.cuda.Device().synchronize()
        _assert_env_members(envs[1], [_Member(envs[0], i) for i in range(P)], f"replay {t}")
        for x, y in zip(bufs[0][2] + (bufs[0][3], bufs[0][0]), bufs[1][2] + (bufs[1][3], bufs[1][0]), strict=True):
            assert_bitwise(x, y, what=f"replay {t}: transitions, discounts, q")


class _Member:
    """Member ``i``'s views of a stacked env, in a single env's attribute names (for the comparisons)."""

    def __init__(self, env, i: int):
        self.state = EnvState(*(f[i] for f in env.state))
        for k in ("rows", "obs", "reward", "done", "actions", "scale"):
            setattr(self, k, getattr(env, k)[i])
