"""The declared seams: head rules (HeadRule), encoders (Encoder), auxiliary signals (AuxSignal).

Each part is reached from config through one registry, and a new part needs no branch in the agent
or the network: a test registers a small encoder and a small auxiliary signal and runs them in the
trainer's train graph. QR-DQN (``net.head = "qrdqn"``) is the worked example of a new head.
"""

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from test_trainer import gpu_small, resumed_and_uninterrupted, small

from cudarl import losses
from cudarl.agent import Agent
from cudarl.auxiliary import AUX_SIGNALS
from cudarl.auxiliary.base import AuxBase
from cudarl.config import ConfigError, from_dict
from cudarl.nn import ENCODERS, Linear, QNetwork
from cudarl.reference import quantile as qref
from cudarl.rules import HEAD_RULES, HeadRule
from cudarl.testing import assert_bitwise
from cudarl.trainer import Trainer

PKG = Path(__file__).resolve().parents[2] / "cudarl"
HEADS = sorted(HEAD_RULES)


def quiet(cfg, **kw):
    return Trainer(cfg, run_dir=kw.pop("run_dir", False), echo=lambda m: None, **kw)


# --- the interfaces ------------------------------------------------------------------------------
def test_every_rule_declares_the_interface():
    wanted = [n for n in dir(HeadRule) if not n.startswith("_")]
    assert set(wanted) >= {"allocate", "act", "expected_q", "forward", "learn_phases", "state_dict"}
    for name, rule in HEAD_RULES.items():
        missing = [n for n in wanted if not callable(getattr(rule, n, None))]
        assert not missing, f"{name}: {rule.__name__} lacks {missing}"


def _calls(path: Path, names: set) -> list:
    tree = ast.parse(path.read_text())
    return [
        f"{path.name}:{n.lineno}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names
    ]


def test_the_agent_and_the_network_never_ask_which_part_they_run():
    """No hasattr in the agent, no isinstance in QNetwork (the former code told heads apart so)."""
    assert _calls(PKG / "agent.py", {"hasattr", "isinstance"}) == []
    assert _calls(PKG / "nn" / "network.py", {"hasattr"}) == []
    kinds = [
        ast.unparse(n.args[1])
        for n in ast.walk(ast.parse((PKG / "nn" / "network.py").read_text()))
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "isinstance"
    ]
    assert kinds and not [k for k in kinds if "Head" in k], f"QNetwork tells heads apart: {kinds}"


def test_config_names_the_registered_parts():
    with pytest.raises(ConfigError, match=r"head must be one of \['c51', 'c51\+iqn', 'iqn', 'qrdqn'\]"):
        from_dict({"net": {"head": "c52"}})
    with pytest.raises(ConfigError, match=r"encoder must be one of \['attention', 'mlp', 'ssm'\]"):
        from_dict({"net": {"encoder": "lstm"}})
    with pytest.raises(ConfigError, match="aux: no auxiliary signal named"):
        from_dict({"agent": {"aux": ["nope"]}})


# --- QR-DQN, the worked example ------------------------------------------------------------------
def test_qr_head_output_layout_and_gradient():
    """QRHead's [B, N * A] output read as [B, N, A]; its backward against central differences."""
    net = QNetwork(5, 3, hidden=(4,), head="qrdqn", n_quantiles=6, dtype=np.float64, max_batch=2, seed=1)
    x = np.random.default_rng(0).standard_normal((2, 5))
    q = net.forward(x)["q"]
    assert q.shape == (2, 6, 3) == net.forward_shape(2)
    flat = net.ws.rows("head.out.out", 2)
    np.testing.assert_array_equal(q[1, 4, 2], flat[1, 4 * 3 + 2])
    r = np.random.default_rng(1).standard_normal(q.shape)
    net.grad_outputs()["q"][...] = r
    net.backward(x)
    w = net.P["head.out.weight"]
    analytic, h = net.G["head.out.weight"].copy(), 1e-6
    for idx in [(0, 0), (3, 17), (2, 9)]:
        w[idx] += h
        up = float(np.sum(net.forward(x)["q"] * r))
        w[idx] -= 2 * h
        down = float(np.sum(net.forward(x)["q"] * r))
        w[idx] += h
        assert abs((up - down) / (2 * h) - analytic[idx]) < 1e-6


def test_qrdqn_learn_phases_are_the_quantile_twins_at_fixed_midpoints(rng):
    cfg = from_dict({"net": {"hidden": [8], "head": "qrdqn", "n_quantiles": 5}, "agent": {"batch_size": 6}})
    agent = Agent(cfg, 4, 3, 2, np)
    buf, batch = agent.buffers, agent.batch
    batch.obs[...] = rng.normal(size=batch.obs.shape)
    batch.next_obs[...] = rng.normal(size=batch.next_obs.shape)
    batch.ret[...] = rng.uniform(-1, 1, 6)
    batch.discount[...] = rng.choice(np.float32([0.0, 0.97]), 6)
    batch.action[...] = rng.integers(0, 3, 6)
    buf.weights = rng.uniform(0.1, 1, 6).astype(np.float32)
    state0 = agent.popart.state.copy()
    agent.rule.forward(batch)
    assert [name for name, _ in agent.rule.learn_phases()] == ["targets", "loss"]
    for _, phase in agent.rule.learn_phases():
        phase()
    theta_s = agent.target.forward(batch.next_obs)["q"]  # the target net at s'
    both = agent.online.forward(agent.pair, buf.ws)["q"]
    from cudarl.reference import popart as pref

    r_in = pref.normalize_rewards(batch.ret, batch.discount, pref.update(batch.ret, state0, cfg.agent.popart_beta))
    target, _ = qref.targets(both[6:], theta_s, r_in, batch.discount)
    per, mean, grad = qref.huber_loss(both[:6], batch.action, target, losses.qr_taus(5), buf.weights, cfg.agent.kappa)
    assert_bitwise(buf.priority, per, what="priorities (the per-sample loss)")
    assert_bitwise(buf.loss, np.float32([mean]), what="loss")
    assert_bitwise(buf.train_grad(), grad, what="dL/dtheta")


@pytest.mark.parametrize("head", HEADS)
def test_each_head_trains_through_the_trainer(head):
    """Every registered head: the losses are finite and move, the networks and priorities move."""
    t = quiet(small(net={"head": head}))
    p0 = t.agent.online.params.copy()
    t.run(40)
    assert len(t.losses) == 40 and np.all(np.isfinite(t.losses)) and len(set(t.losses)) > 30
    assert not np.array_equal(p0, t.agent.online.params)
    assert np.unique(t.replay.priorities()[t.replay.priorities() > 0]).size > 30


def test_qrdqn_same_seed_is_bitwise_and_resume_is_exact(tmp_path):
    cfg = small(net={"head": "qrdqn"})
    a, b = quiet(cfg), quiet(cfg)
    a.run(30)
    b.run(30)
    assert a.losses == b.losses
    resumed_and_uninterrupted(cfg, tmp_path)


@pytest.mark.gpu
def test_gpu_qrdqn_graphed_equals_eager_and_same_seed_is_bitwise():
    cfg = gpu_small(net={"head": "qrdqn"})
    g, e, again = quiet(cfg), quiet(cfg), quiet(cfg)
    e.collect_graph.replay = e.collect_graph.run_eager
    e.train_graph.replay = e.train_graph.run_eager
    for t in (g, e, again):
        t.run(40)
    assert g.losses == e.losses == again.losses and np.all(np.isfinite(g.losses))
    assert np.array_equal(g.agent.online.params.get(), e.agent.online.params.get())


def one_batch(rng, B: int, obs_dim: int, n_actions: int = 3, max_one: bool = False):
    """``fill(agent)``: writes one random batch and importance weights (``max_one``: scaled to a largest
    of 1) into an agent of either backend, the same values every call (a GPU step against the NumPy
    backend's)."""
    host = dict(
        obs=rng.normal(size=(B, obs_dim)),
        next_obs=rng.normal(size=(B, obs_dim)),
        ret=rng.uniform(-1, 1, B),
        discount=rng.choice([0.0, 0.97], B),
        action=rng.integers(0, n_actions, B),
    )
    w = rng.uniform(0.1, 1, B).astype(np.float32)
    w = w / w.max() if max_one else w

    def fill(agent):
        xp = agent.xp
        for k, v in host.items():
            getattr(agent.batch, k)[...] = xp.asarray(v.astype(getattr(agent.batch, k).dtype))
        agent.buffers.weights = xp.asarray(w)

    return fill


@pytest.mark.gpu
def test_gpu_qrdqn_matches_the_numpy_backend_for_a_step(rng):
    """One QR-DQN learn step on the GPU (graphed pieces: the quantile kernels with taus [N]) against
    the NumPy backend on the same batch: the loss and priorities to float32 rounding."""
    import cupy as cp

    from cudarl.testing import assert_parity

    cfg = from_dict({"net": {"hidden": [32], "head": "qrdqn", "n_quantiles": 8}, "agent": {"batch_size": 64}})
    agents = {xp.__name__: Agent(cfg, 6, 3, 4, xp) for xp in (np, cp)}
    fill = one_batch(rng, 64, 6)
    for agent in agents.values():
        fill(agent)
        agent.rule.forward(agent.batch)
        for _, phase in agent.rule.learn_phases():
            phase()
    cp.cuda.Device().synchronize()
    got, want = agents["cupy"].buffers, agents["numpy"].buffers
    assert_parity(got.priority, want.priority, rtol=1e-4, what="priorities")
    assert_parity(got.loss, want.loss, rtol=1e-4, what="loss")


# --- an encoder is one registration -----------------------------------------------------------------
class _Linear1:
    """A test encoder: one linear layer with ReLU (the MLP's conventions, so the network needs nothing else)."""

    def __init__(self, name, n_in, net):
        self.name, self.n_in, self.n_out = name, n_in, 16
        self.layer = Linear(f"{name}.lin", n_in, 16, tf32=net.tf32, gemm=net.gemm)
        self.children = [self.layer]

    @property
    def out_name(self):
        return self.layer.name

    def declare(self, layout, ws_spec):
        self.layer.declare(layout, ws_spec)

    def bind(self, P, G, xp):
        self.layer.bind(P, G, xp)

    def forward(self, x, ws):
        return self.layer.forward(x, ws)

    def backward(self, x, ws, dx=None):
        self.layer.backward(x, ws, dx)


def test_a_registered_encoder_is_reached_from_config(monkeypatch):
    monkeypatch.setitem(ENCODERS, "linear1", _Linear1)
    t = quiet(small(net={"encoder": "linear1"}))
    assert type(t.agent.online.encoder) is _Linear1 and "enc.lin.weight" in t.agent.online.P
    w0 = t.agent.online.P["enc.lin.weight"].copy()
    t.run(20)
    assert np.all(np.isfinite(t.losses)) and not np.array_equal(w0, t.agent.online.P["enc.lin.weight"])


# --- an auxiliary signal is one registration ----------------------------------------------------------
class _ReturnSignal(AuxBase):
    """A test auxiliary signal: a linear head on psi predicts the batch's n-step return (squared error).
    NumPy arithmetic: a CPU test of the seam (a production signal brings a kernel family)."""

    name = "ret"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.loss = np.zeros(1, np.float32)

    def make_head(self, d):
        return Linear("aux.ret", d, 1, act="identity")

    def phases(self):
        return [("aux_ret", self._loss)]

    def _loss(self):
        buf, B = self.buf, self.buf.batch_size
        err = buf.ws.rows("aux.ret.out", B)[:, 0] - buf.batch.ret
        self.loss[0] = np.mean(err * err)
        buf.ws.rows("aux.ret.dout", B)[:, 0] = 2 * err / B

    def observable(self):
        return {"aux.ret.loss": float(self.loss[0])}


@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_a_registered_aux_signal_runs_in_the_train_graph_and_its_observable_moves(monkeypatch, tmp_path, head):
    monkeypatch.setitem(AUX_SIGNALS, "ret", _ReturnSignal)
    cfg = small(tmp_path, net={"head": head}, agent={"aux": ["ret"]}, run={"log_every": 10})
    t = quiet(cfg, run_dir=tmp_path / "run")
    names = [name for name, _ in t.train_graph.phases]
    # after the rule's, before the backward (with C51 the extra heads' backward between: Agent.extras_early)
    after = ["extras_backward"] if head == "c51" else []
    assert t.agent.extras_early is (head == "c51")
    i = names.index("aux_ret")
    assert names[i + 1 : i + 2 + len(after)] == [*after, "priorities"]
    w0 = t.agent.online.P["aux.ret.weight"].copy()
    t.run(40)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    seen = [r["aux.ret.loss"] for r in rows if "aux.ret.loss" in r]
    assert len(seen) == 4 and np.all(np.isfinite(seen)) and len(set(seen)) == 4
    assert not np.array_equal(w0, t.agent.online.P["aux.ret.weight"]), "its head was not trained"
    assert "aux.ret.weight" in t.agent.target.P  # the target net has the same layout


def test_the_aux_heads_gradient_reaches_the_encoder(monkeypatch):
    """The aux head's gradient reaches the encoder: with the signal, the encoder's first update differs
    from a run without it, and the head's own parameters (absent there) are the only new tensors."""
    monkeypatch.setitem(AUX_SIGNALS, "ret", _ReturnSignal)
    plain, aux = quiet(small()), quiet(small(agent={"aux": ["ret"]}))
    assert set(aux.agent.online.P) - set(plain.agent.online.P) == {"aux.ret.weight", "aux.ret.bias"}
    plain.run(1)
    aux.run(1)
    assert not np.array_equal(plain.agent.online.P["enc.0.weight"], aux.agent.online.P["enc.0.weight"])
