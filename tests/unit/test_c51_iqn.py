"""``net.head = "c51+iqn"``: C51 and IQN on one encoder (the seed's model), IQN on a branch of its own.

CPU: the C51 half is the plain C51 rule bit for bit on the same weights and batch; the loss is the sum of
the two heads' losses (IQN's recomputed by the quantile twins from the head's outputs); the backward adds
both heads' dL/dpsi; through the trainer every head parameter and the encoder move, and resume is exact.
GPU: graphed equals eager, the IQN loss runs on another stream than C51's, and a step against NumPy.
"""

import numpy as np
import pytest
from test_rules import one_batch
from test_trainer import gpu_small, resumed_and_uninterrupted, small

from cudarl import losses
from cudarl.agent import Agent
from cudarl.config import from_dict
from cudarl.trainer import Trainer

B, OBS, A = 48, 6, 3


def quiet(cfg):
    return Trainer(cfg, run_dir=False, echo=lambda m: None)


def agent(head: str, xp=np, popart: bool = True, **net) -> Agent:
    cfg = from_dict(
        {
            "net": {"hidden": [32, 16], "head": head, "n_quantiles": 8, **net},
            "agent": {"batch_size": B, "popart": popart},
        }
    )
    return Agent(cfg, OBS, A, 4, xp)


def fill(ag, rng, xp=np) -> None:
    """One batch of random transitions and importance weights (largest 1) into ``ag`` (of backend ``xp``)."""
    assert ag.xp is xp
    one_batch(rng, B, OBS, A, max_one=True)(ag)


def learn(ag) -> None:
    ag.rule.forward(ag.batch)
    for _, phase in ag.rule.learn_phases():
        phase()


@pytest.mark.parametrize("popart", [False, True])
def test_the_c51_half_is_the_c51_rule_and_the_loss_is_the_sum(rng, popart):
    dual, plain = agent("c51+iqn", popart=popart), agent("c51", popart=popart)
    for name, view in plain.online.P.items():  # the shared names: encoder and C51 head
        view[...] = dual.online.P[name]
        plain.target.P[name][...] = dual.target.P[name]
    fill(dual, rng)
    for k in ("obs", "next_obs", "ret", "discount", "action"):
        getattr(plain.batch, k)[...] = getattr(dual.batch, k)
    plain.buffers.weights = dual.buffers.weights
    learn(dual)
    learn(plain)
    np.testing.assert_array_equal(dual.rule.c51_loss, plain.loss)
    np.testing.assert_array_equal(dual.priority, plain.priority)  # the priorities are C51's
    if popart:
        np.testing.assert_array_equal(dual.popart.state, plain.popart.state)  # moved once, by C51
    # IQN's loss from the quantile twins, on the head's outputs and taus of this step
    iqn, N = dual.online.head.iqn, 8
    rows = lambda net, ws, n: ws.rows(f"{net.head.iqn.name}.{n}", B)  # noqa: E731
    theta = rows(dual.online, dual.buffers.ws, "out.out").reshape(B, N, A)
    theta_next = rows(dual.online, dual.rule.ws_next, "out.out").reshape(B, N, A)
    theta_target = rows(dual.target, dual.target.ws, "out.out").reshape(B, N, A)
    ret = dual.batch.ret
    if popart:  # with the statistics before C51's update: recompute them from a fresh PopArt state
        from cudarl.reference import popart as pref

        st0 = pref.init_state(type(dual.rule).popart_scale(dual.cfg.net))
        ret = pref.normalize_rewards(dual.batch.ret, dual.batch.discount, st0)
    target = losses.quantile_targets(theta_next, theta_target, ret, dual.batch.discount).target
    want = losses.quantile_huber_loss(
        theta, dual.batch.action, target, rows(dual.online, dual.buffers.ws, "tau"), dual.buffers.weights
    )
    np.testing.assert_array_equal(dual.rule.loss_out.loss, np.float32([want.loss]))
    assert dual.loss[0] == np.float32(dual.rule.c51_loss[0] + dual.rule.loss_out.loss[0])
    assert iqn.name == "head.iqn" and dual.rule.counters.get("tau") == 1


def test_the_backward_adds_both_heads_gradients(rng):
    """Encoder gradients of the two-head step = those from C51's dL/dva alone + those from IQN's alone."""
    ag = agent("c51+iqn")
    fill(ag, rng)
    learn(ag)
    ws = ag.buffers.ws
    dva, dtheta = ws.rows(ag.online.head.raw_grad_name(), B), ws.rows(ag.online.head.iqn.grad_name, B)
    keep_va, keep_theta = dva.copy(), dtheta.copy()
    ag.backward()
    both = ag.online.grads.copy()
    dtheta[...] = 0
    ag.backward()
    c51_only = ag.online.grads.copy()
    dva[...], dtheta[...] = 0, keep_theta
    ag.backward()
    iqn_only = ag.online.grads.copy()
    enc = [e for e in ag.online.layout.entries if e.name.startswith("enc.")]
    for e in enc:
        s = slice(e.offset, e.offset + e.size)
        np.testing.assert_allclose(both[s], c51_only[s] + iqn_only[s], rtol=1e-4, atol=1e-7, err_msg=e.name)
        assert np.any(iqn_only[s] != 0) and np.any(c51_only[s] != 0)
    assert np.any(keep_va != 0)


def test_c51_iqn_trains_every_head_and_resumes_exactly(tmp_path):
    cfg = small(net={"head": "c51+iqn", "encoder": "ssm", "window": 5, "d_model": 8, "ssm_state": 4, "ssm_headdim": 4})
    t = quiet(cfg)
    p0 = t.agent.online.layout.views(t.agent.online.params.copy())
    t.run(30)
    P = t.agent.online.P
    for prefix in ("enc.", "head.va.", "head.iqn."):
        names = [k for k in P if k.startswith(prefix)]
        assert names and all(not np.array_equal(p0[k], P[k]) for k in names), prefix
    assert np.all(np.isfinite(t.losses))
    resumed_and_uninterrupted(cfg, tmp_path)


@pytest.mark.gpu
def test_gpu_c51_iqn_graphed_equals_eager_with_iqn_on_its_own_stream():
    from cudarl import kernels

    cfg = gpu_small(net={"head": "c51+iqn", "encoder": "ssm", "window": 8, "d_model": 16, "ssm_state": 8,
                         "ssm_headdim": 8})  # fmt: skip
    g, e = quiet(cfg), quiet(cfg)
    e.collect_graph.replay = e.collect_graph.run_eager
    e.train_graph.replay = e.train_graph.run_eager
    with kernels.tracing() as events:
        g.run(30)
    e.run(30)
    assert g.losses == e.losses and np.all(np.isfinite(g.losses))
    assert np.array_equal(g.agent.online.params.get(), e.agent.online.params.get())
    streams = {ev["name"]: ev["stream"] for ev in events if ev.get("kind") == "kernel"}
    c51 = [name for name in streams if name.startswith("cudarl_c51_targets_loss_popart_")]  # its A and K's variant
    assert len(c51) == 1 and streams["cudarl_quantile_huber_loss"] != streams[c51[0]]


@pytest.mark.gpu
def test_gpu_c51_iqn_step_matches_the_numpy_backend(rng):
    import cupy as cp

    from cudarl.testing import assert_parity

    agents = {"numpy": agent("c51+iqn"), "cupy": agent("c51+iqn", xp=cp)}
    agents["cupy"].online.params[...] = cp.asarray(agents["numpy"].online.params)
    agents["cupy"].target.params[...] = cp.asarray(agents["numpy"].target.params)
    for name, ag in agents.items():
        fill(ag, np.random.default_rng(5), np if name == "numpy" else cp)
        learn(ag)
    cp.cuda.Device().synchronize()
    got, want = agents["cupy"], agents["numpy"]
    assert_parity(got.priority, want.priority, rtol=1e-4, what="priorities")
    assert_parity(got.rule.c51_loss, want.rule.c51_loss, rtol=1e-4, what="C51 loss")
    assert_parity(got.rule.loss_out.loss, want.rule.loss_out.loss, rtol=1e-4, what="IQN loss")
    assert_parity(got.loss, want.loss, rtol=1e-4, what="loss")
