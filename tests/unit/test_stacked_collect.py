"""The joined collect step (issue 23's agent axis, stage 6b: docs/perf-notes.md "The agent axis, in stages"):
:meth:`cudarl.stacked_agent.StackedLearner.collect_phases` over a
:class:`cudarl.stacked_env.StackedTradingEnv` and a stacked replay is P single agents' collect steps
(:meth:`cudarl.agent.Agent.collect_phases`), member ``i`` the agent of ``run.seed = seeds[i]`` acting in
the env of ``env.seed = env_seeds[i]`` into the replay of ``seed = seeds[i]``, bit for bit after every
step: the acting Q values, the actions, the epsilon schedule, the env's state, rows, windows, rewards and
ends, the transitions and discounts, and the replay's rows, tree and counters.

CPU (NumPy backend): P = 1 and 3, n-step returns and counterfactual rows (their own next state),
an epsilon schedule that reaches its greedy end inside the run. GPU (marked): the reference network
(66 inputs, 256-256, 51 atoms) at P = 1, 3, 64 against single agents, and the captured step against the
eager one.
"""

from dataclasses import replace

import numpy as np
import pytest
from test_stacked_agent import _config, _seeds

from cudarl.agent import Agent
from cudarl.backend import to_numpy
from cudarl.env import TradingEnv
from cudarl.graph import StepGraph
from cudarl.replay import PrioritizedReplay
from cudarl.stacked_agent import StackedLearner, reference_collect_config, stacked_replay
from cudarl.stacked_env import StackedTradingEnv
from cudarl.testing import assert_bitwise

F32 = np.float32
T_N = 90  # bars of the shared market
ENV = {"n_envs": 5, "episode_len": 6, "cost_bps": 2.0, "hold_cap": 4}
ACT = {"eps_start": 0.9, "eps_end": 0.05, "eps_steps": 4}  # greedy actions inside the run


def _market(rng, features: int):
    close = (100 * np.exp(np.cumsum(rng.normal(0, 0.01, T_N)))).astype(F32)
    open_ = (close * (1 + rng.normal(0, 0.0025, T_N))).astype(F32)
    return open_, close, rng.normal(size=(T_N, features)).astype(F32), rng.random(features) < 0.5


def _build(xp, cfg, P, seeds, env_seeds, members, rng, features=3):
    """The stacked learner, env and replay with their collect graph, and the single agents, envs and
    replays of ``members`` with theirs (one market for all)."""
    backend = "numpy" if xp is np else "cupy"
    market, kw = _market(rng, features), dict(window=cfg.net.window, backend=backend)
    env = StackedTradingEnv(P, *market, cfg.env, seeds=np.asarray(env_seeds, np.uint64), **kw)
    rows = env.rows_per_step * env.n_envs
    learner = StackedLearner(cfg, env.obs_dim, env.n_actions, seeds, xp)
    replay = stacked_replay(cfg, rows, seeds, backend=backend)
    out, disc = env.make_transitions(), xp.zeros((P, rows), F32)
    stacked = StepGraph("collect_stacked", learner.collect_phases(env, replay, out, disc), xp=xp)
    singles = []
    for i in members:
        c = replace(cfg, run=replace(cfg.run, seed=int(seeds[i])), env=replace(cfg.env, seed=int(env_seeds[i])))
        e = TradingEnv(*market, c.env, **kw)
        agent = Agent(c, e.obs_dim, e.n_actions, e.n_envs, xp)
        r = c.replay
        rb = PrioritizedReplay(
            r.capacity, 4, n_step=r.n_step, n_envs=rows, alpha=r.alpha, eps=r.eps, beta0=r.beta0,
            beta_final=r.beta_final, beta_steps=r.beta_steps, seed=int(seeds[i]), backend=backend,
            store_next_obs=c.env.counterfactual,
        )  # fmt: skip
        o, d = e.make_transitions(), xp.zeros(rows, F32)
        g = StepGraph(f"collect_{i}", agent.collect_phases(e, rb, o, d), xp=xp)
        singles.append((i, agent, e, rb, o, d, g))
    return (learner, env, replay, out, disc, stacked), singles


def _assert_member(stacked, single, what):
    learner, env, replay, out, disc, _ = stacked
    i, agent, e, rb, o, d, _ = single
    w = f"{what}, member {i}"
    pairs = [
        ("acting Q", learner.q_act[i], agent.buffers.q_act),
        ("actions", env.actions[i], e.actions),
        ("env rows", env.rows[i], e.rows),
        ("env windows", env.obs[i], e.obs),
        ("rewards", env.reward[i], e.reward),
        ("episode ends", env.done[i], e.done),
        ("discounts", disc[i], d),
        *((f"env state.{f}", getattr(env.state, f)[i], getattr(e.state, f)) for f in env.state._fields),
        *((f"transitions.{f}", getattr(out, f)[i], getattr(o, f)) for f in out._fields),
        *((f"agent {n}", learner.scalars.view(n)[i : i + 1], agent.scalars.view(n)) for n in agent.scalars.names),
    ]
    for f in ("obs", "action", "reward", "discount", "tree", "owner", "added", "step", "max_q", "status", "seed"):
        pairs.append((f"replay {f}", getattr(replay.bufs, f)[i], getattr(rb.bufs, f)))
    if rb.store_next_obs:
        pairs.append(("replay next_obs", replay.bufs.next_obs[i], rb.bufs.next_obs))
    for name, got, want in pairs:
        got, want = to_numpy(got), to_numpy(want)
        assert_bitwise(got.reshape(want.shape), want, what=f"{w}: {name}")


def _run_and_compare(xp, cfg, P, members, rng, steps, features=3, sync=lambda: None):
    seeds, env_seeds = _seeds(rng, P), [int(s) for s in rng.integers(0, 2**63, P, dtype=np.uint64)]
    stacked, singles = _build(xp, cfg, P, seeds, env_seeds, members, rng, features)
    graphs = [stacked[-1], *(s[-1] for s in singles)]
    sync()  # construction (reset) ran on the default stream; the graphs' are non-blocking
    for g in graphs:  # on the GPU before any eager run; on NumPy the phases run in order
        g.capture()
    for t in range(1, steps + 1):
        for g in graphs:
            g.replay()
        sync()
        for s in singles:
            _assert_member(stacked, s, f"collect step {t}")
    return stacked


# --- CPU ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize(
    "over",
    [{}, {"env": {"counterfactual": True, "mirror": True}, "replay": {"n_step": 1}}],
    ids=["n-step", "counterfactual"],
)
def test_members_collect_as_single_agents_bitwise(rng, P, over):
    cfg = _config(env={**ENV, **over.get("env", {})}, agent=ACT, replay=over.get("replay", {}))
    learner, env, replay, *_ = _run_and_compare(np, cfg, P, list(range(P)), rng, steps=9)
    assert np.all(replay.added() == 9 * env.rows_per_step * env.n_envs), "every step's rows are in every replay"
    assert np.all(to_numpy(learner.scalars.view("epsilon")) == np.float32(ACT["eps_end"])), "the greedy end reached"
    if P > 1:
        acts = to_numpy(env.actions).reshape(P, -1)
        assert len({a.tobytes() for a in acts}) == P, "members with their own seeds act apart"


def test_members_collect_with_a_window_of_bars(rng):
    cfg = _config(env=ENV, agent=ACT, net={"window": 3, "hidden": [16]})
    _run_and_compare(np, cfg, 3, [0, 1, 2], rng, steps=5, features=4)


@pytest.mark.parametrize(
    "over, bad",
    [({"agent": {"act_by": "cvar"}}, "act_by"), ({"agent": {"cql_alpha": 0.1}}, "cql_alpha")],
)
def test_only_the_reference_collect_step_is_stacked(rng, over, bad):
    cfg = _config(env=ENV, **over)
    with pytest.raises(ValueError, match=bad):
        reference_collect_config(cfg)


def test_collect_phases_refuse_single_objects(rng):
    cfg = _config(env=ENV)
    learner = StackedLearner(cfg, 7, 3, [1, 2], np)
    market = _market(rng, 3)
    single = TradingEnv(*market, cfg.env, backend="numpy")
    replay = stacked_replay(cfg, single.rows_per_step * single.n_envs, [1, 2], backend="numpy")
    with pytest.raises(ValueError, match="stacked env of 2 members"):
        learner.collect_phases(single, replay, single.make_transitions(), np.zeros(5, F32))


# --- GPU ------------------------------------------------------------------------------------------------
def _reference_cfg():
    """The reference network (64 features + 2 of position, 256-256, 51 atoms), 64 envs a member."""
    return _config(
        net={"hidden": [256, 256], "atoms": 51},
        env={**ENV, "n_envs": 64},
        agent={**ACT, "batch_size": 512},
        replay={"capacity": 4096},
    )


@pytest.mark.gpu
@pytest.mark.parametrize("P, members", [(1, [0]), (3, [0, 1, 2]), (64, [0, 37, 63])])
def test_gpu_members_collect_as_single_agents_bitwise(cp, rng, P, members):
    """Every graph captured before any eager run; member ``i`` against its agent after each step."""
    sync = cp.cuda.Device().synchronize
    _run_and_compare(cp, _reference_cfg(), P, members, rng, steps=8, features=64, sync=sync)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3, 64])
def test_gpu_stacked_collect_graphed_equals_eager(cp, P):
    """Two stacked collect steps of the same seeds and market: one captured before any eager run and
    replayed, one run eagerly; every member buffer equal after each step, bit for bit."""
    cfg, rng = _reference_cfg(), np.random.default_rng(11)
    seeds, env_seeds = _seeds(rng, P), [int(s) for s in rng.integers(0, 2**63, P, dtype=np.uint64)]
    runs = [_build(cp, cfg, P, seeds, env_seeds, [], np.random.default_rng(5), features=64)[0] for _ in range(2)]
    cp.cuda.Device().synchronize()
    runs[0][-1].capture()
    for t in range(1, 7):
        runs[0][-1].replay()
        runs[1][-1].run_eager()
        cp.cuda.Device().synchronize()
        (lg, eg, rg, og, dg, _), (le, ee, re, oe, de, _) = runs
        for name, x, y in (
            ("acting Q", lg.q_act, le.q_act),
            ("actions", eg.actions, ee.actions),
            ("env rows", eg.rows, ee.rows),
            ("env windows", eg.obs, ee.obs),
            ("discounts", dg, de),
            ("epsilon", lg.scalars.view("epsilon"), le.scalars.view("epsilon")),
            *((f"transitions.{f}", getattr(og, f), getattr(oe, f)) for f in og._fields),
            *((f"replay {f}", getattr(rg.bufs, f), getattr(re.bufs, f)) for f in ("obs", "action", "reward", "tree")),
        ):
            assert_bitwise(x, y, what=f"collect step {t}: {name}, graphed against eager")
