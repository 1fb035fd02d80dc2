"""StepMonitor: the one-step-late readback, the guard and the rollback, with the GPU's order on the CPU.

A fake agent publishes each update's (loss, grad norm) into a two-slot ring as the train graph does;
a fake stream stands for the GPU, so the monitor reads update t - 1 after update t is launched.
"""

import math
from dataclasses import replace

import numpy as np
import pytest

from cudarl.config import GuardConfig
from cudarl.guard import GuardStop
from cudarl.monitor import StepMonitor
from cudarl.optim import Schedule


class _Ring:
    def __init__(self):
        self.slots = np.full((2, 2), np.nan, np.float32)
        self.marked = []

    def mark_written(self, stream, slot):
        self.marked.append(slot)

    def read(self, slot):
        return self.slots[slot].copy()


class _Stats:
    """The step's observables (cudarl.stats.StepStats): a ring marked with the loss's, read with it."""

    def __init__(self):
        self.ring, self.read_steps = _Ring(), []

    def read(self, step):
        self.read_steps.append(step)
        return {"atom_utilisation": None}


class _Adam:
    def __init__(self):
        self.schedule = Schedule(lr=1e-3)


class _Agent:
    """Publishes update t's values into slot t % 2 (the graph's publish); state is one number."""

    def __init__(self):
        self.readback, self.adam, self.weights, self.stats = _Ring(), _Adam(), 0.0, _Stats()

    def update(self, t, loss):
        self.weights += 1.0
        self.readback.slots[t % 2] = (loss, 0.5)

    def state_dict(self):
        return {"w": self.weights}

    def load_state_dict(self, s):
        self.weights = s["w"]


class _Graph:
    def __init__(self):
        self.captures = 0

    def capture(self):
        self.captures += 1


class _Stream:
    def synchronize(self):
        pass

    def __enter__(self):  # the monitor reads and writes the agent's state on the graphs' stream
        return self

    def __exit__(self, *exc):
        return False


def _monitor(gpu: bool, **guard):
    agent, graph, events = _Agent(), _Graph(), []
    stops = []
    m = StepMonitor(
        agent,
        graph,
        replace(GuardConfig(window=4), **guard),
        stream=_Stream() if gpu else None,
        on_event=events.append,
        on_stop=lambda: stops.append(True),
    )
    return m, agent, graph, events, stops


@pytest.mark.parametrize("gpu", [False, True])
def test_every_update_is_read_once_in_order(gpu):
    m, agent, _, events, _ = _monitor(gpu)
    for t in range(1, 8):
        agent.update(t, float(t))
        assert not m.launched(t)
        assert m.losses == [float(k) for k in range(1, t + (0 if gpu else 1))], "GPU: one step late"
    m.settle()
    assert m.losses == [float(k) for k in range(1, 8)] and m.pending is None and not events
    assert m.last == (7.0, 0.5) and agent.readback.marked == [t % 2 for t in range(1, 8)]
    # the step's observables: their ring marked with the loss's, each update read once, in order
    assert agent.stats.ring.marked == agent.readback.marked and agent.stats.read_steps == list(range(1, 8))


@pytest.mark.parametrize("gpu", [False, True])
def test_a_nan_rolls_back_to_the_snapshot_and_lowers_the_learning_rate(gpu):
    m, agent, graph, events, _ = _monitor(gpu)
    for t in range(1, 4):
        agent.update(t, 1.0)
        m.launched(t)
    m.take_snapshot(3)
    assert m.snapshot == (3, {"w": 3.0}) and m.pending is None
    agent.update(4, math.nan)
    rolled = m.launched(4)
    if gpu:  # update 4 is read when update 5 is launched; update 5, in flight, is never read
        assert not rolled
        agent.update(5, 1.0)
        rolled = m.launched(5)
    assert rolled and agent.weights == 3.0 and m.pending is None
    assert agent.adam.schedule.lr == pytest.approx(5e-4) and graph.captures == 1
    assert [e["event"] for e in events] == ["guard", "rollback"]
    assert events[1]["restored"] == 3 and events[1]["step"] == (5 if gpu else 4)
    assert math.isnan(m.losses[-1]) and len(m.losses) == 4


def test_a_trip_without_a_snapshot_stops_and_the_stop_saves_first():
    m, agent, _, _, _ = _monitor(False, action="rollback")
    agent.update(1, math.nan)
    with pytest.raises(GuardStop, match="no snapshot to roll back to yet"):
        m.launched(1)
    m2, agent2, _, events2, stops2 = _monitor(True, action="stop")
    agent2.update(1, 1.0)
    m2.launched(1)
    agent2.update(2, 1.0)
    agent2.readback.slots[0] = (1.0, math.inf)  # update 2 (slot 0), read when settled
    m2.launched(2)
    with pytest.raises(GuardStop, match="grad_norm = inf"):
        m2.settle()
    assert stops2 == [True] and events2[-1]["action"] == "stop"
