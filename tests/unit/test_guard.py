import math

import pytest

from cudarl.config import GuardConfig
from cudarl.guard import Guard, GuardStop


def test_healthy_steps_pass():
    g = Guard(GuardConfig(action="stop", window=4))
    for t in range(20):
        assert g.check(t, 1.0 + 0.01 * t, 2.0) is None


@pytest.mark.parametrize(
    "loss,gn,reason,what",
    [(math.nan, 1.0, "nan", "loss"), (1.0, math.inf, "inf", "grad_norm"), (-math.inf, 1.0, "inf", "loss")],
)
def test_non_finite_stops_with_a_clear_message(loss, gn, reason, what):
    g = Guard(GuardConfig(action="stop", window=4))
    g.check(0, 1.0, 1.0)
    with pytest.raises(GuardStop, match=f"step 1: {what} = .*action: stop"):
        g.check(1, loss, gn)


def test_spike_rule_needs_a_full_window_and_uses_the_median():
    g = Guard(GuardConfig(action="rollback", window=4, spike_factor=10.0))
    assert g.check(0, 100.0, 1.0) is None  # window not full: no spike rule yet
    for t in range(1, 4):
        assert g.check(t, 1.0, 1.0) is None
    assert g.check(4, 9.0, 1.0) is None  # below 10 x median(1, 1, 1, 100) = 10
    ev = g.check(5, 50.0, 1.0)
    assert ev is not None and ev.reason == "spike" and ev.action == "rollback" and ev.threshold == pytest.approx(10.0)
    assert "spike rule" in ev.message() and ev.as_dict()["event"] == "guard"


def test_rollbacks_are_bounded():
    g = Guard(GuardConfig(action="rollback", window=2, max_rollbacks=2))
    assert g.check(0, math.nan, 1.0).action == "rollback"
    assert g.check(1, math.nan, 1.0).action == "rollback"
    with pytest.raises(GuardStop, match="after 2 rollbacks"):
        g.check(2, math.nan, 1.0)


def test_state_round_trip_and_validation():
    g = Guard(GuardConfig(action="stop", window=3))
    for t in range(3):
        g.check(t, float(t + 1), 1.0)
    h = Guard(GuardConfig(action="stop", window=3))
    h.load_state_dict(g.state_dict())
    assert h.state_dict() == g.state_dict()
    with pytest.raises(ValueError, match="action must be stop or rollback"):
        Guard(GuardConfig(action="explode"))
    with pytest.raises(ValueError, match="window"):
        Guard(GuardConfig(window=1))
    with pytest.raises(ValueError, match="spike_factor"):
        Guard(GuardConfig(spike_factor=1.0))
    assert Guard().spike_factor == GuardConfig().spike_factor == 20.0  # one source of defaults


def test_collapse_rule_needs_a_whole_window_below_the_threshold():
    g = Guard(GuardConfig(action="rollback", window=3, min_atom_utilisation=0.1))
    assert g.check(0, 1.0, 1.0, 0.05) is None
    assert g.check(1, 1.0, 1.0, 0.05) is None
    assert g.check(2, 1.0, 1.0, 0.5) is None  # one healthy update resets the run
    for t in range(3, 5):
        assert g.check(t, 1.0, 1.0, 0.02) is None
    ev = g.check(5, 1.0, 1.0, 0.02)
    assert ev is not None and (ev.reason, ev.what, ev.action) == ("collapse", "atom_utilisation", "rollback")
    assert "atom_utilisation = 0.02 < 0.1" in ev.message() and "agent.popart" in ev.message()
    assert g.check(6, 1.0, 1.0, None) is None  # a head without atoms: no rule
    off = Guard(GuardConfig(window=2, min_atom_utilisation=0.0))
    assert all(off.check(t, 1.0, 1.0, 0.0) is None for t in range(10))
