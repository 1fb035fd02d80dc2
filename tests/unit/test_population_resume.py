"""Checkpoints of populations (cudarl.population): a joined member writes the checkpoint its Trainer alone
would write, bit for bit; a population interrupted and resumed from its members' checkpoints
(Population.resume) continues as if never stopped; a joined member's checkpoint resumes as a single
Trainer. NumPy always, the GPU marked."""

import signal
from dataclasses import replace

import numpy as np
import pytest
from test_population import QUIET, STEPS, joined_variants
from test_trainer import gpu_small, small

from cudarl import checkpoint as ckpt
from cudarl.backend import to_numpy
from cudarl.interrupt import Interrupted
from cudarl.population import JoinedMember, Population
from cudarl.testing import assert_state_bitwise
from cudarl.trainer import Trainer

#: the update the interrupted runs stop at (a logging step: progress fires there)
AT = 20


def branches(configs):
    """``configs`` with ``run.population = "branches"`` (the oracle: each member a Trainer alone)."""
    return [replace(c, run=replace(c.run, population="branches")) for c in configs]


def latest(d):
    return d / "checkpoints" / "latest.npz"


def member_dirs(root, P):
    return [root / f"m{i}" for i in range(P)]


def interrupted(configs, root, steps=STEPS):
    """A population of ``configs`` writing run directories under ``root``, stopped by SIGTERM after update
    :data:`AT` (every member writes ``latest.npz``); its members' checkpoint paths."""
    P = len(configs)
    dirs = member_dirs(root, P)
    pop = Population(configs, run_dirs=dirs, **QUIET)

    def progress(i, step, row, ev):
        if i == P - 1 and step == AT:
            signal.raise_signal(signal.SIGTERM)  # the run's handler sets its stop flag

    with pytest.raises(Interrupted):
        pop.run(steps, progress=progress)
    assert [m.step for m in pop.members] == [AT] * P
    return [latest(d) for d in dirs]


def assert_same_checkpoint(got_path, want_path, what):
    """Two resume checkpoint files hold the same state tree, bit for bit, at the same update."""
    got, got_info = ckpt.load(got_path)
    want, want_info = ckpt.load(want_path)
    assert got_info["step"] == want_info["step"]
    assert_state_bitwise(got, want, what)


# --- (a) a joined member's checkpoint is its Trainer's ---------------------------------------------------
def joined_checkpoints_are_trainers(base, tmp_path, steps):
    configs = joined_variants(base)
    pop = Population(configs, run_dirs=member_dirs(tmp_path / "pop", 3), **QUIET)
    assert all(isinstance(m, JoinedMember) for m in pop.members)
    pop.run(steps)
    for i, c in enumerate(branches(configs)):
        alone = Trainer(c, run_dir=tmp_path / f"alone{i}", **QUIET)
        alone.run(steps)
        assert_same_checkpoint(latest(member_dirs(tmp_path / "pop", 3)[i]), latest(tmp_path / f"alone{i}"), f"m{i}")


def test_a_joined_members_checkpoint_is_its_trainers(tmp_path):
    """Three joined members (different seeds, evaluation intervals, a moving average) with run directories:
    each member's latest.npz holds the state tree its Trainer alone writes at that update, bit for bit
    (agent: the learner's member i; replay, env: the stacked ones' member i; guard, normaliser, counters,
    moving average: the member's own)."""
    joined_checkpoints_are_trainers(small(), tmp_path, STEPS)


def test_a_joined_members_policy_files_hold_the_learners_weights(tmp_path):
    """run.checkpoint_every: a joined member's policy file step-N holds its trained weights (the learner's
    member i, copied before the file is written), as its Trainer's alone does."""
    from cudarl.policy import PolicyState

    configs = [replace(c, run=replace(c.run, checkpoint_every=AT)) for c in joined_variants(small())[:2]]
    pop = Population(configs, run_dirs=member_dirs(tmp_path / "pop", 2), **QUIET)
    pop.run(AT)
    for i, c in enumerate(branches(configs)):
        alone = Trainer(c, run_dir=tmp_path / f"alone{i}", **QUIET)
        alone.run(AT)
        name = f"checkpoints/step-{AT:08d}.safetensors"
        got = PolicyState.read(member_dirs(tmp_path / "pop", 2)[i] / name)
        want = PolicyState.read(tmp_path / f"alone{i}" / name)
        assert got.step == want.step == AT
        assert_state_bitwise(got.weights, want.weights, f"member {i}'s weights")


# --- (b) an interrupted population resumes exactly -------------------------------------------------------
def resumes_exactly(configs, tmp_path, steps):
    """``configs``' population interrupted at :data:`AT` and resumed (in its run directories) against the
    same population never stopped: the next losses, the final checkpoints (state trees, bit for bit) and
    the final validation evaluation."""
    P = len(configs)
    full = Population(configs, run_dirs=member_dirs(tmp_path / "full", P), **QUIET)
    full.run(steps)
    paths = interrupted(configs, tmp_path / "cut", steps)
    resumed = Population.resume(paths, **QUIET)
    assert resumed.mode == configs[0].run.population and [m.step for m in resumed.members] == [AT] * P
    assert [m.run_dir for m in resumed.members] == member_dirs(tmp_path / "cut", P)  # in place: the newest state
    resumed.run(steps)
    for i, (r, f) in enumerate(zip(resumed.members, full.members, strict=True)):
        assert len(r.losses) == steps - AT and r.losses == f.losses[AT:], f"member {i}"
        np.testing.assert_array_equal(to_numpy(r.agent.online.params), to_numpy(f.agent.online.params))
        assert r.last_eval["sharpe"] == f.last_eval["sharpe"] and r.last_eval["step"] == steps
        assert_same_checkpoint(latest(r.run_dir), latest(f.run_dir), f"member {i}")
    return resumed, full


@pytest.mark.parametrize("mode", ["joined", "branches"])
def test_an_interrupted_population_resumes_exactly(mode, tmp_path):
    """SIGTERM at update 20, Population.resume from the members' latest.npz, on to 40: the uninterrupted
    run's losses, weights, checkpoints and validation, bit for bit (joined: the checkpoints loaded into
    the stacked objects' members; branches: into the members' own buffers)."""
    configs = joined_variants(small())
    resumes_exactly(configs if mode == "joined" else branches(configs), tmp_path, STEPS)


def test_population_resume_refuses_checkpoints_of_different_updates(tmp_path):
    configs = joined_variants(small())[:2]
    pop = Population(configs, run_dirs=member_dirs(tmp_path / "pop", 2), **QUIET)
    pop.run(AT)
    pop.members[1].step += 1  # as if it were written an update later
    pop.members[1].save()
    with pytest.raises(ValueError, match=r"updates \[20, 21\]"):
        Population.resume([latest(d) for d in member_dirs(tmp_path / "pop", 2)], run_dirs=[False, False], **QUIET)


# --- (c) a joined member's checkpoint resumes as a single Trainer ----------------------------------------
def test_a_joined_members_checkpoint_resumes_as_a_single_trainer(tmp_path):
    """Member 1 of an interrupted joined population (its checkpoint at update 20) resumed by Trainer.resume
    and run to 40: the losses, weights, checkpoint and validation of its Trainer alone never stopped."""
    configs = joined_variants(small())
    paths = interrupted(configs, tmp_path / "cut")
    alone = Trainer(branches(configs)[1], run_dir=tmp_path / "alone", **QUIET)
    alone.run(STEPS)
    single = Trainer.resume(paths[1], run_dir=tmp_path / "single", **QUIET)
    assert type(single) is Trainer and single.step == AT
    single.run(STEPS)
    assert single.losses == alone.losses[AT:]
    np.testing.assert_array_equal(single.agent.online.params, alone.agent.online.params)
    assert single.last_eval["sharpe"] == alone.last_eval["sharpe"]
    assert_same_checkpoint(latest(tmp_path / "single"), latest(tmp_path / "alone"), "single")


# --- the GPU ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_a_joined_members_checkpoint_is_its_trainers(tmp_path):
    """(a) on the GPU: the graphed joined population's member checkpoints against its Trainers alone."""
    joined_checkpoints_are_trainers(gpu_small(), tmp_path, 60)


@pytest.mark.gpu
def test_gpu_an_interrupted_joined_population_resumes_exactly(tmp_path):
    """(b) on the GPU: interrupted at 20, resumed, on to 60, against the joined population never stopped."""
    resumes_exactly(joined_variants(gpu_small()), tmp_path, 60)
