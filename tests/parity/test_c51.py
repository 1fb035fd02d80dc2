"""C51 family: the fused targets-and-loss from the dueling head's raw output, against the unfused chain
it replaces (cudarl.reference.c51_chain, cuda_src/c51_chain.cu: its oracle), and the n-step return.

CPU tests check ``cudarl.reference.c51`` (and ``cudarl.losses`` on NumPy); ``gpu`` tests hold
``cuda_src/c51.cu`` to it and to the chain's launches, bit for bit, eager and graphed.
"""

import numpy as np
import pytest
from c51_cases import empty, former_chain, gpu_inputs, popart_state, rand_probs

from cudarl import losses
from cudarl.reference import c51 as ref
from cudarl.reference import c51_chain
from cudarl.testing import assert_bitwise, assert_parity, assert_reruns_bitwise, finite_difference


# ---- n-step ---------------------------------------------------------------------------------
def test_n_step_with_n_one_equals_the_one_step_target(rng):
    B, K, gamma = 64, 51, 0.97
    z = np.linspace(-10, 10, K, dtype=np.float32)
    p = rand_probs(rng, B, K)
    r = rng.uniform(-1, 1, (B, 1)).astype(np.float32)
    term = (rng.random((B, 1)) < 0.3).astype(np.float32)
    r_t, d_t = ref.n_step(r, term, gamma)
    np.testing.assert_array_equal(r_t, r[:, 0])
    np.testing.assert_array_equal(d_t, np.float32(gamma) * (1 - term[:, 0]))
    np.testing.assert_array_equal(
        c51_chain.project(p, r_t, d_t, z), c51_chain.project(p, r[:, 0], np.float32(gamma) * (1 - term[:, 0]), z)
    )


def test_n_step_hand_case_stops_at_a_terminal():
    r = np.float32([[1, 2, 4], [1, 2, 4]])
    term = np.float32([[0, 0, 0], [0, 1, 0]])
    r_t, d_t = ref.n_step(r, term, 0.5, compute_dtype=np.float64)
    np.testing.assert_allclose(r_t, [1 + 1 + 1, 1 + 1])
    np.testing.assert_allclose(d_t, [0.125, 0.0])


def _va(rng, B, A, K, scale=1.5):
    """A dueling head's raw output ``[B, (1 + A) K]``."""
    return (rng.normal(size=(B, (1 + A) * K)) * scale).astype(np.float32)


def _combine(va, A, K):
    from cudarl.reference import nn as nref

    out = np.empty((va.shape[0], A, K), np.float32)
    nref.dueling_forward(va, out)
    return out


def _chain_from_va(va_tm1, va_on, va_tg, a, w, z, r, d, state=None, beta=None, priority="kl"):
    """The launches targets_loss replaces, on the reference: dueling combine, targets, loss, dueling backward."""
    from cudarl.reference import nn as nref

    A, K = va_tm1.shape[1] // z.shape[0] - 1, z.shape[0]
    tg = c51_chain.targets(_combine(va_on, A, K), _combine(va_tg, A, K), z, r, d, state, beta)
    per, mean, g, prio = c51_chain.loss(_combine(va_tm1, A, K), a, tg[0], w, priority=priority)
    dva = np.empty_like(va_tm1)
    nref.dueling_backward(g, dva)
    return tg, per, mean, prio, dva


def _targets_loss_inputs(rng, B, A, K):
    z, _, _, r, d, a, w = gpu_inputs(rng, B, A, K)
    return dict(va_tm1=_va(rng, B, A, K), va_on=_va(rng, B, A, K), va_tg=_va(rng, B, A, K), a=a, w=w, z=z, r=r, d=d)


@pytest.mark.parametrize("popart", [False, True])
def test_targets_loss_twin_is_the_chain_it_fuses(rng, popart):
    x = _targets_loss_inputs(rng, 37, 3, 21)
    state = popart_state(rng) if popart else None
    args = (x["va_tm1"], x["va_on"], x["va_tg"], x["a"], x["w"], x["z"], x["r"], x["d"])
    tg, per, mean, prio, dva = _chain_from_va(*args, state, 0.05 if popart else None)
    got = ref.targets_loss_popart(*args, state, 0.05) if popart else ref.targets_loss(*args)
    want = (tg if popart else tg[:3]) + (per, mean, prio, dva)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_bitwise(np.asarray(g), np.asarray(w), what=f"output {i}")
    moved = None if state is None else state.copy()
    res = losses.c51_targets_loss(*args, popart_state=moved, popart_beta=0.05 if popart else None)
    assert_bitwise(res.dva, dva, what="losses.c51_targets_loss dva")
    assert_bitwise(np.float32(res.loss), np.float32(mean), what="losses.c51_targets_loss loss")
    assert (res.y is None) == (not popart)
    if popart:  # the state moves in place, as on the GPU
        assert_bitwise(moved, got[5], what="PopArt state")
    # into a result object's buffers (the agent's form): the same numbers, in place
    B, K = x["va_tm1"].shape[0], x["z"].shape[0]
    out = losses.C51TargetsLoss.empty(np, B, 3, K, popart=popart)
    dva_buf = out.dva
    beta = 0.05 if popart else None
    again = losses.c51_targets_loss(
        *args, popart_state=None if state is None else state.copy(), popart_beta=beta, out=out
    )
    assert again is out and out.dva is dva_buf and out.loss.shape == (1,)
    assert_bitwise(out.dva, dva, what="dva into out")
    assert_bitwise(out.loss, np.float32([mean]), what="loss into out")


def test_targets_loss_twin_dva_is_the_gradient_of_its_loss():
    """dva against central differences of the loss written out in float64 from its definition
    (logits = V + Adv_a - mean_a Adv; L = (1/B) sum_b w_b CE(m_b, softmax(logits[b, a_b])), the target
    m held fixed): independent of the reference functions the twin shares with the chain above."""
    rng = np.random.default_rng(11)
    B, A, K = 5, 3, 7
    x = _targets_loss_inputs(rng, B, A, K)
    m, _, _, _, _, _, dva = ref.targets_loss(
        x["va_tm1"], x["va_on"], x["va_tg"], x["a"], x["w"], x["z"], x["r"], x["d"]
    )
    target, w, act = m.astype(np.float64), x["w"].astype(np.float64), x["a"]

    def loss(va):
        v, adv = va[:, :K][:, None, :], va[:, K:].reshape(B, A, K)
        chosen = (v + adv - adv.mean(axis=1, keepdims=True))[np.arange(B), act]
        logp = chosen - chosen.max(axis=1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(axis=1, keepdims=True))
        return float((w * -(target * logp).sum(axis=1)).sum() / B)

    want = finite_difference(loss, x["va_tm1"].astype(np.float64))
    np.testing.assert_allclose(dva, want, rtol=1e-3, atol=2e-6)
    assert np.abs(want).max() > 1e-3, "the check needs a gradient that is not all zero"


def test_targets_loss_twin_answers_a_bad_action_as_the_kernel():
    """An action outside [0, A): NaN loss and priority, a zero gradient row (the loss twin raises)."""
    rng = np.random.default_rng(3)
    x = _targets_loss_inputs(rng, 5, 3, 11)
    x["a"][2] = 3
    m, probs, a_star, per, mean, prio, dva = ref.targets_loss(
        x["va_tm1"], x["va_on"], x["va_tg"], x["a"], x["w"], x["z"], x["r"], x["d"]
    )
    assert np.isnan(per[2]) and np.isnan(prio[2]) and np.isnan(mean)
    assert not np.any(dva[2]) and np.all(np.isfinite(np.delete(per, 2)))


@pytest.mark.parametrize("head", ["c51", "iqn"])
@pytest.mark.parametrize("popart", [False, True])
def test_agent_targets_phase_on_numpy_is_theformer_chain(rng, head, popart):
    """The rule's targets phase (C51: targets_loss) on the CPU backend gives the numbers of the former
    op chain (C51: dueling combine, targets, loss, dueling backward)."""
    from cudarl.agent import Agent
    from cudarl.bench import reference_config
    from cudarl.reference import popart as pref
    from cudarl.reference import quantile as qref

    cfg = reference_config(
        "cpu",
        capacity=1024,
        net={"hidden": [16], "head": head, "atoms": 21},
        agent={"batch_size": 24, "learning_starts": 24, "popart": popart},
        env={"n_envs": 2},
    )
    agent = Agent(cfg, 6, 3, 2, np)
    batch = agent.batch
    batch.obs[...] = rng.normal(size=batch.obs.shape)
    batch.next_obs[...] = rng.normal(size=batch.next_obs.shape)
    batch.ret[...] = rng.uniform(-3, 3, 24)
    batch.discount[...] = rng.choice(np.float32([0.0, 0.97]), 24)
    batch.action[...] = rng.integers(0, 3, 24)
    if popart:
        agent.popart.state[...] = popart_state(rng, float(agent.popart.state[pref.SCALE]))
    state0 = None if agent.popart is None else agent.popart.state.copy()
    beta = None if agent.popart is None else agent.popart.scalars.view("beta")[0]
    rule, buf = agent.rule, agent.buffers
    rule.forward(batch)
    if head == "c51":
        w = rng.uniform(0.1, 1, 24).astype(np.float32)
        buf.weights = w
        assert [name for name, _ in rule.learn_phases()] == ["targets_loss"]
        for _, phase in rule.learn_phases():
            phase()
        tg, per, mean, prio, dva = _chain_from_va(
            rule.va,
            rule.va_online_next,
            rule.va_target_next,
            batch.action,
            w,
            rule.support,
            batch.ret,
            batch.discount,
            state0,
            beta,
            priority=cfg.agent.priority,
        )
        want_online = _combine(rule.va_online_next, 3, 21)
        assert_bitwise(
            rule.out.target,
            former_chain(
                want_online, _combine(rule.va_target_next, 3, 21), rule.support, batch.ret, batch.discount, state0, beta
            )[0],
            what="C51 target",
        )
        for got, want, what in (
            (rule.out.target, tg[0], "target"),
            (agent.loss_per, per, "loss_per"),
            (agent.priority, prio, "priority"),
            (buf.train_grad(raw=True), dva, "dL/dva"),
            (agent.loss[0], np.float32(mean), "loss"),
        ):
            assert_bitwise(got, want, what=what)
        new_state = tg[5]
    else:
        targets = dict(rule.learn_phases())["targets"]
        targets()
        r_in = batch.ret
        if popart:
            new_state = pref.update(batch.ret, state0, beta)
            r_in = pref.normalize_rewards(batch.ret, batch.discount, new_state)
        assert_bitwise(
            rule.targets_out.target,
            qref.targets(rule.online_next, rule.target_next, r_in, batch.discount)[0],
            what="quantile target",
        )
    if popart:
        assert_bitwise(agent.popart.state, new_state, what="PopArt state")
        assert not np.array_equal(agent.popart.state, state0)


@pytest.mark.gpu
def test_gpu_n_step_matches_reference(cp, rng):
    from cudarl.ops import c51 as ops

    B, n = 1000, 3
    r = rng.uniform(-1, 1, (B, n)).astype(np.float32)
    term = (rng.random((B, n)) < 0.2).astype(np.float32)
    gamma = cp.asarray(np.float32([0.97]))
    r_t, d_t = empty(cp, (B,)), empty(cp, (B,))
    ops.n_step(cp.asarray(r), cp.asarray(term), gamma, r_t, d_t)
    want_r, want_d = ref.n_step(r, term, 0.97)
    assert_parity(r_t, want_r, what="n-step reward")
    assert_parity(d_t, want_d, what="n-step discount")


# ---- targets_loss: the targets and the loss in one launch from the head's raw output -----------
def _tl_buffers(cp, rng, B, A, K, popart):
    host = _targets_loss_inputs(rng, B, A, K)
    host.update(state=popart_state(rng), beta=np.float32([0.05]))
    dev = {k: cp.asarray(v) for k, v in host.items()}
    dev.update(done=cp.zeros(1, np.uint32), barrier=cp.zeros(1, np.uint32), scratch=empty(cp, (8,)))
    outs = dict(
        probs=empty(cp, (B, K)),
        a_star=empty(cp, (B,), np.int32),
        m=empty(cp, (B, K)),
        per=empty(cp, (B,)),
        loss=empty(cp, (1,)),
        prio=empty(cp, (B,)),
        dva=empty(cp, (B, (1 + A) * K)),
    )
    if popart:
        outs.update(y=empty(cp, (B,)), r_norm=empty(cp, (B,)))
    return host, dev, outs


def _gpu_targets_loss(dev, outs, popart, grid_barrier=True):
    out = losses.C51TargetsLoss(
        target=outs["m"],
        probs=outs["probs"],
        a_star=outs["a_star"],
        loss_per=outs["per"],
        loss=outs["loss"],
        priority=outs["prio"],
        dva=outs["dva"],
        y=outs.get("y"),
        r_norm=outs.get("r_norm"),
        done=dev["done"],
        barrier=dev["barrier"] if popart else None,
        scratch=dev["scratch"] if popart else None,
    )
    kw = {} if not popart else dict(popart_state=dev["state"], popart_beta=dev["beta"], grid_barrier=grid_barrier)
    return losses.c51_targets_loss(
        dev["va_tm1"],
        dev["va_on"],
        dev["va_tg"],
        dev["a"],
        dev["w"],
        dev["z"],
        dev["r"],
        dev["d"],
        **kw,
        out=out,
    )


def _gpu_launch_chain(cp, dev, outs, popart):
    """The launches targets_loss replaces: dueling_forward x3, the targets (one launch, or two with
    PopArt), the loss, dueling_backward; into ``outs``, moving ``dev["state"]`` with PopArt."""
    from cudarl.ops import c51_chain as ops
    from cudarl.ops import nn as nops

    B, K = dev["a"].shape[0], dev["z"].shape[0]
    A = dev["va_tm1"].shape[1] // K - 1
    lg = {}
    for name in ("va_tm1", "va_on", "va_tg"):
        lg[name] = empty(cp, (B, A, K))
        nops.dueling_forward(dev[name], lg[name])
    if popart:
        scratch = empty(cp, (8,))
        ops.next_probs_td(
            lg["va_on"],
            lg["va_tg"],
            dev["z"],
            dev["r"],
            dev["d"],
            dev["state"],
            outs["probs"],
            outs["a_star"],
            outs["y"],
            scratch,
        )
        ops.project_popart(
            outs["probs"],
            dev["r"],
            dev["d"],
            dev["z"],
            outs["y"],
            scratch,
            dev["beta"],
            dev["state"],
            outs["r_norm"],
            outs["m"],
        )
    else:
        ops.targets(lg["va_on"], lg["va_tg"], dev["z"], dev["r"], dev["d"], outs["m"], outs["probs"], outs["a_star"])
    grad = empty(cp, (B, A, K))
    ops.loss(
        lg["va_tm1"],
        dev["a"],
        outs["m"],
        dev["w"],
        outs["per"],
        outs["loss"],
        grad,
        outs["prio"],
        cp.zeros(1, np.uint32),
    )
    nops.dueling_backward(grad, outs["dva"])


#: (B, A, K) of the bitwise test below: every kernel variant (cudarl/ops/c51.py tl_variant) at its
#: edges. regs3: A = 1, 2, 3 (K = 11, 33, 51, 64); regs4: A = 4; regs8: A = 5, 6, 8 (K = 11, 17, 64;
#: B = 1000 puts two samples on some warps); generic: A = 9, K = 65 (one atom past the register
#: path), K = 101, B = 4096 (1024 blocks' worth of samples on at most one block per SM), K = 1024
#: (80 KiB of shared memory, the opt-in).
TL_CASES = [
    (1, 3, 11),
    (7, 3, 51),
    (512, 3, 51),
    (33, 1, 33),
    (50, 2, 51),
    (9, 3, 64),
    (40, 4, 40),
    (100, 8, 64),
    (1000, 5, 11),
    (20, 6, 17),
    (64, 9, 51),
    (70, 3, 65),
    (4096, 3, 101),
    (300, 3, 1024),
]


def test_the_bitwise_cases_launch_every_kernel_variant():
    """Each variant of targets_loss[_popart] (one compile unit each: their machine code is their own)
    is run by the GPU test below, at the fewest and the most actions it takes."""
    from cudarl.ops import c51 as ops

    got = {}
    for _, A, K in TL_CASES:
        got.setdefault(ops.tl_variant(A, K), set()).add(A)
    for op, variants in ops.KERNEL_VARIANTS.items():
        assert set(got) == set(variants), op
    assert got["regs3"] >= {1, 2, 3} and got["regs4"] == {4} and got["regs8"] >= {5, 8} and 9 in got["generic"]


@pytest.mark.gpu
@pytest.mark.parametrize("popart,grid_barrier", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("B,A,K", TL_CASES)
def test_gpu_targets_loss_is_bitwise_the_launch_chain_it_replaces(cp, rng, B, A, K, popart, grid_barrier):
    """Every output of the one launch, or of the two-launch form without the grid barrier, against
    the six to seven launches it replaces (three dueling_forward, the targets in one launch or two
    with PopArt, the loss, dueling_backward), for every kernel variant (:data:`TL_CASES`): the
    register path for at most 3, 4 and 8 actions (K <= 64) and the generic path."""
    host, dev, outs = _tl_buffers(cp, rng, B, A, K, popart)
    if B >= 7:
        dev["a"][3] = A  # an action out of range: NaN loss and priority, zero gradient, in both
    _assert_targets_loss_is_the_chain(cp, host, dev, outs, popart, grid_barrier)
    if B >= 7:
        assert np.isnan(outs["per"].get()[3]) and not outs["dva"].get()[3].any()


@pytest.mark.gpu
@pytest.mark.parametrize("popart,grid_barrier", [(False, True), (True, False)])
def test_gpu_targets_loss_with_negative_discounts_is_bitwise_the_chain(cp, rng, popart, grid_barrier):
    """A negative discount turns the shares' order around (l_j decreasing in j): the register path's
    projection takes its every-j loop (staged_sums) for those samples instead of the runs of shares
    (staged_sum_run), and every output must still be the chain's bits."""
    host, dev, outs = _tl_buffers(cp, rng, 64, 3, 51, popart)
    dev["d"][::3] = np.float32(-0.5)
    _assert_targets_loss_is_the_chain(cp, host, dev, outs, popart, grid_barrier)


def _assert_targets_loss_is_the_chain(cp, host, dev, outs, popart, grid_barrier):
    """targets_loss (the launcher's form for grid_barrier) against the launch chain on dev, bit for bit."""
    chain = {k: empty(cp, v.shape, v.dtype) for k, v in outs.items()}
    _gpu_launch_chain(cp, dev, chain, popart)
    chain_state = dev["state"].copy()
    dev["state"][...] = cp.asarray(host["state"])
    res = _gpu_targets_loss(dev, outs, popart, grid_barrier)
    cp.cuda.get_current_stream().synchronize()
    assert res.dva is outs["dva"] and res.loss is outs["loss"]
    for k in outs:
        assert_bitwise(outs[k], chain[k], what=k)
    assert_bitwise(dev["state"], chain_state, what="PopArt state")
    if popart:
        assert not np.array_equal(dev["state"].get(), host["state"]), "the PopArt statistics did not move"
    assert int(dev["done"].get()[0]) == 0 and int(dev["barrier"].get()[0]) == 0, "counters must be left at 0"


@pytest.mark.gpu
@pytest.mark.parametrize("popart", [False, True])
def test_gpu_targets_loss_matches_the_twin(cp, rng, popart):
    host, dev, outs = _tl_buffers(cp, rng, 512, 3, 51, popart)
    _gpu_targets_loss(dev, outs, popart)
    cp.cuda.get_current_stream().synchronize()
    args = (host["va_tm1"], host["va_on"], host["va_tg"], host["a"], host["w"], host["z"], host["r"], host["d"])
    if popart:
        m, probs, a_star, y, r_norm, state, per, loss, prio, dva = ref.targets_loss_popart(*args, host["state"], 0.05)
        assert_parity(outs["y"], y, what="y")
        assert_parity(outs["r_norm"], r_norm, what="normalised rewards")
        np.testing.assert_allclose(dev["state"].get(), state, rtol=1e-5, atol=1e-6)
    else:
        m, probs, a_star, per, loss, prio, dva = ref.targets_loss(*args)
    assert_bitwise(outs["a_star"], a_star, what="a* (no near-ties in these draws)")
    for k, want in (("probs", probs), ("m", m), ("per", per), ("prio", prio), ("dva", dva)):
        assert_parity(outs[k], want, what=k)
    np.testing.assert_allclose(float(outs["loss"].get()[0]), float(loss), rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("popart", [False, True])
@pytest.mark.parametrize("A,K", [(3, 51), (4, 51), (6, 51), (9, 51)])  # regs3, regs4, regs8, generic
def test_gpu_targets_loss_is_repeatable_and_graphed_equals_eager(cp, rng, popart, A, K):
    from cudarl.graph import StepGraph

    host, dev, outs = _tl_buffers(cp, rng, 2000, A, K, popart)
    cp.cuda.Device().synchronize()
    g = StepGraph("c51_targets_loss_parity", [("targets_loss", lambda: _gpu_targets_loss(dev, outs, popart))], xp=cp)
    g.run_eager()
    g.synchronize()
    first = {k: v.get() for k, v in dict(outs, state=dev["state"]).items()}

    def restore():
        dev["state"][...] = cp.asarray(host["state"])

    def same_state(attempt):
        assert_bitwise(dev["state"], first["state"], what=f"{attempt} PopArt state")
        assert int(dev["done"].get()[0]) == 0 and int(dev["barrier"].get()[0]) == 0, f"{attempt}: counters not 0"

    assert_reruns_bitwise(g, outs, first, ("eager", "eager"), reset=restore, check=same_state)
    g.capture()
    assert_reruns_bitwise(g, outs, first, ("graphed", "graphed", "graphed"), reset=restore, check=same_state)
