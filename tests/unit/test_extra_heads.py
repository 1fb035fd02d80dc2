"""Which forwards run the extra heads on psi (the auxiliary signals' heads and the plan head; issue 19's
review): each forward names its heads (``QNetwork.forward(..., heads=...)``). The train step's forward at
s runs all of them (the losses and the backward read them), its forwards at s' (online and target) none,
the collect step's act and evaluation only the plan head (``net.plan``: its gate sizes the position).
Nothing that was read changes: a run whose networks are forced to run every extra head on every forward
(as before) ends with the same bits. CPU (NumPy backend): the GPU graphs are captured from the same Python.
"""

from collections import Counter

import numpy as np
import pytest
from test_aux_all import ALL
from test_trainer import small

from cudarl.nn import QNetwork
from cudarl.nn.layers import Linear
from cudarl.rules.c51 import C51Rule
from cudarl.trainer import Trainer

HEADS = ["horizons", "risk"]


def _trainer(head: str, aux, **net) -> Trainer:
    cfg = small(net={"head": head, "plan": True, **net}, agent={"aux": list(aux)})
    return Trainer(cfg, run_dir=False, echo=lambda m: None)


class HeadCalls:
    """Counts the forwards of each extra head of ``nets`` (``{label: QNetwork}``) by the workspace they
    write: a counting wrapper around each head module's ``forward`` on these networks' instances."""

    def __init__(self, nets: dict):
        self.calls = Counter()
        for label, net in nets.items():
            for name, head in net.extras.items():
                head.forward = self._counted(label, name, head.forward)

    def _counted(self, label, name, inner):
        def forward(psi, ws, **kw):
            self.calls[(label, name, id(ws))] += 1
            return inner(psi, ws, **kw)

        return forward

    def by_role(self, roles: dict) -> dict:
        """``{(label, head name, role): calls}`` where ``roles`` is ``{id(workspace): role}``."""
        out = Counter()
        for (label, name, ws), n in self.calls.items():
            out[(label, name, roles[ws])] += n
        return dict(out)


def _steps(t: Trainer, n: int) -> list:
    """Collect until the replay can be sampled, then ``n`` collect steps each followed by its updates (the
    run loop's without the evaluation :meth:`Trainer.run` ends with); the loss after each."""
    t.prime()
    losses = []
    for _ in range(n):
        t.advance(1)
        losses.append(_bits(t.agent.loss).copy())
    assert t.step == n * t.cfg.agent.updates_per_collect
    return losses


def _roles(t: Trainer) -> dict:
    buf = t.agent.buffers
    roles = {id(buf.ws): "s", id(t.agent.target.ws): "s'", id(buf.ws_act): "act"}
    if isinstance(t.agent.rule, C51Rule):  # (and c51+iqn): the online net at s' has a workspace of its own
        roles[id(t.agent.rule.ws_next)] = "s'"
    for s in t.agent.aux:
        if s.name == "causal":  # its intervened forward at s runs every extra head (its backward's)
            roles[id(s.ws)] = "causal"
    return roles


@pytest.mark.parametrize("head", ["c51", "iqn", "c51+iqn"])
def test_only_the_forward_at_s_runs_every_extra_head_and_acting_runs_the_plan_head(head):
    t = _trainer(head, HEADS)
    online, target = t.agent.online, t.agent.target
    assert list(online.extras) == [*HEADS, "plan"] and online.acting_heads == ("plan",)
    calls = HeadCalls({"online": online, "target": target})
    _steps(t, 4)
    want = {("online", name, "s"): t.step for name in online.extras}  # the train step's, once a step
    want[("online", "plan", "act")] = t.collect_steps  # the collect step's act, once a step
    assert calls.by_role(_roles(t)) == want  # nothing at s', nothing of the target's, no aux head acting

    calls.calls.clear()
    t.evaluate("val", write=False)  # the greedy walk's forwards: the plan head's gate sizes its positions
    seen = calls.by_role(_roles(t))
    assert set(seen) == {("online", "plan", "act")} and seen[("online", "plan", "act")] > 0


def test_without_the_plan_head_acting_runs_no_extra_head():
    cfg = small(agent={"aux": HEADS})
    t = Trainer(cfg, run_dir=False, echo=lambda m: None)
    assert t.agent.online.acting_heads == ()
    calls = HeadCalls({"online": t.agent.online, "target": t.agent.target})
    _steps(t, 2)
    assert calls.by_role(_roles(t)) == {("online", name, "s"): t.step for name in HEADS}


def _force_every_head(net: QNetwork) -> None:
    """Every forward of ``net`` runs every extra head (what every forward did before each chose)."""

    def forward(x, ws=None, raw_head=False, *, heads="all", **head_kw):
        return QNetwork.forward(net, x, ws, raw_head, heads="all", **head_kw)

    net.forward = forward


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize(
    ("head", "aux"),
    [
        ("c51", ALL),
        ("iqn", [s for s in ALL if s != "homeostatic"]),  # homeostatic regulates C51's atoms
        ("c51+iqn", [s for s in ALL if s not in ("homeostatic", "causal", "vaccine")]),  # not with c51+iqn yet
    ],
)
def test_a_run_is_bit_for_bit_the_run_whose_every_forward_runs_every_extra_head(head, aux):
    runs = {}
    for forced in (False, True):
        t = _trainer(head, aux)
        if forced:
            for net in (t.agent.online, t.agent.target):
                _force_every_head(net)
        calls = HeadCalls({"online": t.agent.online, "target": t.agent.target})
        losses = _steps(t, 10)
        runs[forced] = (t, calls.by_role(_roles(t)), np.concatenate(losses))
    (new, new_calls, new_losses), (old, old_calls, old_losses) = runs[False], runs[True]
    assert sum(new_calls.values()) < sum(old_calls.values())  # the forced run did more
    assert ("target", "horizons", "s'") in old_calls and ("target", "horizons", "s'") not in new_calls
    np.testing.assert_array_equal(new_losses, old_losses)
    for name in ("online", "target"):
        a, b = getattr(new.agent, name), getattr(old.agent, name)
        np.testing.assert_array_equal(_bits(a.params), _bits(b.params))
    np.testing.assert_array_equal(_bits(new.agent.online.grads), _bits(old.agent.online.grads))
    np.testing.assert_array_equal(_bits(new.env.scale), _bits(old.env.scale))  # the plan head's gate
    assert new.agent.observables() == old.agent.observables()


# --- the network's choice --------------------------------------------------------------------------
def _probe(d: int):
    return Linear("aux.probe", d, 3, act="identity")


def test_a_forward_runs_the_heads_it_names_and_the_backward_those_it_ran(rng):
    net = QNetwork(12, 3, hidden=(16, 8), extra_heads={"probe": _probe}, plan=True, max_batch=5)
    assert list(net.extras) == ["probe", "plan"] and net.acting_heads == ("plan",)
    assert net.head_names() == ("probe", "plan") and net.head_names("none") == ()
    assert net.head_names(["plan", "probe"]) == ("probe", "plan")  # in extras order
    for bad in ("plan", ["nope"]):
        with pytest.raises(ValueError, match="heads"):
            net.forward(np.zeros((5, 12), np.float32), heads=bad)
    x = rng.normal(size=(5, 12)).astype(np.float32)
    want = {k: v.copy() for k, v in net.forward(x, heads="all").items()}
    for heads, keys in (("none", ["q"]), (net.acting_heads, ["q", "plan"]), ((), ["q"])):
        out = net.forward(x, heads=heads)
        assert list(out) == keys and net.ws.heads == tuple(keys[1:])
        for k in keys:  # the same bits whatever else ran
            np.testing.assert_array_equal(_bits(out[k]), _bits(want[k]))
    # the backward of a forward that ran no extra head leaves their gradients as they were
    for g in net.grad_outputs().values():
        g[...] = rng.normal(size=g.shape)
    net.grads[...] = 7.0
    net.forward(x, heads="none")
    net.backward()
    assert np.all(net.G["aux.probe.weight"] == 7.0) and not np.any(net.G["enc.0.weight"] == 7.0)


@pytest.mark.parametrize("plan", [False, True])
def test_the_extra_heads_backward_run_first_gives_the_one_backwards_gradient(plan):
    """``QNetwork.backward_extras`` then ``backward(extras_done=True)`` (the agent's ``extras_backward`` phase,
    on the auxiliary branch, then the step's backward) gives the gradient of ``backward`` alone to float32
    rounding (dL/dpsi summed as Q + (E_1 + E_2) against (Q + E_1) + E_2), with the plan head, a probe that
    leaves dL/dpsi alone, among the heads or not; and the trainer's agent takes that order for C51 with a
    head signal (``Agent.extras_early``), not for IQN, whose mixing kernel overwrites dL/dpsi."""
    t = Trainer(small(net={"head": "c51", "plan": plan}, agent={"aux": HEADS}), run_dir=False, echo=lambda m: None)
    assert t.agent.extras_early and "extras_backward" in dict(t.train_graph.phases)
    net, rng = t.agent.online, np.random.default_rng(0)
    ws = net.new_workspace(64)
    x = rng.standard_normal((64, net.n_in)).astype(np.float32)
    net.forward(x, ws, raw_head=True, heads="all")
    outs = {k: rng.standard_normal(g.shape).astype(np.float32) for k, g in net.grad_outputs(ws, raw_head=True).items()}

    def set_outputs():  # a backward may rewrite an output gradient in place (dz = dout * act')
        for k, g in net.grad_outputs(ws, raw_head=True).items():
            g[...] = outs[k]
        net.grads[...] = 0.0

    set_outputs()
    net.backward(x, ws)
    one = net.grads.copy()
    set_outputs()
    assert net.backward_extras(ws) is True
    net.backward(x, ws, extras_done=True)
    np.testing.assert_allclose(net.grads, one, rtol=2e-5, atol=1e-6)  # the sum's order differs: not the bits
    iqn = Trainer(small(net={"head": "iqn"}, agent={"aux": HEADS}), run_dir=False, echo=lambda m: None)
    assert not iqn.agent.extras_early and "extras_backward" not in dict(iqn.train_graph.phases)
    assert not iqn.agent.online.extras_first
    with pytest.raises(ValueError, match="overwrites dL/dpsi"):  # the network refuses, not only the agent
        iqn.agent.online.backward_extras()


@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_the_backward_without_the_q_head_is_the_extra_heads_part_alone(head):
    """``backward(heads="extras")`` (Gradient Vaccine's pass): the Q head's parameter gradients are left as they
    were, and every other gradient is the full backward's with the Q head's output gradient zeroed (the same
    values; a zero's sign may differ); refused where no extra head writes dL/dpsi."""
    t = Trainer(small(net={"head": head}, agent={"aux": HEADS}), run_dir=False, echo=lambda m: None)
    net, rng = t.agent.online, np.random.default_rng(1)
    ws = net.new_workspace(16)
    x = rng.standard_normal((16, net.n_in)).astype(np.float32)
    net.forward(x, ws, heads="all")
    outs = {k: rng.standard_normal(g.shape).astype(np.float32) for k, g in net.grad_outputs(ws).items()}

    def set_outputs(q_zero: bool):
        for k, g in net.grad_outputs(ws).items():
            g[...] = 0.0 if (k == "q" and q_zero) else outs[k]
        net.grads[...] = 7.0

    set_outputs(q_zero=True)
    net.backward(x, ws)
    want = net.grads.copy()
    set_outputs(q_zero=False)  # its rows are not read
    net.backward(x, ws, heads="extras")
    mine = {e.name for e in net.layout.entries if e.name.startswith("head.")}
    assert mine
    for e in net.layout.entries:
        got = net.grads[e.offset : e.offset + int(np.prod(e.shape))]
        if e.name in mine:
            assert np.all(got == 7.0), e.name
        else:
            np.testing.assert_array_equal(got, want[e.offset : e.offset + int(np.prod(e.shape))], err_msg=e.name)
    plain = Trainer(small(net={"head": head}), run_dir=False, echo=lambda m: None).agent.online
    pws = plain.new_workspace(16)
    plain.forward(x, pws)
    with pytest.raises(ValueError, match="needs an extra head that writes dL/dpsi"):
        plain.backward(x, pws, heads="extras")
