"""Populations (cudarl.population): P agents in one train graph and one collect graph; member i is
bitwise the agent trained alone, on the NumPy backend (always) and the GPU (marked)."""

from dataclasses import replace

import numpy as np
import pytest
from test_trainer import gpu_small, small

from cudarl.backend import to_numpy
from cudarl.config import from_dict
from cudarl.policy import EVAL_ENVS
from cudarl.population import Population, can_share, memory_per_member
from cudarl.trainer import Trainer

STEPS = 40
QUIET = dict(echo=lambda m: None)


def variants(base):
    """Three members that differ in seed, learning rate, gamma, tau, epsilon, PER alpha and beta, cost,
    shrink-and-perturb and PopArt's warm-up (the last two: work the host launches between updates), and
    input noise (a phase only one member's step has)."""
    over = [
        {},
        {"run": {"seed": 7}, "optim": {"lr": 3e-4}, "agent": {"gamma": 0.95, "tau_start": 0.01, "tau_end": 0.01}},
        {
            "run": {"seed": 11},
            "optim": {"lr": 5e-5, "shrink_every": 15},  # host-driven work between updates
            "agent": {"eps_start": 0.5, "eps_steps": 100, "popart_warmup": 20, "input_noise": 0.5},
            "replay": {"alpha": 0.4, "beta0": 0.6},
            "env": {"cost_bps": 3.0},
        },
    ]
    return [from_dict(o, base=base) for o in over]


def assert_same_agent(member: Trainer, alone: Trainer, *, eval_too: bool = True) -> None:
    """Bitwise: losses of every update, online and target weights, Adam's moments, replay priorities,
    and the validation evaluation's numbers."""
    assert member.step == alone.step and member.collect_steps == alone.collect_steps
    assert len(member.losses) == len(alone.losses) > 0 and member.losses == alone.losses
    for a, b in (
        (member.agent.online.params, alone.agent.online.params),
        (member.agent.target.params, alone.agent.target.params),
        (member.agent.adam.m, alone.agent.adam.m),
        (member.agent.adam.v, alone.agent.adam.v),
    ):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    np.testing.assert_array_equal(member.replay.priorities(), alone.replay.priorities())
    if eval_too:
        assert member.last_eval["sharpe"] == alone.last_eval["sharpe"]
        assert member.last_eval["total_return"] == alone.last_eval["total_return"]


def population_and_alone(configs, steps=STEPS):
    pop = Population(configs, run_dirs=[False] * len(configs), **QUIET)
    summaries = pop.run(steps)
    alone = []
    for c in configs:
        t = Trainer(c, run_dir=False, **QUIET)
        t.run(steps)
        alone.append(t)
    return pop, summaries, alone


def test_population_of_one_is_the_single_agent():
    pop, summaries, (alone,) = population_and_alone([small()])
    assert len(summaries) == 1 and summaries[0]["policy"]["sharpe"] == alone.last_eval["sharpe"]
    assert_same_agent(pop.members[0], alone)


def test_each_member_is_that_agent_trained_alone():
    configs = variants(small())
    pop, summaries, alone = population_and_alone(configs)
    assert len(summaries) == 3
    for m, a in zip(pop.members, alone, strict=True):
        assert_same_agent(m, a)
    # the members really differ (a population that trained one agent three times would pass the above
    # only if every alone run were equal too)
    assert len({tuple(m.losses) for m in pop.members}) == 3
    # one device feature matrix for all, not P copies
    assert all(m.env.data.features is pop.members[0].env.data.features for m in pop.members)
    assert all(m.env.windows.features is pop.members[0].env.data.features for m in pop.members)


def test_can_share_allows_settings_and_refuses_shapes():
    base = small()
    a, b, c = variants(base)
    assert can_share(a, b) and can_share(a, c)
    wider = from_dict({"net": {"hidden": [64, 32]}}, base=base)
    more_envs = from_dict({"env": {"n_envs": 16}}, base=base)
    other_data = from_dict({"data": {"source": "builtin:regime?n=1600"}}, base=base)
    other_loop = from_dict({"agent": {"updates_per_collect": 2}}, base=base)
    for other in (wider, more_envs, other_data, other_loop):
        assert not can_share(base, other)
    with pytest.raises(ValueError, match=r"net\.hidden"):
        Population([base, wider], run_dirs=[False, False], **QUIET)


def test_member_run_directories_and_progress(tmp_path):
    configs = [replace(c, run=replace(c.run, eval_every=STEPS // 2)) for c in variants(small())[:2]]
    seen = []
    pop = Population(configs, run_dirs=[tmp_path / "a", tmp_path / "b"], **QUIET)
    pop.run(STEPS, progress=lambda i, step, row, ev: seen.append((i, step)))
    for d in ("a", "b"):
        assert (tmp_path / d / "checkpoints" / "latest.npz").is_file()
        assert sorted(p.name for p in (tmp_path / d / "eval").iterdir()) == ["val-00000020", "val-00000040"]
    assert {i for i, _ in seen} == {0, 1} and (1, STEPS) in seen
    evals = pop.evaluate("test")
    assert len(evals) == 2 and evals[0]["policy"]["sharpe"] != evals[1]["policy"]["sharpe"]
    one = pop.members[0].env.data.features  # the evaluation envs read the one feature matrix too
    assert all(e.data.features is one and e.windows.features is one for m in pop.members for e in m._eval_envs.values())


def test_an_interrupted_population_saves_every_member(tmp_path):
    """SIGTERM during a population's run: every member writes latest.npz at the same update, then
    Interrupted (exit code 143); each checkpoint resumes that member."""
    import signal

    from cudarl.interrupt import Interrupted

    pop = Population(variants(small())[:2], run_dirs=[tmp_path / "a", tmp_path / "b"], **QUIET)

    def progress(i, step, row, ev):
        if i == 1 and step == 20:
            signal.raise_signal(signal.SIGTERM)  # the run's handler sets its stop flag

    with pytest.raises(Interrupted) as e:
        pop.run(STEPS, progress=progress)
    assert e.value.exit_code == 143
    for d, m in zip("ab", pop.members, strict=True):
        resumed = Trainer.resume(tmp_path / d / "checkpoints" / "latest.npz", run_dir=tmp_path / f"{d}2", **QUIET)
        assert resumed.step == m.step == 20
        np.testing.assert_array_equal(resumed.agent.online.params, m.agent.online.params)


@pytest.mark.parametrize("action", ["stop", "rollback"])
def test_a_member_the_guard_stops_leaves_and_the_others_go_on(action):
    """NaN in member 1's replay: its guard rolls back (recapturing the population's graph) and stops it,
    as alone; member 0 trains on to the end, bitwise as alone."""
    guard_stops_one_member(small(guard={"action": action, "max_rollbacks": 2}))


def guard_stops_one_member(cfg):
    from cudarl.reference.window import POSITION

    configs = [cfg, from_dict({"run": {"seed": 3}}, base=cfg)]
    pop = Population(configs, run_dirs=[False, False], **QUIET)
    alone = Trainer(configs[0], run_dir=False, **QUIET)
    pop.run(30)
    alone.run(30)
    pop.members[1].replay.bufs.obs[:, POSITION] = np.nan
    summaries = pop.run(60)
    alone.run(60)
    assert "loss = nan" in summaries[1]["guard_stop"] and pop.active() == [0]
    assert pop.members[1].events[-1]["action"] == "stop" and pop.members[1].step < 60
    assert summaries[0]["step"] == 60
    assert_same_agent(pop.members[0], alone)


def test_memory_per_member_is_measured_and_grows_with_the_replay():
    small_replay = memory_per_member(small())
    big_replay = memory_per_member(small(replay={"capacity": 4 * 4096}))
    assert 0 < small_replay < big_replay


@pytest.mark.slow
def test_bench_population_pytorch_vmap_arm_computes_the_single_step():
    """tools/bench_population.py's PyTorch arm: one agent of the vmapped loss and gradient equals the plain
    PyTorch step (tools/bench_step.py) on that agent's weights and batch (float32, CPU). Skipped without torch."""
    pytest.importorskip("torch")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from bench_population import vmap_check

    diffs = vmap_check("cpu", P=3, capacity=2048)
    assert diffs["loss_rel_diff"] < 1e-6 and diffs["priority_rel_diff"] < 1e-5 and diffs["grad_rel_diff"] < 1e-5, diffs


# --- GPU (the coordinator runs these) ------------------------------------------------------------
def gpu_population_and_alone(configs, steps=60):
    pop = Population(configs, run_dirs=[False] * len(configs), **QUIET)
    pop.run(steps)
    alone = []
    for c in configs:
        t = Trainer(c, run_dir=False, **QUIET)  # grid_barrier on, as a single run has it
        t.run(steps)
        alone.append(t)
    return pop, alone


@pytest.mark.gpu
def test_gpu_population_of_one_is_the_single_agent():
    pop, (alone,) = gpu_population_and_alone([gpu_small()])
    assert pop.members[0].cfg.run.grid_barrier  # P = 1 keeps the single agent's launches
    assert_same_agent(pop.members[0], alone)


@pytest.mark.gpu
def test_gpu_each_member_is_that_agent_trained_alone():
    """Three members on parallel branches of one graph, each bitwise its agent alone (which runs with
    run.grid_barrier on; the members with it off: the same bits)."""
    pop, alone = gpu_population_and_alone(variants(gpu_small(agent={"popart": True})))
    for m, a in zip(pop.members, alone, strict=True):
        assert not m.cfg.run.grid_barrier
        assert_same_agent(m, a)
    assert len({tuple(m.losses) for m in pop.members}) == 3


@pytest.mark.gpu
@pytest.mark.parametrize("action", ["stop", "rollback"])
def test_gpu_a_member_the_guard_stops_leaves_and_the_others_go_on(action):
    guard_stops_one_member(gpu_small(guard={"action": action, "max_rollbacks": 2, "snapshot_every": 20}))


@pytest.mark.gpu
def test_gpu_population_memory_per_member_is_measured():
    assert memory_per_member(gpu_small()) > 0


@pytest.mark.gpu
def test_gpu_population_close_releases_its_cublas_handles():
    """Every stream of a population (its members' side streams, the branches) holds a cuBLAS handle and a
    32 MiB workspace that cudarl.blas keeps for the process; close() gives them back. Not the handle of
    the legacy default stream (pointer 0): the networks' cuBLASLt plans are made on the current stream
    when they are built, outside any trainer stream, and that handle serves the whole process (on an
    H200 at 3795f4e it was the one handle left after close() besides those of a member the caller held)."""
    from cudarl import blas

    before = blas.prepared() | {0}  # the legacy default stream's handle: one per process, not the population's
    pop = Population([gpu_small()] * 2, run_dirs=[False, False], **QUIET)
    pop.run(5)
    assert len(blas.prepared() - before) >= 4
    pop.close()
    assert not blas.prepared() - before


def test_close_releases_the_streams_once_no_member_is_left_alive(monkeypatch):
    """close() releases the cuBLAS handles of streams whose owners (each member's agent and side streams)
    are collected, so no member may still be referenced when it does: the loop that dropped the members'
    graphs kept the last member in close()'s frame, and on an H200 at 6fab362 that member's nine
    streams kept their handles and 32 MiB workspaces (test_gpu_population_close_releases_its_cublas_handles)."""
    import gc
    import weakref

    import cudarl.population as population_mod

    pop = Population([small()] * 2, run_dirs=[False, False], **QUIET)
    pop.run(3)
    owners = [weakref.ref(m.agent) for m in pop.members] + [weakref.ref(s) for s in pop._branches]
    alive_at_release = []

    def release(gpu):
        gc.collect()
        alive_at_release.append([r() is not None for r in owners])

    monkeypatch.setattr(population_mod, "_release_dead_streams", release)
    pop.close()
    assert alive_at_release == [[False] * len(owners)]


# --- run.population = "joined": the agent axis (docs/perf-notes.md, "The agent axis, in stages", 6b) ----
def joined(configs):
    """``configs`` with ``run.population = "joined"``."""
    return [replace(c, run=replace(c.run, population="joined")) for c in configs]


def joined_variants(base):
    """Three members that differ in what a joined population lets differ: the seeds of the network and
    replay (run.seed) and of the envs (env.seed), and host-side settings (evaluation interval, moving
    average of the weights, guard)."""
    over = [
        {},
        {"run": {"seed": 7, "eval_every": 20}, "env": {"seed": 3}, "eval": {"average_halflife": 20}},
        {"run": {"seed": 11}, "env": {"seed": 12}, "guard": {"spike_factor": 50.0}},
    ]
    return joined([from_dict(o, base=base) for o in over])


def assert_joined_member_is_alone(pop: Population, i: int, alone: Trainer) -> None:
    """Member ``i`` of a joined population against the agent trained alone, bitwise: every update's loss,
    the learner's member ``i`` (online and target weights, Adam's moments, the replay's sum tree) and the
    member's own networks (synchronised for its evaluations), and the validation evaluation."""
    m, L = pop.members[i], pop.learner
    assert m.step == alone.step and m.collect_steps == alone.collect_steps
    assert len(m.losses) == len(alone.losses) > 0
    np.testing.assert_array_equal(m.losses, alone.losses, err_msg=f"member {i}: losses")  # NaN where a guard tripped
    for name, got, want in (
        ("online", L.online.params[i], alone.agent.online.params),
        ("target", L.target.params[i], alone.agent.target.params),
        ("Adam m", L.adam.m[i], alone.agent.adam.m),
        ("Adam v", L.adam.v[i], alone.agent.adam.v),
        ("sum tree", pop.replay.bufs.tree[i], alone.replay.bufs.tree),
        ("member's online", m.agent.online.params, alone.agent.online.params),
        ("member's target", m.agent.target.params, alone.agent.target.params),
    ):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want), err_msg=f"member {i}: {name}")
    assert m.last_eval["sharpe"] == alone.last_eval["sharpe"]
    assert m.last_eval["total_return"] == alone.last_eval["total_return"]
    assert [r["step"] for r in m.history] == [r["step"] for r in alone.history]


@pytest.mark.parametrize("P", [1, 3])
def test_joined_members_are_those_agents_trained_alone(P):
    """run.population = "joined": one StackedLearner train step and its collect step for every member;
    member i is the Trainer of its config alone (the branches mode's oracle), bit for bit."""
    configs = joined_variants(small())[:P]
    pop = Population(configs, run_dirs=[False] * P, **QUIET)
    assert pop.mode == "joined" and pop.learner.members == P and pop.env.members == P
    summaries = pop.run(STEPS)
    assert len(summaries) == P
    for i, c in enumerate(configs):
        alone = Trainer(replace(c, run=replace(c.run, population="branches")), run_dir=False, **QUIET)
        alone.run(STEPS)
        assert summaries[i]["policy"]["sharpe"] == alone.last_eval["sharpe"]
        assert_joined_member_is_alone(pop, i, alone)
    if P > 1:
        assert len({tuple(m.losses) for m in pop.members}) == P
        assert pop.env.windows.features is pop.members[0].env.data.features  # one feature matrix


def test_joined_population_is_the_branches_population():
    """The same three members as branches and as joined: the same losses and weights, bit for bit."""
    configs = joined_variants(small())
    a = Population(
        [replace(c, run=replace(c.run, population="branches")) for c in configs], run_dirs=[False] * 3, **QUIET
    )
    b = Population(configs, run_dirs=[False] * 3, **QUIET)
    a.run(STEPS // 2)
    b.run(STEPS // 2)
    assert a.mode == "branches" and a.learner is None
    for i, (x, y) in enumerate(zip(a.members, b.members, strict=True)):
        assert x.losses == y.losses
        np.testing.assert_array_equal(x.agent.online.params, b.learner.online.params[i])
    evals_a, evals_b = a.evaluate("val"), b.evaluate("val")
    sharpes = [e["policy"]["sharpe"] for e in evals_a]
    assert all(np.isfinite(sharpes)) and sharpes == [e["policy"]["sharpe"] for e in evals_b]


def test_joined_population_runs_every_batched_gemm_under_net_batched_algo(batched_algos):
    """net.batched_algo = "probe" through the trainer's joined mode: the learner's stacked networks pass it to
    every batched GEMM (a GPU plan then probes the batched problem's algorithms); on NumPy the members'
    losses and weights are the default's, bit for bit."""
    algos = batched_algos
    configs = joined_variants(small())[:2]
    probe = joined([from_dict({"net": {"batched_algo": "probe"}}, base=c) for c in configs])
    a = Population(probe, run_dirs=[False] * 2, **QUIET)
    a.run(STEPS // 2)
    assert a.learner.online.batched_algo == "probe" and algos and set(algos) == {"probe"}
    algos.clear()
    b = Population(configs, run_dirs=[False] * 2, **QUIET)
    b.run(STEPS // 2)
    assert set(algos) == {"single"}
    for i, (x, y) in enumerate(zip(a.members, b.members, strict=True)):
        assert x.losses == y.losses and len(x.losses) > 0
        np.testing.assert_array_equal(a.learner.online.params[i], b.learner.online.params[i])


@pytest.mark.parametrize(
    "over, match",
    [
        ({"net": {"layernorm": True}}, r'run.population = "joined".*layernorm'),
        ({"agent": {"act_by": "cvar"}}, "act_by"),
        ({"agent": {"aux": ["horizons"]}}, "agent.aux"),
        ({"agent": {"input_noise": 0.5}}, "agent.input_noise"),
        ({"run": {"record": "x.safetensors"}}, "run.record"),
    ],
)
def test_joined_refuses_what_it_does_not_build(over, match):
    cfg = joined([from_dict(over, base=small())])[0]
    with pytest.raises(ValueError, match=match):
        Population([cfg, cfg], run_dirs=[False, False], **QUIET)


def test_joined_refuses_members_that_differ_in_a_kernel_constant():
    a, b = joined([small(), from_dict({"agent": {"kappa": 2.0}}, base=small())])
    with pytest.raises(ValueError, match=r"agent\.kappa.*JOINED_MAY_DIFFER"):
        Population([a, b], run_dirs=[False, False], **QUIET)
    from cudarl.config import ConfigError

    with pytest.raises(ConfigError, match="population must be branches or joined"):
        from_dict({"run": {"population": "vmap"}}, base=small())


def test_joined_guard_stops_a_member_and_the_others_go_on():
    """NaN in joined member 1's replay rows: its guard rolls it back twice (each lowering its own learning
    rate) and then stops it, saying why; member 0 trains on to the end, bitwise as alone. (Member 1 against
    its Trainer alone: tests/unit/test_population_guard.py.)"""
    from cudarl.reference.window import POSITION

    base = small(guard={"action": "rollback", "max_rollbacks": 2})
    configs = joined([base, from_dict({"run": {"seed": 3}}, base=base)])
    pop = Population(configs, run_dirs=[False, False], **QUIET)
    alone = Trainer(base, run_dir=False, **QUIET)
    pop.run(30)
    alone.run(30)
    pop.replay.bufs.obs[1, :, POSITION] = np.nan
    summaries = pop.run(60)
    alone.run(60)
    assert "loss = nan" in summaries[1]["guard_stop"] and "after 2 rollbacks" in summaries[1]["guard_stop"]
    assert pop.active() == [0] and pop.members[1].step < 60 and summaries[0]["step"] == 60
    ev = pop.members[1].events
    assert [(e["event"], e.get("action"), e["member"]) for e in ev] == [
        ("guard", "rollback", 1), ("rollback", None, 1), ("guard", "rollback", 1), ("rollback", None, 1),
        ("guard", "stop", 1),
    ]  # fmt: skip
    lr = base.optim.lr
    assert [pop.learner.adam.member_schedule(i).lr for i in (0, 1)] == [lr, lr * base.guard.lr_factor**2]
    assert_joined_member_is_alone(pop, 0, alone)


def test_a_joined_member_allocates_no_learning_state_of_its_own():
    """A joined member is a Trainer(learner_state="external"): no replay, graphs or transition buffers of
    its own, an acting workspace of the evaluation's rows; the member's bytes (tracemalloc, as
    Population.member_bytes counts them) are less than a branches member's by more than its replay's."""
    import tracemalloc

    cfg = small(replay={"capacity": 4 * 4096})
    tracemalloc.start()
    try:
        pops = {mode: Population(configs, run_dirs=[False, False], **QUIET)
                for mode, configs in (("branches", [cfg, cfg]), ("joined", joined([cfg, cfg])))}  # fmt: skip
    finally:
        tracemalloc.stop()
    b, j = pops["branches"], pops["joined"]
    m = j.members[1]
    assert m.learner_state == "external" and b.members[1].learner_state == "own"
    assert m.replay is None and m.transitions is None and m.discount is None
    assert m.train_graph is None and m.collect_graph is None
    assert m.agent.n_envs == EVAL_ENVS < b.members[1].agent.n_envs  # the acting workspace's rows
    replay = b.members[1].replay.nbytes()
    assert 0 < j.member_bytes[1] < b.member_bytes[1] - replay
    assert j.stacked_bytes > 2 * replay  # the stacked replay holds both members' rows
    # memory_per_member counts a joined member's share of the stacked objects
    assert memory_per_member(joined([cfg])[0]) > j.member_bytes[1] + replay


def test_learner_state_is_declared():
    with pytest.raises(ValueError, match="learner_state: 'none' is not one of"):
        Trainer(small(), run_dir=False, learner_state="none", **QUIET)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 3])
def test_gpu_joined_members_are_those_agents_trained_alone(P):
    """The joined population on the GPU (graphs captured, the learner's one-launch optimiser): member i
    against its Trainer alone, bitwise."""
    configs = joined_variants(gpu_small())[:P]
    pop = Population(configs, run_dirs=[False] * P, **QUIET)
    pop.run(60)
    for i, c in enumerate(configs):
        alone = Trainer(replace(c, run=replace(c.run, population="branches")), run_dir=False, **QUIET)
        alone.run(60)
        assert_joined_member_is_alone(pop, i, alone)
