"""Checkpoints of a population (issue 23's agent axis: docs/perf-notes.md "The agent axis, in stages"): a
:class:`cudarl.stacked_agent.StackedLearner` and its stacked replay resume exactly, and each member is a
single agent's checkpoint.

- Member ``i``'s :meth:`StackedLearner.member_state_dict` is the :meth:`cudarl.agent.Agent.state_dict` of
  the agent of ``run.seed = seeds[i]`` fed the same rows, and its replay's member state the single
  replay's :meth:`PrioritizedReplay.state_dict`: same keys, same arrays bit for bit, after every update.
- Exact resume: N updates, a checkpoint file (:mod:`cudarl.checkpoint`, the single agent's format), a
  fresh learner and replay load it, M more updates: every state entry and every published loss, grad norm
  and Q statistic equal the uninterrupted N + M run's, bit for bit (P = 1 and 3; PopArt frozen across the
  resume and before it, PopArt off, the three-launch optimiser with shrink-and-perturb across the resume).
- Member export and import through checkpoint files: member ``i`` saved as ``agent`` and ``replay`` loads
  into a single :class:`Agent` and :class:`PrioritizedReplay`, which continue as member ``i`` does; P
  single agents' checkpoints loaded as members ``0 .. P-1`` make the learner they were, which continues as
  it does.

CPU (NumPy); GPU (marked): the reference sizes at P = 3, every graph captured after the load.
"""

from dataclasses import replace

import numpy as np
import pytest
from test_stacked_agent import E, _assert_member_is_agent, _build, _config, _reference_cfg, _seeds

from cudarl import checkpoint as ckpt
from cudarl.agent import PUBLISH_SLOTS, Agent
from cudarl.backend import to_numpy
from cudarl.graph import StepGraph
from cudarl.replay import PrioritizedReplay
from cudarl.stacked_agent import StackedLearner, stacked_replay
from cudarl.testing import assert_bitwise, assert_state_bitwise


def _graph(xp, name, learner, replay, win):
    g = StepGraph(name, learner.train_phases(replay, win), xp=xp)
    g.capture()
    return g


def _update(learner, g, step: int, sync) -> dict:
    """One update of a stacked learner (its graph ``g``) and what it published."""
    g.replay()
    learner.mark_published(step, g.stream)
    learner.between_updates(step, g.stream)
    sync()
    return learner.published(step)


def _update_single(agent, g, step: int) -> None:
    g.replay()
    agent.between_updates(step, g.stream)


def _through_file(tmp_path, name: str, state: dict) -> dict:
    """``state`` written as a checkpoint file and read back (arrays, 0-d arrays and JSON, no pickle)."""
    state, _ = ckpt.load(ckpt.save(tmp_path / f"{name}.npz", state))
    return state


def _fresh(xp, cfg, seeds, win, backend):
    return StackedLearner(cfg, win.width, 3, seeds, xp), stacked_replay(cfg, E, seeds, backend=backend)


def _single(xp, cfg, seed: int, win, backend):
    """The single agent and replay of ``run.seed = seed`` (as :func:`test_stacked_agent._build` makes them)."""
    r = cfg.replay
    agent = Agent(replace(cfg, run=replace(cfg.run, seed=seed)), win.width, 3, E, xp)
    single = PrioritizedReplay(
        r.capacity, 4, n_step=r.n_step, n_envs=E, alpha=r.alpha, eps=r.eps, beta0=r.beta0,
        beta_final=r.beta_final, beta_steps=r.beta_steps, seed=seed, backend=backend,
    )  # fmt: skip
    single.reserve(cfg.agent.batch_size)  # a graph's sample phase needs its buffers before the capture
    return agent, single


def _resume(xp, tmp_path, cfg, P, n, m, rng, features=5, sync=lambda: None):
    """N updates of a learner, its checkpoint file, a fresh learner loading it, M more updates of both:
    every state entry and every published value equal, bit for bit."""
    backend = "numpy" if xp is np else "cupy"
    seeds = _seeds(rng, P)
    learner, replay, _, _, win = _build(xp, cfg, P, seeds, [], rng, features=features)
    g = _graph(xp, "uninterrupted", learner, replay, win)
    for step in range(1, n + 1):
        _update(learner, g, step, sync)
    saved = {"learner": learner.state_dict(), "replay": replay.state_dict()}
    state = _through_file(tmp_path, "population", saved)
    resumed, resumed_replay = _fresh(xp, cfg, seeds, win, backend)
    resumed.load_state_dict(state["learner"])
    resumed_replay.load_state_dict(state["replay"])
    assert_state_bitwise(resumed.state_dict(), saved["learner"], what="the loaded learner")
    assert_state_bitwise(resumed_replay.state_dict(), saved["replay"], what="the loaded replay")
    g2 = _graph(xp, "resumed", resumed, resumed_replay, win)
    for step in range(n + 1, n + m + 1):
        want, got = _update(learner, g, step, sync), _update(resumed, g2, step, sync)
        assert_state_bitwise(got, want, what=f"update {step}: published")
        assert_state_bitwise(resumed.state_dict(), learner.state_dict(), what=f"update {step}: learner")
        assert_state_bitwise(resumed_replay.state_dict(), replay.state_dict(), what=f"update {step}: replay")
        assert_bitwise(resumed_replay.bufs.tree, replay.bufs.tree, what=f"update {step}: sum trees")
    return learner


# --- CPU ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize(
    "over, n, m",
    [
        ({}, 3, 4),  # PopArt live at the checkpoint, frozen after the resume (its warm-up is 4)
        ({}, 5, 2),  # PopArt frozen before the checkpoint
        ({"agent": {"popart": False, "priority": "ce"}, "optim": {"schedule": "constant"}}, 3, 3),
        ({"run": {"grid_barrier": False}, "optim": {"shrink_every": 3}}, 4, 3),  # a shrink after the resume
    ],
    ids=["popart-freezes-after", "popart-frozen-before", "no-popart", "three-launches-shrink"],
)
def test_resume_is_exact(rng, tmp_path, P, over, n, m):
    learner = _resume(np, tmp_path, _config(**over), P, n, m, rng)
    if learner.popart is not None:
        assert learner.popart.frozen


def test_members_are_single_agents_checkpoints_and_back(rng, tmp_path):
    """(a) member i's state is agent i's after each update; member 1 exported as a single agent's files
    continues as member 1; the three agents' files imported as members make the learner, which continues
    as it does."""
    P, n, m, xp, backend = 3, 3, 3, np, "numpy"
    cfg, seeds = _config(), _seeds(rng, P)
    learner, replay, singles, replays, win = _build(xp, cfg, P, seeds, list(range(P)), rng)
    g = _graph(xp, "stacked", learner, replay, win)
    alone = [_graph(xp, f"alone_{i}", a, r, win) for i, (a, r) in enumerate(zip(singles, replays, strict=True))]
    for step in range(1, n + 1):
        _update(learner, g, step, lambda: None)
        for i, (a, ga) in enumerate(zip(singles, alone, strict=True)):
            _update_single(a, ga, step)
            assert_state_bitwise(learner.member_state_dict(i), a.state_dict(), what=f"update {step}: agent {i}")
            assert_state_bitwise(
                replay.member_state_dict(i), replays[i].state_dict(), what=f"update {step}: replay {i}"
            )
    # export: member 1 as a single agent's checkpoint
    exported = _through_file(
        tmp_path, "member1", {"agent": learner.member_state_dict(1), "replay": replay.member_state_dict(1)}
    )
    agent, single = _single(xp, cfg, seeds[1], win, backend)
    agent.load_state_dict(exported["agent"])
    single.load_state_dict(exported["replay"])
    # import: each agent's checkpoint as a member of a fresh learner
    imported, imported_replay = _fresh(xp, cfg, seeds, win, backend)
    for i in (2, 0, 1):
        s = _through_file(tmp_path, f"agent{i}", {"agent": singles[i].state_dict(), "replay": replays[i].state_dict()})
        imported.load_member_state_dict(i, s["agent"])
        imported_replay.load_member_state_dict(i, s["replay"])
    assert_state_bitwise(imported.state_dict(), learner.state_dict(), what="imported learner")
    assert_state_bitwise(imported_replay.state_dict(), replay.state_dict(), what="imported replay")
    ga, gi = _graph(xp, "exported", agent, single, win), _graph(xp, "imported", imported, imported_replay, win)
    for step in range(n + 1, n + m + 1):
        want = _update(learner, g, step, lambda: None)
        _update_single(agent, ga, step)
        if step - n >= PUBLISH_SLOTS:  # the exported agent's rings hold what it published since its load
            _assert_member_is_agent(learner, replay, 1, agent, single, f"update {step} after the export")
        assert_state_bitwise(learner.member_state_dict(1), agent.state_dict(), what=f"update {step}: exported")
        assert_state_bitwise(_update(imported, gi, step, lambda: None), want, what=f"update {step}: published")
        assert_state_bitwise(imported.state_dict(), learner.state_dict(), what=f"update {step}: imported")


def test_checkpoints_refuse_another_population(rng):
    cfg = _config()
    learner, replay, _, _, win = _build(np, cfg, 2, [5, 6], [], rng)
    other, other_replay = _fresh(np, cfg, [5, 7], win, "numpy")
    with pytest.raises(ValueError, match="seeds"):
        other.load_state_dict(learner.state_dict())
    with pytest.raises(ValueError, match="seeds"):
        other_replay.load_state_dict(replay.state_dict())
    three = stacked_replay(cfg, E, [5, 6, 7], backend="numpy")
    with pytest.raises(ValueError, match="members"):
        three.load_state_dict(replay.state_dict())
    no_popart = StackedLearner(_config(agent={"popart": False}), win.width, 3, [5, 6], np)
    with pytest.raises(ValueError, match="another configuration"):
        no_popart.load_state_dict(learner.state_dict())
    with pytest.raises(ValueError, match="another configuration"):
        no_popart.load_member_state_dict(0, learner.member_state_dict(0))
    with pytest.raises(IndexError, match="member 2"):
        learner.member_state_dict(2)
    aux = {**learner.member_state_dict(0), "aux.horizons": {"x": np.zeros(1)}}
    with pytest.raises(ValueError, match="another configuration"):
        learner.load_member_state_dict(0, aux)


# --- GPU ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_resume_is_exact(cp, rng, tmp_path):
    """The reference sizes at P = 3: N = 3 updates, the file, a fresh learner, 3 more (PopArt freezes after
    the resume); every graph captured after its learner is built or loaded."""
    sync = cp.cuda.Device().synchronize
    _resume(cp, tmp_path, _reference_cfg(), 3, 3, 3, rng, features=64, sync=sync)


@pytest.mark.gpu
def test_gpu_members_are_single_agents_checkpoints(cp, rng, tmp_path):
    """The reference sizes at P = 3: member i's state is agent i's after each of 3 updates; member 2
    exported through a file continues as member 2 over 3 more."""
    P, xp, backend, sync = 3, cp, "cupy", cp.cuda.Device().synchronize
    cfg, seeds = _reference_cfg(), _seeds(rng, P)
    learner, replay, singles, replays, win = _build(xp, cfg, P, seeds, list(range(P)), rng, features=64)
    g = _graph(xp, "stacked", learner, replay, win)
    alone = [_graph(xp, f"alone_{i}", a, r, win) for i, (a, r) in enumerate(zip(singles, replays, strict=True))]
    for step in range(1, 4):
        _update(learner, g, step, sync)
        for a, ga in zip(singles, alone, strict=True):
            _update_single(a, ga, step)
        sync()
        for i in range(P):
            assert_state_bitwise(learner.member_state_dict(i), singles[i].state_dict(), what=f"update {step}: {i}")
            assert_state_bitwise(replay.member_state_dict(i), replays[i].state_dict(), what=f"replay {i}")
    exported = _through_file(
        tmp_path, "member2", {"agent": learner.member_state_dict(2), "replay": replay.member_state_dict(2)}
    )
    agent, single = _single(xp, cfg, seeds[2], win, backend)
    agent.load_state_dict(exported["agent"])
    single.load_state_dict(exported["replay"])
    ga = _graph(xp, "exported", agent, single, win)
    for step in range(4, 7):
        _update(learner, g, step, sync)
        _update_single(agent, ga, step)
        sync()
        assert_state_bitwise(learner.member_state_dict(2), agent.state_dict(), what=f"update {step}: exported")
        if step - 3 >= PUBLISH_SLOTS:  # the exported agent's rings hold what it published since its load
            _assert_member_is_agent(learner, replay, 2, agent, single, f"update {step} after the export")
    assert to_numpy(learner.loss).size == P
