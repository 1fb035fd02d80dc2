"""The guard of a joined population's members (``run.population = "joined"``): member ``i``'s loss and
gradient norm are read one step late, as a single Trainer's; a member that trips rolls back to its own
snapshot (the stacked learner's member ``i``: ``member_state_dict(i)`` and its load) and lowers its own
learning rate, while the others train on untouched. Bitwise: the member equals its Trainer alone given
the same fault, the others their Trainers alone.

Faults: NaN in the member's online weights at update 30 (a transient fault: the rollback to the
snapshot of update 20 recovers it and training goes on), or NaN in its replay rows (the single guard's
tests' injection, tests/unit/test_trainer.py: a lasting fault, so rollback, rollback, stop)."""

from contextlib import nullcontext
from dataclasses import replace

import numpy as np
import pytest
from test_population import QUIET, assert_joined_member_is_alone, joined, joined_variants
from test_trainer import gpu_small, small

from cudarl.backend import to_numpy
from cudarl.config import from_dict
from cudarl.guard import GuardStop
from cudarl.population import Population, _MemberAgent
from cudarl.reference.window import POSITION
from cudarl.trainer import Trainer

FAULT_AT, END = 30, 60


def _poison(owner, arr) -> None:
    """NaN into ``arr`` on ``owner``'s (a Population's or a Trainer's) stream, between its replays."""
    owner.synchronize()
    with owner.stream if owner.stream is not None else nullcontext():
        arr[...] = np.nan
    owner.synchronize()


def _weights(owner, i=None):
    return owner.agent.online.params if i is None else owner.learner.online.params[i]


def _replay_rows(owner, i=None):
    return owner.replay.bufs.obs[..., POSITION] if i is None else owner.replay.bufs.obs[i, :, POSITION]


def _alone(cfg, fault=None) -> Trainer:
    """``cfg`` trained alone to END (``fault``: poisoned at FAULT_AT), stopping where its guard stops it."""
    t = Trainer(replace(cfg, run=replace(cfg.run, population="branches")), run_dir=False, **QUIET)
    t.run(FAULT_AT)
    if fault is not None:
        _poison(t, fault(t))
    try:
        t.run(END)
    except GuardStop:
        pass
    return t


def fault_in_one_member(configs, i: int, fault):
    """A joined population of ``configs`` whose member ``i`` gets ``fault`` at FAULT_AT, run to END, and
    every member trained alone (member ``i`` with the same fault)."""
    pop = Population(configs, run_dirs=[False] * len(configs), **QUIET)
    pop.run(FAULT_AT)
    _poison(pop, fault(pop, i))
    summaries = pop.run(END)
    alone = [_alone(c, fault if j == i else None) for j, c in enumerate(configs)]
    return pop, summaries, alone


def _rows(events):
    """Guard and rollback rows without the member index a population adds."""
    return [{k: v for k, v in e.items() if k != "member"} for e in events]


def assert_guarded_as_alone(pop, summaries, alone, i: int) -> None:
    """Member ``i`` rolled back as alone (the same events, the same bits to the end); the others never
    tripped and equal their Trainers alone."""
    for j, a in enumerate(alone):
        m = pop.members[j]
        assert _rows(m.events) == _rows(a.events), f"member {j}"
        assert len(pop.members) == 1 or all(e["member"] == j for e in m.events)
        assert summaries[j]["step"] == END
        assert_joined_member_is_alone(pop, j, a)
    kinds = [e["event"] for e in pop.members[i].events]
    assert kinds == ["guard", "rollback"] and pop.members[i].events[1]["restored"] == 20
    assert not any(pop.members[j].events for j in range(len(alone)) if j != i)


@pytest.mark.parametrize("i", [0, 1])
def test_a_joined_member_rolls_back_as_alone_and_the_others_train_on(i):
    """NaN in member i's weights at update 30: its guard trips at update 31 (the CPU reads each update at
    once), it rolls back to its snapshot of update 20 and trains on; every member equals its Trainer alone
    (member i with the same fault) to update 60, bit for bit. guard.lr_factor = 1 here; a rollback that
    lowers each member's own rate: the tests below."""
    configs = joined_variants(small(guard={"lr_factor": 1.0}))
    assert_guarded_as_alone(*fault_in_one_member(configs, i, _weights), i)


def test_rolling_back_the_wrong_member_fails_the_comparison(monkeypatch):
    """The mutation check of the test above: a rollback that loads member i's snapshot into member i + 1
    leaves member i NaN and member i + 1 off its course, and the comparison with the Trainers alone fails."""

    def wrong(self, s):
        self.learner.load_member_state_dict((self.i + 1) % self.learner.members, s)

    monkeypatch.setattr(_MemberAgent, "load_state_dict", wrong)
    configs = joined_variants(small(guard={"lr_factor": 1.0}))
    with pytest.raises(AssertionError):
        assert_guarded_as_alone(*fault_in_one_member(configs, 1, _weights), 1)


def test_a_joined_population_of_one_rolls_back_and_lowers_its_learning_rate():
    """P = 1 with guard.lr_factor = 0.5 (the default): the rollback lowers the member's learning rate (the
    stacked optimiser's schedule, recaptured) as alone, and the member equals its Trainer alone."""
    configs = joined([small()])
    pop, summaries, alone = fault_in_one_member(configs, 0, _weights)
    assert_guarded_as_alone(pop, summaries, alone, 0)
    lr = configs[0].optim.lr * configs[0].guard.lr_factor
    assert pop.learner.adam.member_schedule(0).lr == alone[0].agent.adam.schedule.lr == lr


@pytest.mark.parametrize("i", [0, 1])
def test_joined_members_of_their_own_learning_rates_roll_back_and_lower_their_own(i):
    """guard.lr_factor = 0.5 (the default) with three learning rates: member i's rollback lowers its own
    rate (StackedAdam.set_member_schedule: its entries of the [P] schedule table) as alone, the others keep
    theirs, and every member equals its Trainer alone to the end, bit for bit."""
    base = small()
    over = [{}, {"run": {"seed": 7}, "optim": {"lr": 3e-4}}, {"run": {"seed": 11}, "optim": {"lr": 5e-5}}]
    configs = joined([from_dict(o, base=base) for o in over])
    pop, summaries, alone = fault_in_one_member(configs, i, _weights)
    assert_guarded_as_alone(pop, summaries, alone, i)
    lrs = [pop.learner.adam.member_schedule(j).lr for j in range(3)]
    assert lrs == [a.agent.adam.schedule.lr for a in alone]
    assert lrs[i] == configs[i].optim.lr * 0.5 and all(lrs[j] == configs[j].optim.lr for j in range(3) if j != i)


def test_a_lasting_fault_rolls_a_joined_member_back_then_stops_it_as_alone():
    """NaN in member 1's replay rows (a lasting fault): rollback, rollback, stop (guard.max_rollbacks = 2),
    as alone: the same events and losses, and the weights it stopped with; member 0 trains on to the end
    bitwise as alone."""
    base = small(guard={"lr_factor": 1.0, "max_rollbacks": 2})
    configs = joined([base, from_dict({"run": {"seed": 3}, "env": {"seed": 5}}, base=base)])
    pop, summaries, (alone0, alone1) = fault_in_one_member(configs, 1, _replay_rows)
    m = pop.members[1]
    assert [(e["event"], e.get("action")) for e in m.events] == [
        ("guard", "rollback"), ("rollback", None), ("guard", "rollback"), ("rollback", None), ("guard", "stop"),
    ]  # fmt: skip
    assert _rows(m.events) == _rows(alone1.events) and pop.active() == [0]
    assert summaries[1]["guard_stop"] == str(alone1.events[-1]["message"]) and m.step == alone1.step < END
    np.testing.assert_array_equal(m.losses, alone1.losses)
    for got, want in ((m.agent.online.params, alone1.agent.online.params), (m.agent.adam.v, alone1.agent.adam.v)):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want))  # synchronised at its stop
    assert not pop.members[0].events and summaries[0]["step"] == END
    assert_joined_member_is_alone(pop, 0, alone0)


# --- GPU (the coordinator runs these) ------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_a_joined_member_rolls_back_as_alone_and_the_others_train_on():
    """The CPU test on the GPU: the guard reads update t - 1 after launching update t, so member 1 trips at
    update 32 (reading 31) and update 32, in flight, is overwritten by the rollback, as alone. Both the
    population and each Trainer capture their graphs before their first replay (Population.prime,
    Trainer.prime); the train phases reserve the replay's batch before any capture."""
    configs = joined_variants(gpu_small(guard={"lr_factor": 1.0, "snapshot_every": 20}))
    assert_guarded_as_alone(*fault_in_one_member(configs, 1, _weights), 1)


@pytest.mark.gpu
def test_gpu_joined_members_of_their_own_learning_rates_roll_back_and_lower_their_own():
    """The CPU test with guard.lr_factor = 0.5 on the GPU: member 1's rate, lowered in its entries of the
    [P] schedule table between replays (on the graphs' stream), as alone."""
    base = gpu_small(guard={"snapshot_every": 20})
    over = [{}, {"run": {"seed": 7}, "optim": {"lr": 3e-4}}, {"run": {"seed": 11}, "optim": {"lr": 5e-5}}]
    configs = joined([from_dict(o, base=base) for o in over])
    pop, summaries, alone = fault_in_one_member(configs, 1, _weights)
    assert_guarded_as_alone(pop, summaries, alone, 1)
    assert [pop.learner.adam.member_schedule(j).lr for j in range(3)] == [a.agent.adam.schedule.lr for a in alone]


@pytest.mark.gpu
def test_gpu_a_lasting_fault_rolls_a_joined_member_back_then_stops_it():
    base = gpu_small(guard={"lr_factor": 1.0, "max_rollbacks": 2, "snapshot_every": 20})
    configs = joined([base, from_dict({"run": {"seed": 3}, "env": {"seed": 5}}, base=base)])
    pop, summaries, (alone0, alone1) = fault_in_one_member(configs, 1, _replay_rows)
    assert _rows(pop.members[1].events) == _rows(alone1.events) and pop.active() == [0]
    np.testing.assert_array_equal(pop.members[1].losses, alone1.losses)
    assert_joined_member_is_alone(pop, 0, alone0)
