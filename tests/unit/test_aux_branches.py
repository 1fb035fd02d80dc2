"""Where the auxiliary signals' work sits in the train graph (issue 19, the signals' cost on the MLP's
critical path): the extra heads of the step's forwards on branches of their own, forked once psi is
written and joined where something reads them; horizons' and risk's losses on a branch each; causal
intervention's backward on its branch, beside the step's, into a gradient buffer of its own that its grad
phase adds to the step's (the bits of the backward on the flat gradient it replaces).

On the NumPy backend a branch runs in place, so the CPU tests check what the branches are made of and
that a branched forward is the same function; the GPU tests read the captured graph's edges
(``cudarl.kernels.tracing``, ``tools/critical_path.py``) and check what no longer waits for what."""

import sys
from pathlib import Path

import numpy as np
import pytest
from test_trainer import gpu_small, small
from test_windows import ENCODER_NETS

from cudarl.graph import SideStream
from cudarl.nn import QNetwork
from cudarl.nn.layers import Linear
from cudarl.reference import vaccine as vref
from cudarl.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

HEADS_AND_CAUSAL = ["horizons", "risk", "causal"]


def _trainer(**over) -> Trainer:
    return Trainer(small(**over), run_dir=False, echo=lambda m: None)


def _assert_trained_alike(a: Trainer, b: Trainer) -> None:
    """Two trainers' runs are the same bits: losses (at least four), online and target weights, and every
    auxiliary signal's state."""
    assert a.losses == b.losses and len(a.losses) >= 4
    np.testing.assert_array_equal(_bits(a.agent.online.params), _bits(b.agent.online.params))
    np.testing.assert_array_equal(_bits(a.agent.target.params), _bits(b.agent.target.params))
    for x, y in zip(a.agent.aux, b.agent.aux, strict=True):
        for k, v in y.state_dict().items():
            np.testing.assert_array_equal(x.state_dict()[k], v, err_msg=f"{y.name}.{k}")


@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_the_step_forwards_that_run_extra_heads_branch_them_and_the_others_do_not(head):
    t = _trainer(net={"head": head}, agent={"aux": HEADS_AND_CAUSAL})
    agent, buf = t.agent, t.agent.buffers
    causal = agent.aux[2]
    sides = [ws.extras_side for ws in (buf.ws, causal.ws)]  # the forwards that run them: at s, intervened
    assert all(isinstance(s, SideStream) for s in sides) and len({id(s) for s in sides}) == len(sides)
    # the forwards at s' run no extra heads (test_extra_heads.py), so nothing of theirs is branched; nor
    # is the collect graph's forward
    at_s_next = [agent.target.ws] + ([agent.rule.ws_next] if head == "c51" else [])
    assert all(ws.extras_side is None for ws in [*at_s_next, buf.ws_act])
    phases = [n for n, _ in t.train_graph.phases]
    assert phases.index("q_stats_join") < phases.index("aux_horizons")  # it joins the branch at s


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


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize(
    "net",
    [
        {"head": "c51"},
        {"head": "iqn"},
        {"head": "qrdqn", "spectral": ("enc.1",)},
        {"head": "c51", **ENCODER_NETS["ssm"]},
        {"head": "iqn", **ENCODER_NETS["attention"]},
    ],
)
def test_causals_own_backward_added_is_the_backward_on_the_flat_gradient_bit_for_bit(net):
    """One update, watched: causal's backward (in aux_causal, into its own buffer) equals the online net's
    backward over the same intervened forward, and the gradient its grad phase leaves is that backward's
    plus the step's, as the grad phase computed it when it ran that backward on the flat gradient (save,
    backward, add the saved gradient): every bit, signed zeros included."""
    aux = ["horizons", "risk", "selectivity", "causal"]
    t = _trainer(net=net, agent={"aux": aux, "causal_weight": 1.0, "causal_groups": ["calendar", "offset"]})
    online, causal = t.agent.online, t.agent.aux[3]
    seen = {}

    def after(name, fn):
        def spy(inner=dict(t.train_graph.phases)[name]):
            inner()
            fn()

        return spy

    def old_way():  # the step's gradient, then the former grad phase's backward, into the flat buffer
        seen["step"] = online.grads.copy()
        causal.ws.set_batch(causal.sub.rows)
        assert causal.ws.heads == ()  # the intervened forward runs no extra head: their gradients stay 0
        online.grads[...] = 0.0
        online.backward(causal.x, causal.ws)
        seen["old"] = online.grads.copy()
        online.grads[...] = seen["step"]

    spies = {
        "aux_causal": after("aux_causal", lambda: seen.update(own=causal.extra.grads.copy())),
        "backward": after("backward", old_way),
        "causal": after("causal", lambda: seen.update(sum=online.grads.copy())),
    }
    t.train_graph.phases = [(n, spies.get(n, f)) for n, f in t.train_graph.phases]
    t.run(t.cfg.agent.learning_starts // t.cfg.env.n_envs + 2)
    assert np.any(seen["own"] != 0) and causal.extra.grads is not online.grads
    np.testing.assert_array_equal(_bits(seen["own"]), _bits(seen["old"]))
    np.testing.assert_array_equal(_bits(seen["sum"]), _bits(np.add(seen["old"], seen["step"], dtype=np.float32)))


@pytest.mark.parametrize("net", [{"head": "c51"}, {"head": "iqn"}])
def test_vaccine_folding_causals_gradient_trains_bit_for_bit_as_causals_add_then_vaccines(net):
    """Causal listed before vaccine: vaccine's grad phase takes causal's gradient (``takes_addend``) and adds
    it inside its two kernels (``dots_control_plus``, ``apply_plus``) where causal's grad phase added it over
    the whole flat gradient first. Trained both ways from the same seed (the fold declined by a patched
    ``takes_addend``), the losses, weights and every signal's state are the same bits; causal's gradient is
    exactly zero from ``stop`` (the extra heads') on, the entries the folded kernels leave alone."""
    from cudarl.auxiliary import Vaccine

    aux = [s for s in ALL if net["head"] == "c51" or s != "homeostatic"]
    over = {"aux": aux, "causal_weight": 1.0, "causal_groups": ["calendar", "offset"], "vaccine_beta": 0.2}
    folded = _trainer(net=net, agent=over)
    vac, causal = folded.agent.aux[-1], folded.agent.aux[aux.index("causal")]
    assert vac.addend is not None and "causal" not in dict(folded.train_graph.phases)
    take = Vaccine.takes_addend
    try:
        Vaccine.takes_addend = lambda self, addend: False
        two = _trainer(net=net, agent=over)
    finally:
        Vaccine.takes_addend = take
    assert two.agent.aux[-1].addend is None and "causal" in dict(two.train_graph.phases)
    steps = folded.cfg.agent.learning_starts // folded.cfg.env.n_envs + 4
    folded.run(steps)
    two.run(steps)
    assert np.any(causal.extra.grads[: vac.addend.stop] != 0) and not np.any(causal.extra.grads[vac.addend.stop :])
    _assert_trained_alike(folded, two)


@pytest.mark.parametrize("folded", [False, True])
def test_vaccines_early_sums_one_launch_and_two_launches_train_bit_for_bit(folded, monkeypatch):
    """Vaccine's grad phase in its four forms: the sums forked early from the last layer's gradient branch and the
    apply in Adam's one launch (``adam``: the MLP's default with ``vaccine_scope = "last"``, ``dots_control``
    then ``optim.clip_adam_soft_vaccine``, which applies it; ``_plus`` with causal's gradient folded in), or after
    the backward without the grid barrier (``early``), and at the tail after the backward, where
    ``run.grid_barrier`` picks the one launch (``dots_control_apply``) or the two. On NumPy their twins, each
    form's called exactly when it runs (the apply through Adam's twin in ``adam``). Trained all four ways from the
    same seed, the losses, weights and every signal's state are the same bits (the GPU's bits:
    tests/parity/test_vaccine.py, tests/parity/test_optim.py)."""
    from cudarl.nn.layers import MLP

    aux = ["horizons", "causal", "vaccine"] if folded else ["horizons", "vaccine"]
    over = {"aux": aux, "causal_weight": 1.0, "causal_groups": ["calendar", "offset"], "vaccine_beta": 0.2}
    plus = "_plus" if folded else ""
    calls, depth = [], [0]  # the phase's own calls, not the twins' calls of one another

    def counted(twin, name):
        def call(*a):
            if not depth[0]:
                calls.append(name)
            depth[0] += 1
            try:
                return twin(*a)
            finally:
                depth[0] -= 1

        return call

    for name in ("dots_control_apply", "dots_control", "apply"):
        for nm in (name, name + "_plus"):
            monkeypatch.setattr(vref, nm, counted(getattr(vref, nm), nm))
    branch = MLP.last_layer_branch
    runs = {}
    for form in ("adam", "early", "one", "two"):
        if form not in ("adam", "early"):  # no branch holds the scope's gradients: the tail forms
            monkeypatch.setattr(MLP, "last_layer_branch", property(lambda self: None))
        t = _trainer(agent=over, run={"grid_barrier": form in ("adam", "one")})
        vac = t.agent.aux[-1]
        assert (vac.addend is not None) == folded and vac.early == (form in ("adam", "early"))
        assert vac.folded == (form == "adam")  # the apply in Adam's launch: optim.clip_adam_soft_vaccine's twin
        fold = vac.adam_apply()
        assert (fold is None) != (form == "adam")
        if fold is not None:
            assert (fold.lo, fold.hi, fold.stop, fold.state) == (vac.lo, vac.hi, folded and vac.addend.stop, vac.state)
        calls.clear()
        t.run(t.cfg.agent.learning_starts // t.cfg.env.n_envs + 4)
        steps = calls.count(f"dots_control_apply{plus}") if form == "one" else calls.count(f"dots_control{plus}")
        assert steps >= 4
        each = [f"dots_control_apply{plus}"] if form == "one" else [f"dots_control{plus}", f"apply{plus}"]
        assert calls == each * steps
        runs[form] = t
        monkeypatch.setattr(MLP, "last_layer_branch", branch)
    for form in ("early", "one", "two"):
        _assert_trained_alike(runs["adam"], runs[form])
    assert runs["adam"].agent.aux[-1].state_dict()["state"][0] != 0  # the target moved: the phase ran


@pytest.mark.parametrize(
    "net,scope",
    [
        ({"head": "c51"}, "last"),
        ({"head": "c51"}, "encoder"),
        ({"head": "iqn"}, "last"),
        ({"head": "qrdqn", "spectral": ("enc.1",)}, "last"),
        ({"head": "c51", **ENCODER_NETS["ssm"]}, "last"),
        ({"head": "iqn", **ENCODER_NETS["attention"]}, "encoder"),
    ],
)
def test_vaccines_own_backward_is_the_backward_it_ran_on_the_flat_gradient_bit_for_bit(net, scope):
    """One update, watched: Gradient Vaccine's backward (begun in the step's backward phase, into its own
    buffer over a shadow of the forward's workspace) equals, on its scope, the backward its grad phase once
    ran on the flat gradient after the step's (the main outputs' gradient rows zeroed in the step's
    workspace), and the gradient its grad phase leaves is the paper's correction of the flat gradient by
    that one: every bit."""
    aux = ["horizons", "risk", "selectivity", "causal", "vaccine"]
    over = {"aux": aux, "vaccine_beta": 0.2, "vaccine_scope": scope, "causal_groups": ["calendar", "offset"]}
    t = _trainer(net=net, agent=over)
    online, buf, vac = t.agent.online, t.agent.buffers, t.agent.aux[4]
    seen = {}

    def after(name, fn, before=None):
        def spy(inner=dict(t.train_graph.phases)[name]):
            if before is not None:
                before()
            inner()
            fn()

        return spy

    def old_way():  # the former grad phase's backward, on the flat gradient over the step's workspace
        step = online.grads.copy()
        ws, B = buf.ws, buf.batch_size
        ws.set_batch(B)
        outs = online.grad_outputs(ws, raw_head=ws.raw_head)
        for name in vac.main_extras:
            outs[name][...] = 0
        online.backward(buf.batch.obs, ws, last_layer=scope == "last", heads="extras")
        seen["old"] = online.grads.copy()
        online.grads[...] = step
        # the same values as the Q head's backward over zero rows, the extra heads' added to them (a zero's
        # sign aside): what this pass ran before it skipped the Q head
        for name in ("q", *vac.main_extras):
            outs[name][...] = 0
        online.backward(buf.batch.obs, ws, last_layer=scope == "last")
        np.testing.assert_array_equal(online.grads[vac.lo : vac.hi], seen["old"][vac.lo : vac.hi])
        online.grads[...] = step

    def after_backward():  # the old way's backward from the weights the step's read (before any own SGD step)
        seen.update(own=vac.extra.grads.copy())
        old_way()

    def before_vaccine():
        seen["full"] = online.grads.copy()

    # the corrected gradient: after vaccine's phase, or where Adam's launch applies it (vaccine.folded) after
    # Adam's phase, which stores it on [0, stop) (the own SGD steps between them change only their spans, past it)
    def before_last():
        seen["pre"] = online.grads.copy()
        if not vac.folded:
            before_vaccine()

    last = "adam" if vac.folded else "vaccine"
    spies = {"backward": after("backward", after_backward), "vaccine": after("vaccine", lambda: None, before_vaccine)}
    spies[last] = after(last, lambda: seen.update(out=online.grads.copy()), before=before_last)
    t.train_graph.phases = [(n, spies.get(n, f)) for n, f in t.train_graph.phases]
    t.run(t.cfg.agent.learning_starts // t.cfg.env.n_envs + 2)
    lo, hi = vac.lo, vac.hi
    assert np.any(seen["own"][lo:hi] != 0) and vac.extra.grads is not online.grads
    np.testing.assert_array_equal(_bits(seen["own"][lo:hi]), _bits(seen["old"][lo:hi]))
    full = seen["full"].copy()
    assert vac.addend is not None  # causal's gradient, which vaccine's kernels add (takes_addend)
    stop = vac.addend.stop
    full[:stop] += vac.addend.grads[:stop]
    want = vref.apply(full, seen["old"], vac.state, lo, hi)
    np.testing.assert_array_equal(_bits(seen["out"][:stop]), _bits(want[:stop]))
    rest = seen["pre"] if vac.folded else want  # past stop: as the phases before left it
    np.testing.assert_array_equal(_bits(seen["out"][stop:]), _bits(rest[stop:]))


ALL = ["horizons", "risk", "denoise", "homeostatic", "causal", "selectivity", "vaccine"]
#: vaccine's grad phase's kernels (``_plus`` appended where causal's gradient is folded in): with its sums forked
#: early (``Vaccine.early``: the MLP with vaccine_scope "last") two launches, else by run.grid_barrier
VACCINE_NODES = {
    True: ("cudarl_vaccine_dots_control_apply",),
    False: ("cudarl_vaccine_dots_control", "cudarl_vaccine_apply"),
}


def vaccine_nodes(t) -> tuple:
    """The names of the kernels of vaccine's grad phase in trainer ``t`` (no ``_plus``): where Adam's launch
    applies the correction (``Vaccine.folded``), dots_control alone."""
    vac = t.agent.aux[-1]
    if vac.folded:
        return VACCINE_NODES[False][:1]
    return VACCINE_NODES[t.cfg.run.grid_barrier and not vac.early]


def applies(nodes: list, t) -> int:
    """The id of the node that applies vaccine's correction to the flat gradient: its phase's last, or Adam's
    one launch where it is folded in (``optim.clip_adam_soft_vaccine``)."""
    if t.agent.aux[-1].folded:
        (i,) = [n["id"] for n in nodes if n["phase"] == "adam" and n["name"] == "cudarl_optim_clip_adam_soft_vaccine"]
        return i
    return [n["id"] for n in nodes if n["phase"] == "vaccine"][-1]


def test_causals_intervened_forward_is_an_early_phase_with_c51_and_not_with_a_quantile_head():
    names = [n for n, _ in _trainer(agent={"aux": ALL}).train_graph.phases]
    # the early ones: denoise's whole pass and causal's intervened forward
    assert names[names.index("sample") + 1 : names.index("forward")] == ["aux_denoise", "aux_causal_do"]
    assert names.index("q_stats") < names.index("aux_homeostatic") < names.index("aux_causal") < names.index("backward")
    for head in ("iqn", "qrdqn"):  # the forward phase draws the taus and rescales head.out (PopArt)
        t = _trainer(net={"head": head}, agent={"aux": ["causal"]})
        names = [n for n, _ in t.train_graph.phases]
        assert "aux_causal_do" not in names and not t.agent.aux[0].early
        assert names.index("q_stats") < names.index("aux_causal") < names.index("backward")


@pytest.mark.parametrize("aux_batch", [1.0, 0.125])
def test_the_early_causal_pass_trains_bit_for_bit_as_the_whole_pass_in_its_loss_phase(aux_batch):
    """The intervened forward moved from causal's loss phase to right after sample (and homeostatic onto a
    branch): the same kernels on the same inputs, so a few updates with all seven signals give every bit
    of the run with the pass where it was (the early phase dropped, the loss phase running the whole
    pass as it does with a quantile head)."""
    groups = ["calendar", "offset"]
    over = {"agent": {"aux": ALL, "causal_weight": 1.0, "causal_groups": groups, "aux_batch": aux_batch}}
    new, old = _trainer(**over), _trainer(**over)
    causal = old.agent.aux[ALL.index("causal")]
    causal.early = False  # the pass in aux_causal, after q_stats and homeostatic: today's order before
    old.train_graph.phases = [(n, f) for n, f in old.train_graph.phases if n != "aux_causal_do"]
    assert [n for n, _ in new.train_graph.phases if n != "aux_causal_do"] == [n for n, _ in old.train_graph.phases]
    steps = new.cfg.agent.learning_starts // new.cfg.env.n_envs + 4
    new.run(steps)
    old.run(steps)
    assert new.losses and new.losses == old.losses
    np.testing.assert_array_equal(_bits(new.agent.online.params), _bits(old.agent.online.params))
    np.testing.assert_array_equal(_bits(new.agent.adam.m), _bits(old.agent.adam.m))
    assert new.agent.observables() == old.agent.observables()
    assert new.agent.observables()["aux.causal.loss"] != 0


def test_denoises_pass_is_a_branch_of_its_own_touching_nothing_the_steps_backward_does():
    """Denoise's pass forks onto a side stream no other work of the step uses, its loss phase before the
    step's backward and its SGD phase (which joins it) after the backward and before Adam. Watched through
    one update: the pass leaves the online net's parameters and flat gradient as they were (it writes its
    own gradient, workspace and loss), and the step's backward leaves the pass's gradients as they were,
    so the two need no order between them (the GPU test reads that they have none)."""
    t = _trainer(agent={"aux": ["horizons", "risk", "denoise"]})
    agent, buf = t.agent, t.agent.buffers
    den = agent.aux[2]
    others = [buf.side, buf.side_next, buf.side_small, buf.side_stats, buf.side_aux, agent.side_priorities]
    others += [*agent.grad_sides, buf.ws.extras_side]
    others += [v for s in agent.aux if s is not den for v in vars(s).values() if isinstance(v, SideStream)]
    assert isinstance(den.side, SideStream) and all(den.side is not o for o in others)
    phases = [n for n, _ in t.train_graph.phases]
    order = ["aux_denoise", "backward", "aux_sgd", "adam"]
    assert [phases.index(n) for n in order] == sorted(phases.index(n) for n in order)
    online, seen = agent.online, {}

    def watch(name, what):
        inner = dict(t.train_graph.phases)[name]

        def spy():
            seen[f"{name}:before"] = [a.copy() for a in what()]
            inner()
            seen[f"{name}:after"] = [a.copy() for a in what()]

        return spy

    spies = {
        "aux_denoise": watch("aux_denoise", lambda: (online.params, online.grads, den.grads)),
        "backward": watch("backward", lambda: (den.grads, den.dec_grads, den.out)),
    }
    t.train_graph.phases = [(n, spies.get(n, f)) for n, f in t.train_graph.phases]
    t.run(t.cfg.agent.learning_starts // t.cfg.env.n_envs + 1)
    (p0, g0, d0), (p1, g1, d1) = seen["aux_denoise:before"], seen["aux_denoise:after"]
    np.testing.assert_array_equal(_bits(p1), _bits(p0))
    np.testing.assert_array_equal(_bits(g1), _bits(g0))
    assert np.any(d1 != d0)  # the pass wrote its own gradient
    for before, after in zip(seen["backward:before"], seen["backward:after"], strict=True):
        np.testing.assert_array_equal(_bits(after), _bits(before))


def test_the_twin_shares_the_parameters_and_only_the_parameters():
    net = QNetwork(12, 3, hidden=(16, 8), extra_heads={"probe": _extra}, spectral=("enc.1",), max_batch=4)
    twin = net.twin()
    assert twin.params is net.params and twin.grads is not net.grads and twin.ws is None
    assert list(twin.linears) == list(net.linears) and list(twin.extras) == ["probe"]
    a, b = net.linears["enc.1"].sn, twin.linears["enc.1"].sn
    assert all(a[k] is b[k] for k in ("u", "v", "sigma", "w")) and a["dw"] is not b["dw"]
    assert not twin.linears["enc.1"].sn_in_forward  # only the network it shares moves u, v and W_sn
    with pytest.raises(ValueError, match="params_of"):
        QNetwork(12, 3, hidden=(16, 9), max_batch=None, params_of=net)


# --- GPU ---------------------------------------------------------------------------------------------
def test_causals_gathers_and_reduce_are_not_on_the_longest_chain_of_the_all_seven_step():
    """Counted in ops on the CPU (cudarl.hazards.longest_chain): neither the sub-batch's gathers nor causal's
    reduce lie on the step's longest chain; with them on causal's branch (the earlier schedule) that branch
    was the longest."""
    from cudarl.hazards import longest_chain

    t = _trainer(agent={"aux": ALL, "causal_groups": ["calendar", "offset"]})
    t.run(t.cfg.agent.learning_starts // t.cfg.env.n_envs + 2)
    ops = [n.op for n in longest_chain(t.train_graph)]
    assert ops and "auxgrad.spread_rows" not in ops and "causal.reduce" not in ops


def test_vaccine_asks_for_the_extra_heads_dpsi_only_where_they_run_first():
    """C51 with a head signal: the agent's extras_backward phase writes into vaccine's buffer (the step's
    backward reads it as its addend); without vaccine, or with IQN (whose head overwrites dL/dpsi), nobody asks."""
    t = _trainer(agent={"aux": ["horizons", "vaccine"]})
    assert t.agent.extras_early and t.agent.extras_dpsi is t.agent.aux[1].extras_sum is not None
    assert _trainer(agent={"aux": ["horizons"]}).agent.extras_dpsi is None
    iqn = _trainer(net={"head": "iqn"}, agent={"aux": ["horizons", "vaccine"]}).agent
    assert not iqn.extras_early and iqn.extras_dpsi is None and iqn.aux[1].extras_sum is None


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


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_gpu_the_heads_losses_and_their_backward_wait_for_the_heads_forward_not_the_rules_loss(head):
    """The auxiliary heads' losses fork from the extra heads' branch (buffers.after_extras) and, with C51, the
    extras_backward phase too: they wait for the extra heads' forward at s, not for the rule's loss phases
    on the main stream, which run beside them; the step's backward waits for both."""
    nodes, t = traced_train_graph({"net": {"head": head}, "agent": {"aux": ["horizons", "risk", "vaccine"]}})
    main = t.stream.ptr
    names = {name for name, _ in t.agent.rule.learn_phases()}  # C51: targets_loss; IQN: targets, loss
    rule = {n["id"] for n in nodes if n["phase"] in names and n["stream"] == main}
    losses = [next(n["id"] for n in nodes if n["name"] == f"cudarl_{s}_loss") for s in ("horizons", "risk")]
    extras = [n["id"] for n in nodes if n["phase"] == "extras_backward"]
    assert rule and losses and bool(extras) == (head == "c51")
    assert not any(rule & ancestors(nodes, i) for i in losses + extras)
    heads = {
        n["id"] for n in nodes if n["phase"] == "forward" and n["stream"] == t.agent.buffers.ws.extras_side.stream.ptr
    }
    assert heads and all(heads <= ancestors(nodes, i) for i in losses)
    first_backward = next(n["id"] for n in nodes if n["phase"] == "backward" and n["stream"] == main)
    # the dL/dpsi chain on side_aux (the heads' dW and vaccine's pass run on branches joined later)
    chain = {i for i in extras if nodes[i]["stream"] == t.agent.buffers.side_aux.stream.ptr}
    assert bool(chain) == (head == "c51")
    assert rule | set(losses) | chain <= ancestors(nodes, first_backward)


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_gpu_causals_backward_runs_beside_the_steps_and_its_grad_phase_adds_it(head):
    nodes, t = traced_train_graph({"net": {"head": head}, "agent": {"aux": HEADS_AND_CAUSAL}})
    mine = {n["id"] for n in nodes if n["phase"] == "aux_causal"}
    steps = [n["id"] for n in nodes if n["phase"] == "backward"]
    assert mine and steps
    assert not any(mine & ancestors(nodes, i) for i in steps)  # the step's backward waits for none of it
    assert not any(set(steps) & ancestors(nodes, i) for i in mine)  # nor it for the step's
    (add,) = [n["id"] for n in nodes if n["phase"] == "causal"]  # one launch: the sum
    assert nodes[add]["name"] == "cudarl_util_add_f32" and mine <= ancestors(nodes, add)
    assert set(steps) <= ancestors(nodes, add)


@pytest.mark.gpu
def test_gpu_causals_intervened_forward_runs_beside_the_steps_forward_and_homeostatic_beside_the_penalty():
    """C51 with all seven: the early phase's nodes (sub-batch rows, intervene, the intervened forward) wait
    for sample only, not for the step's forward, the rule's loss or q_stats; the penalty waits for q_stats
    (it reads q_s) and the intervention, not for the rule's loss, the causal gradient's add (vaccine's first
    kernel) for every early node, but the penalty
    not for homeostatic's kernels, which run on a branch of their own that the step's backward waits for
    (it reads the gradient they add)."""
    nodes, t = traced_train_graph({"agent": {"aux": ALL, "causal_groups": ["calendar", "offset"]}})
    early = {n["id"] for n in nodes if n["phase"] == "aux_causal_do"}
    assert early and {nodes[i]["name"] for i in early} >= {"cudarl_causal_intervene"}
    sample = next(n["id"] for n in nodes if n["name"] == "cudarl_replay_sample_search_gather_windows")
    assert all(sample in ancestors(nodes, i) for i in early)  # it reads the batch sample gathered
    later = [n["id"] for n in nodes if n["phase"] in ("forward", "targets_loss", "q_stats")]
    assert later and not any(early & ancestors(nodes, i) for i in later)  # none of the step's waits for it
    (pen,) = [n["id"] for n in nodes if n["name"] == "cudarl_causal_penalty_c51"]
    side = t.agent.buffers.side_qstats.stream.ptr
    q_stats = {n["id"] for n in nodes if n["phase"] == "q_stats" and n["stream"] == side}
    assert q_stats and q_stats <= ancestors(nodes, pen)
    # forked from q_stats' branch (buffers.after_q_stats), not after the rule's loss on the main stream
    learn = {n["id"] for n in nodes if n["phase"] == "targets_loss"}
    assert learn and not learn & ancestors(nodes, pen)
    # the penalty reads the intervened forward's Q head; the extra heads that forward ran on their own
    # branches (QNetwork.branch_extras) are joined by causal's own backward, which reads them, not by the
    # penalty (the H200 at 25977c5: two early nodes were not the penalty's ancestors)
    (intervene,) = [i for i in early if nodes[i]["name"] == "cudarl_causal_intervene"]
    assert intervene in ancestors(nodes, pen)
    # every early node before its gradient is added to the step's: by vaccine's first kernel, which adds it on
    # the fly (takes_addend: no causal phase with all seven)
    assert not [n for n in nodes if n["phase"] == "causal"]
    add = next(n["id"] for n in nodes if n["phase"] == "vaccine")
    assert nodes[add]["name"] == vaccine_nodes(t)[0] + "_plus" and early <= ancestors(nodes, add)
    homeo = {n["id"] for n in nodes if n["phase"] == "aux_homeostatic"}
    assert len(homeo) == 2 and t.stream.ptr not in {nodes[i]["stream"] for i in homeo}
    from cudarl import blas

    side = t.agent.aux[ALL.index("homeostatic")].side.stream.ptr
    assert {nodes[i]["stream"] for i in homeo} == {side} and side not in blas.prepared()  # no GEMM, no workspace
    assert not homeo & ancestors(nodes, pen)  # the penalty no longer waits for homeostatic
    first_backward = next(n["id"] for n in nodes if n["phase"] == "backward")
    assert homeo <= ancestors(nodes, first_backward)  # the backward reads what homeostatic added


@pytest.mark.gpu
def test_gpu_causals_gathers_and_reduce_are_off_its_chain():
    """C51 with all seven over a sub-batch: intervene reads the batch's rows itself (no gather in the early
    phase); q_s's rows are gathered beside the intervened forward (on a branch from q_stats') before the
    penalty; the reduce runs beside the pass's backward, which waits for none of it, and vaccine's kernel,
    which adds the pass's gradient, waits for it."""
    nodes, t = traced_train_graph({"agent": {"aux": ALL, "causal_groups": ["calendar", "offset"]}})
    assert t.cfg.agent.aux_rows < t.cfg.agent.batch_size
    early = {n["id"] for n in nodes if n["phase"] == "aux_causal_do"}
    assert early and not [i for i in early if nodes[i]["name"] == "cudarl_auxgrad_spread_rows"]
    (intervene,) = [i for i in early if nodes[i]["name"] == "cudarl_causal_intervene"]
    mine = [n["id"] for n in nodes if n["phase"] == "aux_causal"]
    (gather,) = [i for i in mine if nodes[i]["name"] == "cudarl_auxgrad_spread_rows"]
    (pen,) = [i for i in mine if nodes[i]["name"] == "cudarl_causal_penalty_c51"]
    (red,) = [i for i in mine if nodes[i]["name"] == "cudarl_causal_reduce"]
    assert intervene not in ancestors(nodes, gather) and gather in ancestors(nodes, pen)
    after = [i for i in mine if pen in ancestors(nodes, i) and i != red]  # the pass's backward
    assert after and not any(red in ancestors(nodes, i) for i in after)
    add = next(n["id"] for n in nodes if n["phase"] == "vaccine")
    assert red in ancestors(nodes, add)


@pytest.mark.gpu
def test_gpu_vaccines_copy_of_the_extra_heads_dpsi_is_on_its_branch_not_before_the_steps_backward():
    """C51 with all seven: the extra heads' backward writes their sum of dL/dpsi into vaccine's buffer, which
    the Q head's dx GEMM reads as its addend (C != D, no copy on the step's chain); vaccine's branch copies it
    into its own row, and no node of the step's backward waits for that copy."""
    nodes, t = traced_train_graph({"agent": {"aux": ALL, "causal_groups": ["calendar", "offset"]}})
    vaccine = t.agent.aux[ALL.index("vaccine")]
    assert vaccine.after_extras and t.agent.extras_dpsi is vaccine.extras_sum
    (copy,) = [n["id"] for n in nodes if n["phase"] == "extras_backward" and n["name"] == "cudarl_util_copy_u32"]
    assert nodes[copy]["stream"] == vaccine.side.stream.ptr
    steps = [n["id"] for n in nodes if n["phase"] == "backward" and n["stream"] == t.stream.ptr]
    assert steps and not any(copy in ancestors(nodes, i) for i in steps)
    assert not [n for n in nodes if n["phase"] == "backward" and n["name"] == "cudarl_util_copy_u32"]


@pytest.mark.gpu
def test_gpu_causals_pass_with_iqn_waits_for_the_forward_that_drew_its_taus():
    nodes, t = traced_train_graph({"net": {"head": "iqn"}, "agent": {"aux": HEADS_AND_CAUSAL}})
    assert not any(n["phase"] == "aux_causal_do" for n in nodes)
    mine = [n["id"] for n in nodes if n["phase"] == "aux_causal"]
    fwd = {n["id"] for n in nodes if n["phase"] == "forward" and n["stream"] == t.stream.ptr}
    assert mine and fwd and fwd <= ancestors(nodes, mine[0])


@pytest.mark.gpu
def test_gpu_denoises_pass_runs_beside_the_steps_forward_backward_and_losses_and_its_sgd_waits_for_it():
    nodes, t = traced_train_graph({"agent": {"aux": ["horizons", "risk", "denoise"]}})
    den = t.agent.aux[2]
    mine = {n["id"] for n in nodes if n["phase"] == "aux_denoise"}
    steps = [n["id"] for n in nodes if n["phase"] == "backward"]
    assert mine and steps
    assert den.side.stream.ptr in {nodes[i]["stream"] for i in mine}
    assert t.stream.ptr not in {nodes[i]["stream"] for i in mine}  # none of it on the main chain
    assert not any(mine & ancestors(nodes, i) for i in steps)  # the step's backward waits for none of it
    assert not any(set(steps) & ancestors(nodes, i) for i in mine)  # nor it for the step's
    fwd = {n["id"] for n in nodes if n["phase"] == "forward"}
    assert fwd and not any(fwd & ancestors(nodes, i) for i in mine)  # forked right after sample: nor the forward
    losses = [next(n["id"] for n in nodes if n["name"] == f"cudarl_{s}_loss") for s in ("horizons", "risk")]
    assert not any(mine & ancestors(nodes, i) for i in losses)  # beside the other signals' losses
    assert not any(set(losses) & ancestors(nodes, i) for i in mine)
    # one launch steps risk's head, the encoder and the decoder (issue 19: one node where three were)
    sgd = [n["id"] for n in nodes if n["phase"] == "aux_sgd"]
    assert [nodes[i]["name"] for i in sgd] == ["cudarl_auxsgd_steps"] and nodes[sgd[0]]["stream"] == t.stream.ptr
    assert mine | set(steps) <= ancestors(nodes, sgd[0])  # it joins the pass, after the backward
    first_adam = next(n["id"] for n in nodes if n["phase"] == "adam")
    assert set(sgd) <= ancestors(nodes, first_adam)  # Adam reads the parameters the steps moved


@pytest.mark.gpu
def test_gpu_homeostatics_phase_runs_beside_the_chain_and_the_backward_waits_for_it():
    """The homeostatic regulariser's two launches (probs_control, then grad_dueling, which waits for it: it
    reads g) sit on a branch of their own: nothing on the main stream after q_stats waits for them but the
    backward, which joins them (issue 19, the MLP's critical path)."""
    nodes, t = traced_train_graph({"agent": {"aux": ["horizons", "homeostatic", "causal"]}})
    homeo = t.agent.aux[1]
    mine = {n["id"] for n in nodes if n["phase"] == "aux_homeostatic"}
    assert len(mine) == 2 and {nodes[i]["stream"] for i in mine} == {homeo.side.stream.ptr}
    control, grad = sorted(mine, key=lambda i: nodes[i]["name"] != "cudarl_homeostatic_probs_control")
    assert [nodes[control]["name"], nodes[grad]["name"]] == [
        "cudarl_homeostatic_probs_control",
        "cudarl_homeostatic_grad_dueling",
    ]
    assert control in ancestors(nodes, grad)
    causal = {n["id"] for n in nodes if n["phase"] == "aux_causal"}
    assert causal and not any(mine & ancestors(nodes, i) for i in causal)  # beside causal's pass
    first_backward = next(n["id"] for n in nodes if n["phase"] == "backward")
    assert mine <= ancestors(nodes, first_backward)
    side = t.agent.buffers.side_qstats.stream.ptr
    q_stats = {n["id"] for n in nodes if n["phase"] == "q_stats" and n["stream"] == side}
    assert q_stats and q_stats <= set().union(*(ancestors(nodes, i) for i in mine))  # it reads the logits at s


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_gpu_q_stats_runs_beside_the_learn_phases_and_beside_the_backward_where_nothing_reads_them(head):
    """The q_stats phase's launches sit on ``buffers.side_qstats``, forked after the forward at s: the rule's
    learn phases do not wait for them (issue 20: two launches off the critical path). In the reference step
    (no CQL, plan head, causal or homeostatic) neither the backward nor Adam waits for them either, and
    publish joins them; with CQL, which reads the logits at s, the first CQL launch waits for them."""
    nodes, t = traced_train_graph({"net": {"head": head}})
    side = t.agent.buffers.side_qstats.stream.ptr
    assert not t.agent.q_stats_read
    mine = {n["id"] for n in nodes if n["phase"] == "q_stats"}
    rows = {i for i in mine if nodes[i]["stream"] == side}
    assert rows and {nodes[i]["stream"] for i in mine} <= {side, t.agent.buffers.side_stats.stream.ptr}
    first_backward = next(n["id"] for n in nodes if n["phase"] == "backward")
    first_adam = next(n["id"] for n in nodes if n["phase"] == "adam")
    assert not mine & (ancestors(nodes, first_backward) | ancestors(nodes, first_adam))
    last_publish = max(n["id"] for n in nodes if n["phase"] == "publish")
    assert mine <= ancestors(nodes, last_publish)
    forward = {n["id"] for n in nodes if n["phase"] == "forward" and n["stream"] == t.stream.ptr}
    assert forward <= set().union(*(ancestors(nodes, i) for i in rows))  # it reads the forward at s
    nodes, t = traced_train_graph({"net": {"head": head}, "agent": {"cql_alpha": 1.0}})
    assert t.agent.q_stats_read
    side = t.agent.buffers.side_qstats.stream.ptr
    rows = {n["id"] for n in nodes if n["phase"] == "q_stats" and n["stream"] == side}
    first_cql = next(n["id"] for n in nodes if n["phase"] == "cql")
    assert rows and rows <= ancestors(nodes, first_cql)
    learn = [n["id"] for n in nodes if n["phase"] in ("targets_loss", "targets", "loss")]
    assert learn and not any(rows & ancestors(nodes, i) for i in learn)  # beside the learn phases


@pytest.mark.parametrize(
    "over, read",
    [
        ({}, False),
        ({"net": {"head": "iqn"}}, False),
        ({"agent": {"aux": ["horizons", "risk", "denoise", "selectivity", "vaccine"]}}, False),
        ({"agent": {"cql_alpha": 1.0}}, True),
        ({"net": {"plan": True}}, True),
        ({"agent": {"aux": ["causal"]}}, False),  # its penalty's branch forks from q_stats': after_q_stats
        ({"agent": {"aux": ["homeostatic"]}}, True),
    ],
)
def test_q_stats_stays_on_the_main_stream_only_for_a_phase_that_reads_it(over, read):
    """``Agent.q_stats_read``: CQL, the plan head and the signals that declare ``reads_q_stats`` (homeostatic's
    logits; not causal, whose penalty reads q_s on a branch forked from q_stats') read q_stats' outputs before
    the backward on the main stream; otherwise it runs beside the
    backward (the GPU placement: the trace test below; the hazards of both: tests/unit/test_hazards.py)."""
    assert _trainer(**over).agent.q_stats_read is read


def test_a_shadow_workspace_shares_the_forward_and_owns_what_a_backward_writes(rng):
    """``QNetwork.backward_writes`` finds the gradient rows a backward writes (the last layer's: fewer),
    never the forward's activations, and ``Workspace.shadow`` gives exactly those buffers of its own."""
    net = QNetwork(12, 3, hidden=(16, 8), extra_heads={"probe": _extra}, max_batch=4)
    full, last = net.backward_writes(), net.backward_writes(last_layer=True)
    assert last < full and "enc.1.dout" in last and "enc.0.dout" in full - last
    assert not {n for n in full if n.endswith(".out") or n.endswith(".logits")}
    assert "aux.probe.dout" not in full  # an identity head's gradient rows are only read
    sh = net.ws.shadow(full)
    assert set(sh.bufs) == set(net.ws.bufs)
    for name, b in sh.bufs.items():
        assert (b is not net.ws.bufs[name]) == (name in full)


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_gpu_vaccines_backward_runs_beside_the_steps_and_its_grad_phase_waits_for_both(head):
    """Gradient Vaccine's backward (on its own branch: with C51, launched in the extras_backward phase from its
    copy of the extra heads' dL/dpsi, which the step's backward reads as its addend and so does not wait for;
    with IQN, in the backward phase) and the step's backward wait for none of each other; the grad phase
    (dots, control, apply: one launch with run.grid_barrier, else two; no copy of the gradient) waits for both."""
    nodes, t = traced_train_graph({"net": {"head": head}, "agent": {"aux": ["horizons", "risk", "vaccine"]}})
    vac = t.agent.aux[2]
    assert vac.after_extras == (head == "c51")
    mine_streams = {vac.side.stream.ptr, *(s.stream.ptr for s in vac.extra.sides)}
    phase = "extras_backward" if head == "c51" else "backward"
    mine = {n["id"] for n in nodes if n["phase"] == phase and n["stream"] in mine_streams}
    steps = [n["id"] for n in nodes if n["phase"] == "backward" and n["stream"] not in mine_streams]
    assert mine and steps
    assert not any(mine & ancestors(nodes, i) for i in steps)  # the step's backward waits for none of it
    assert not any(set(steps) & ancestors(nodes, i) for i in mine)  # nor it for the step's
    if head == "c51":
        copy = [n["id"] for n in nodes if n["name"] == "cudarl_util_copy_u32"]
        assert len(copy) == 1 and copy[0] in mine  # on vaccine's branch, the first of its nodes
        assert all(copy[0] in ancestors(nodes, i) for i in mine - set(copy))
    grad = [n for n in nodes if n["phase"] == "vaccine"]
    assert [n["name"] for n in grad] == list(vaccine_nodes(t))
    assert mine <= ancestors(nodes, grad[0]["id"]) and mine | set(steps) <= ancestors(nodes, applies(nodes, t))


@pytest.mark.gpu
def test_gpu_the_extra_heads_backward_runs_beside_homeostatic_and_the_backward_waits_for_it():
    """C51 with horizons, risk and homeostatic: the extras_backward phase's launches (the heads' dW and their
    dL/dpsi GEMMs) sit on ``buffers.side_aux``, after both heads' losses; homeostatic's kernels (on
    ``buffers.side_qgrad``'s side of the graph) do not wait for them nor they for homeostatic's; the step's
    first backward launch waits for both (issue 19: the heads' GEMMs off the step's chain)."""
    nodes, t = traced_train_graph({"agent": {"aux": ["horizons", "risk", "homeostatic"]}})
    assert t.agent.extras_early
    mine = {n["id"] for n in nodes if n["phase"] == "extras_backward"}
    assert mine and t.stream.ptr not in {nodes[i]["stream"] for i in mine}
    losses = [next(n["id"] for n in nodes if n["name"] == f"cudarl_{s}_loss") for s in ("horizons", "risk")]
    assert all(set(losses) <= ancestors(nodes, i) for i in mine)
    homeo = {n["id"] for n in nodes if n["phase"] == "aux_homeostatic"}
    assert homeo and not any(mine & ancestors(nodes, i) for i in homeo)
    assert not any(homeo & ancestors(nodes, i) for i in mine)
    # the dL/dpsi chain on side_aux (the heads' dW run on their layers' branches, joined before Adam)
    chain = {i for i in mine if nodes[i]["stream"] == t.agent.buffers.side_aux.stream.ptr}
    first_backward = next(n["id"] for n in nodes if n["phase"] == "backward")
    assert chain and chain | homeo <= ancestors(nodes, first_backward)


def test_the_own_sgd_steps_run_beside_vaccine_only_where_no_span_lies_in_its_span():
    """``Agent._sgd_beside``: vaccine's grad phase touches only a span of the flat gradient (with causal's
    gradient folded in, every entry but the extra heads'), so the own SGD steps (risk's head, denoise's encoder
    and decoder, whose gradients lie outside it) run beside it; a span whose gradient lay inside it would keep
    them after it, and so would a grad phase after vaccine's that declares no span (causal's, listed after
    vaccine: the order of the grad phases is agent.aux's)."""
    from cudarl.auxiliary.base import SgdSpan

    t = _trainer(agent={"aux": ALL})
    agent, vac = t.agent, t.agent.aux[-1]
    spans = [span for s in agent.aux for span in s.sgd_spans()]
    grad = agent._grad_signals()
    assert grad == [vac] and agent._sgd_beside(spans, grad) == [vac]
    lo, hi = vac.grad_span()
    assert lo == 0  # the input gate's logits (selectivity), which causal's gradient reaches
    for at in (slice(lo, lo + 8), slice(hi - 8, hi)):
        inside = SgdSpan(agent.online.params[at], agent.online.grads[at], 0.1)
        assert agent._sgd_beside([*spans, inside], grad) == []
    assert agent._sgd_beside([], grad) == []
    causal = agent.aux[ALL.index("causal")]
    assert agent._sgd_beside(spans, [vac, causal]) == []
    t = _trainer(agent={"aux": [s for s in ALL if s != "causal"] + ["causal"]})  # causal after vaccine
    agent, (vac, causal) = t.agent, t.agent.aux[-2:]
    assert agent._grad_signals() == [vac, causal] and vac.addend is None
    assert [n for n, _ in t.train_graph.phases][-6:-2] == ["backward", "vaccine", "causal", "aux_sgd"]


@pytest.mark.gpu
def test_gpu_the_own_sgd_steps_run_beside_vaccines_phase_after_causals_branch():
    """All seven: vaccine's grad phase joins causal's branch and adds its gradient in its kernels (no add
    of its own; one launch with run.grid_barrier, its default, two without); the own SGD steps run beside that
    phase, after both signals' branches (their backwards read the parameters the steps move), and Adam waits
    for both."""
    nodes, t = traced_train_graph({"agent": {"aux": ALL, "causal_groups": ["calendar", "offset"]}})
    (sgd,) = [n["id"] for n in nodes if n["phase"] == "aux_sgd"]
    vac = [n["id"] for n in nodes if n["phase"] == "vaccine"]
    first_adam = next(n["id"] for n in nodes if n["phase"] == "adam")
    assert not [n for n in nodes if n["phase"] == "causal"]
    assert [nodes[i]["name"] for i in vac] == [f"{k}_plus" for k in vaccine_nodes(t)]
    assert nodes[sgd]["stream"] != t.stream.ptr
    assert not any(sgd in ancestors(nodes, i) for i in vac) and not set(vac) & ancestors(nodes, sgd)
    assert {sgd, *vac} <= ancestors(nodes, first_adam)
    # after vaccine's own backward and causal's pass, which read the parameters the steps move
    sides = {t.agent.aux[-1].side.stream.ptr, t.agent.aux[ALL.index("causal")].side.stream.ptr}
    own = {n["id"] for n in nodes if n["stream"] in sides}
    assert own and own <= ancestors(nodes, sgd) and own <= ancestors(nodes, vac[0])


@pytest.mark.gpu
@pytest.mark.parametrize("grid_barrier", [True, False])
@pytest.mark.parametrize("early", [True, False])
def test_gpu_vaccines_grad_phase_is_one_launch_with_the_grid_barrier_and_two_without(grid_barrier, early, monkeypatch):
    """All seven on the MLP: vaccine's grad phase (causal's gradient folded in) at the tail after the step's
    backward (``early`` off: no branch holds the scope's gradients) is ONE node, ``dots_control_apply_plus`` (a
    grid barrier between the partials and the control step), with ``run.grid_barrier``; the two ``_plus``
    nodes without it (the same bits: tests/parity/test_vaccine.py). Either way it waits for both signals' own
    branches and the step's backward, and Adam waits for it. With its sums forked early (the MLP's default)
    ``dots_control_plus`` waits for both signals' branches and the last layer's weight-gradient branch and for
    none of the step's backward after it (the first layer's dW, the gate's fold backward, the main stream's dx
    chain); the apply, which waits for everything, is Adam's one launch with ``run.grid_barrier``
    (``optim.clip_adam_soft_vaccine``: the phase is that one node) and ``apply_plus`` after it without."""
    from cudarl.nn.layers import MLP

    if not early:
        monkeypatch.setattr(MLP, "last_layer_branch", property(lambda self: None))
    over = {"agent": {"aux": ALL, "causal_groups": ["calendar", "offset"]}, "run": {"grid_barrier": grid_barrier}}
    nodes, t = traced_train_graph(over)
    vaccine = t.agent.aux[-1]
    assert t.cfg.run.grid_barrier == grid_barrier and vaccine.early == early
    vac = [n["id"] for n in nodes if n["phase"] == "vaccine"]
    one, two = (
        ["cudarl_vaccine_dots_control_apply_plus"],
        ["cudarl_vaccine_dots_control_plus", "cudarl_vaccine_apply_plus"],
    )
    assert vaccine.folded == (early and grid_barrier)
    assert [nodes[i]["name"] for i in vac] == (two[:1] if vaccine.folded else one if grid_barrier else two)
    adam = {n["name"] for n in nodes if n["phase"] == "adam"}
    assert ("cudarl_optim_clip_adam_soft_vaccine" in adam) == vaccine.folded
    sides = {vaccine.side.stream.ptr, t.agent.aux[ALL.index("causal")].side.stream.ptr}
    own = {n["id"] for n in nodes if n["stream"] in sides}
    backward = {n["id"] for n in nodes if n["phase"] == "backward" and n["stream"] == t.stream.ptr}
    assert (
        own and backward and own <= ancestors(nodes, vac[0]) and own | backward <= ancestors(nodes, applies(nodes, t))
    )
    first_adam = next(n["id"] for n in nodes if n["phase"] == "adam")
    assert set(vac) <= ancestors(nodes, first_adam)
    if early:
        last, first = vaccine.last_branch.stream.ptr, t.agent.grad_sides[0].stream.ptr
        dots = ancestors(nodes, vac[0])
        last_dw = {n["id"] for n in nodes if n["phase"] == "backward" and n["stream"] == last}
        first_dw = {n["id"] for n in nodes if n["phase"] == "backward" and n["stream"] == first}
        assert nodes[vac[0]]["stream"] == vaccine.dots_side.stream.ptr and last != first
        assert last_dw and last_dw <= dots  # the scope's gradients are written
        assert first_dw and not first_dw & dots  # the first layer's dW (and the fold's backward) still running
        assert not backward <= dots  # nor the whole dx chain


@pytest.mark.gpu
def test_gpu_the_gate_folds_beside_sample_and_its_backward_follows_the_first_layers_dw():
    """All seven on the MLP: the selectivity gate is folded into the first layers (QNetwork.folded). The train
    graph has no gate forward or backward kernel; its two folds (online, target) run on the fold phase's branch
    beside sample, and every forward (the step's and causal's intervened one) waits for both; the fold's backward
    runs on the first layer's weight-gradient branch. The collect graph's act folds once, first."""
    import critical_path as cpath

    from cudarl import kernels

    nodes, t = traced_train_graph({"agent": {"aux": ALL, "causal_groups": ["calendar", "offset"]}})
    assert t.agent.online.folded is not None
    assert not {n["name"] for n in nodes} & {"cudarl_selectivity_forward", "cudarl_selectivity_backward"}
    folds = [n["id"] for n in nodes if n["name"] == "cudarl_selectivity_fold"]
    assert len(folds) == 2
    assert all(nodes[i]["phase"] == "fold" and nodes[i]["stream"] == t.agent.side_fold.stream.ptr for i in folds)
    sample = next(n["id"] for n in nodes if n["name"] == "cudarl_replay_sample_search_gather_windows")
    assert not any(sample in ancestors(nodes, i) or i in ancestors(nodes, sample) for i in folds)  # beside
    forwards = [n["id"] for n in nodes if n["phase"] in ("forward", "aux_causal_do")]
    assert forwards and all(set(folds) <= ancestors(nodes, i) for i in forwards)
    # the step's own (causal's and vaccine's backwards have theirs, on their branches)
    first_dw = t.agent.grad_sides[0].stream.ptr  # enc.0's weight-gradient branch
    backs = [n["id"] for n in nodes if n["name"] == "cudarl_selectivity_fold_backward"]
    (back,) = [i for i in backs if nodes[i]["stream"] == first_dw]
    assert nodes[back]["phase"] == "backward"
    assert all(nodes[i]["stream"] != t.stream.ptr for i in backs)  # none on the main chain
    adam = next(n["id"] for n in nodes if n["phase"] == "adam")
    assert back in ancestors(nodes, adam)
    with kernels.tracing() as events:
        t.collect_graph.capture()
    t.synchronize()
    acting = cpath.build_graph(events)
    assert [n["phase"] for n in acting if n["name"].startswith("cudarl_selectivity_")] == ["act"]
