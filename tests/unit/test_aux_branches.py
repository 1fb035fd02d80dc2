"""Where the auxiliary signals' work sits in the train graph (issue 19, the signals' cost on the MLP's
critical path): the extra heads of the step's forwards on branches of their own, forked once psi is
written and joined where something reads them; horizons' and risk's losses on a branch each.

On the NumPy backend a branch runs in place, so the CPU tests check what the branches are made of and
that a branched forward is the same function; the GPU tests read the captured graph's edges
(``cudarl.kernels.tracing``, ``tools/critical_path.py``) and check what no longer waits for what."""

import sys
from pathlib import Path

import numpy as np
import pytest
from test_trainer import gpu_small, small

from cudarl.graph import SideStream
from cudarl.nn import QNetwork
from cudarl.nn.layers import Linear
from cudarl.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

HEADS_AND_CAUSAL = ["horizons", "risk", "causal"]


def _trainer(**over) -> Trainer:
    return Trainer(small(**over), run_dir=False, echo=lambda m: None)


@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_the_step_forwards_branch_their_extra_heads_and_acting_does_not(head):
    t = _trainer(net={"head": head}, agent={"aux": HEADS_AND_CAUSAL})
    agent, buf = t.agent, t.agent.buffers
    causal = agent.aux[2]
    step = [buf.ws, agent.target.ws, causal.ws] + ([agent.rule.ws_next] if head == "c51" else [])
    sides = [ws.extras_side for ws in step]
    assert all(isinstance(s, SideStream) for s in sides) and len({id(s) for s in sides}) == len(sides)
    assert buf.ws_act.extras_side is None  # the collect graph's forward is as it was
    phases = [n for n, _ in t.train_graph.phases]
    assert phases.index("q_stats") < phases.index("aux_horizons")  # q_stats joins the branch at s


def test_nothing_is_branched_without_extra_heads():
    t = _trainer(agent={"aux": ["homeostatic"]})
    assert not t.agent.online.extras
    assert t.agent.buffers.ws.extras_side is None and t.agent.target.ws.extras_side is None


def _extra(d: int):
    return Linear("aux.probe", d, 3, act="identity")


def test_a_branched_forward_is_the_unbranched_one(rng):
    net = QNetwork(12, 3, hidden=(16, 8), extra_heads={"probe": _extra}, max_batch=5)
    plain, branched = net.new_workspace(5), net.new_workspace(5)
    net.branch_extras(branched)
    net.branch_extras(branched)  # once only
    assert net._branched == [branched]
    x = rng.normal(size=(5, 12)).astype(np.float32)
    want = {k: v.copy() for k, v in net.forward(x, plain).items()}
    got = net.forward(x, branched)
    assert list(got) == ["q", "probe"]  # the head's output first, as before
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    net.join_extras()  # NumPy: nothing pending; the calls are the GPU's program


# --- GPU ---------------------------------------------------------------------------------------------
def traced_train_graph(over: dict):
    """The captured train graph of a ``gpu_small(**over)`` trainer, captured again with tracing on: its
    nodes (``critical_path.build_graph``) and the trainer."""
    import critical_path as cpath

    from cudarl import kernels

    t = Trainer(gpu_small(**over), run_dir=False, echo=lambda m: None)
    t._capture()
    with kernels.tracing() as events:
        t.train_graph.capture()
    t.synchronize()
    return cpath.build_graph(events), t


def ancestors(nodes: list, i: int) -> set:
    """The ids every path into node ``i`` passes through."""
    seen, todo = set(), list(nodes[i]["deps"])
    while todo:
        j = todo.pop()
        if j not in seen:
            seen.add(j)
            todo.extend(nodes[j]["deps"])
    return seen


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_gpu_the_extra_heads_at_s_run_beside_the_q_head_and_the_targets(head):
    nodes, t = traced_train_graph({"net": {"head": head}, "agent": {"aux": HEADS_AND_CAUSAL}})
    side = t.agent.buffers.ws.extras_side.stream.ptr
    extras = [n["id"] for n in nodes if n["stream"] == side and n["phase"] == "forward"]
    assert len(extras) >= 2  # the horizons and risk heads' GEMMs (and any bias kernels)
    first_learn = next(n["id"] for n in nodes if n["phase"] not in ("schedules", "sample", "forward"))
    assert not set(extras) & ancestors(nodes, first_learn)  # the rule's loss does not wait for them
    loss = next(n["id"] for n in nodes if n["name"] == "cudarl_horizons_loss")
    assert set(extras) <= ancestors(nodes, loss)  # the loss reads them: joined before it


@pytest.mark.gpu
def test_gpu_the_horizons_and_risk_losses_run_beside_each_other_and_the_backward_waits_for_both():
    nodes, t = traced_train_graph({"agent": {"aux": ["horizons", "risk"]}})
    h, r = (next(n["id"] for n in nodes if n["name"] == f"cudarl_{s}_loss") for s in ("horizons", "risk"))
    assert nodes[h]["stream"] != nodes[r]["stream"]
    assert h not in ancestors(nodes, r) and r not in ancestors(nodes, h)
    assert not any(n["name"] == "cudarl_regularizers_mean" for n in nodes)  # the totals are in the losses
    first_backward = next(n["id"] for n in nodes if n["phase"] == "backward")
    assert {h, r} <= ancestors(nodes, first_backward)
