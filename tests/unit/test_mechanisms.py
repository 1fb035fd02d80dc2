"""Every mechanism through the trainer (issue 18, DESIGN rule 8): its observable moves when it is on and
stays put when it is off. PopArt's two halves, the Q statistics and the guard's collapse rule, the
plan head, the offline regularisers, spectral norm, shrink-and-perturb, input noise. GPU tests (graphed == eager,
bit for bit) are marked and run by tools/gpu_check.sh."""

import json

import numpy as np
import pytest
from test_trainer import gpu_small, resumed_and_uninterrupted, small

from cudarl.reference import popart as pref
from cudarl.trainer import Trainer


def trainer(**over) -> Trainer:
    return Trainer(small(**over), run_dir=False, echo=lambda m: None)


def step_rows(t: Trainer) -> list:
    """The metric rows a run logs (the trainer's rows, captured)."""
    rows = []
    t._log_row = rows.append
    return rows


# --- PopArt ----------------------------------------------------------------------------------------
def _denormalised(t: Trainer, x, taus):
    """``s theta + mu`` of the online net for ``x`` at fixed quantile fractions (float64)."""
    net = t.agent.online
    kw = {"tau": taus} if taus is not None else {}
    theta = np.array(net.forward(x, net.new_workspace(x.shape[0]), **kw)["q"], np.float64)
    st = t.agent.popart.state.astype(np.float64)
    return st[pref.SIGMA] / st[pref.SCALE] * theta + st[pref.MU]


@pytest.mark.parametrize("head", ["iqn", "qrdqn"])
def test_popart_rescale_preserves_the_unnormalised_outputs_through_the_agent(head):
    """Each statistics update (the train step's own, on its sampled batch of bar-sized returns) rescales
    head.out so that s theta + mu at fixed weights and fractions is unchanged; without the rescale the
    outputs move (the issue measured 99%, 5.8%, 4.4% over the first three steps)."""
    t = trainer(net={"head": head}, agent={"popart": True})
    t.run(5)  # a few updates: the statistics are already moving
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, t.env.obs_dim)).astype(np.float32)
    N = t.cfg.net.n_quantiles
    taus = rng.uniform(size=(16, N)).astype(np.float32) if head == "iqn" else None
    sample, forward = (dict(t.train_graph.phases)[k] for k in ("sample", "forward"))
    for _ in range(3):
        before = _denormalised(t, x, taus)
        st0 = t.agent.popart.state.copy()
        sample()
        t.agent.rule.popart_step()  # statistics update + rescale of the online and the target head.out
        assert not np.array_equal(st0, t.agent.popart.state)  # the statistics moved
        after = _denormalised(t, x, taus)
        assert np.abs(after - before).max() <= 1e-5 * np.abs(before).max(), np.abs(after - before).max()
    # the other half alone (statistics moved, layer not rescaled) moves them: the test can fail
    sample()
    before = _denormalised(t, x, taus)
    t.agent.popart.update_normalize_rewards(t.batch.ret, t.batch.ret, t.batch.discount)
    assert np.abs(_denormalised(t, x, taus) - before).max() > 1e-3 * np.abs(before).max()
    del forward


def test_popart_target_net_is_rescaled_with_the_online_net():
    t = trainer(net={"head": "iqn"}, agent={"popart": True})
    t.run(3)
    name = "head.out.bias"
    on0, tg0 = t.agent.online.P[name].copy(), t.agent.target.P[name].copy()
    dict(t.train_graph.phases)["sample"]()
    t.agent.rule.popart_step()
    st = t.agent.popart.state
    _, want_tg = pref.rescale(np.zeros((1, on0.size), np.float32), tg0, st)
    np.testing.assert_array_equal(t.agent.target.P[name], want_tg)
    assert not np.array_equal(t.agent.online.P[name], on0)


@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_popart_statistics_move_during_the_warmup_then_freeze(head):
    """C51's fixed atoms: after agent.popart_warmup updates the statistics stop (beta 0), so atom z means
    the return s z + mu for good; at fixed weights the unnormalised expected Q no longer moves."""
    t = trainer(net={"head": head}, agent={"popart": True, "popart_warmup": 20})
    t.run(20)
    frozen = t.agent.popart.state.copy()
    assert frozen[pref.MU] != 0 and frozen[pref.SIGMA] != 1 and t.agent.popart.frozen
    t.run(40)
    np.testing.assert_array_equal(t.agent.popart.state[:2], frozen[:2])  # mu, sigma: every bit
    assert t.agent.popart.state[pref.MU_PREV] == frozen[pref.MU]
    moving = trainer(net={"head": head}, agent={"popart": True, "popart_warmup": 0})  # 0: never frozen
    moving.run(40)
    assert not moving.agent.popart.frozen and moving.agent.popart.state[pref.MU] != t.agent.popart.state[pref.MU]


def test_popart_freeze_survives_resume(tmp_path):
    """Frozen at 30, saved at 50: the resumed run is frozen and gives the uninterrupted run's losses."""
    resumed, _ = resumed_and_uninterrupted(small(agent={"popart": True, "popart_warmup": 30}), tmp_path)
    assert resumed.agent.popart.frozen


# --- Q statistics and the guard's collapse rule ------------------------------------------------------
@pytest.mark.parametrize("head", ["c51", "iqn", "qrdqn"])
def test_q_statistics_reach_every_metrics_row_one_step_late(head, tmp_path):
    t = Trainer(small(tmp_path, net={"head": head}), run_dir=tmp_path / "run", echo=lambda m: None)
    t.run(60)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [20, 40, 60]
    for r in steps:
        assert r["q_var"] > 0 and len(r["q_var_by_action"]) == 3
        if head == "c51":
            assert 0 < r["atom_utilisation"] <= 1 and 0 < r["atom_entropy"] <= np.log(t.cfg.net.atoms) + 1e-6
        else:  # no atoms: null, never NaN (strict JSON)
            assert r["atom_utilisation"] is None and r["atom_entropy"] is None
    assert len({r["q_var"] for r in steps}) == 3  # they move with training
    # the same numbers as the statistics of the last update's batch, computed here from its forward
    st = t.agent.stats.read(t.step)
    assert st == t.monitor.last_stats and st["q_var"] == steps[-1]["q_var"]


def test_the_guard_stops_a_collapsed_distribution():
    """The seed's bug: bar returns of a few basis points on a support of +-10 without PopArt. With
    gamma 0 the C51 distribution collapses onto one atom of 11 within ~60 updates (utilisation 1/11);
    the collapse rule (guard.min_atom_utilisation) stops the run. With PopArt the same run keeps ~80%."""
    from cudarl.guard import GuardStop

    over = dict(
        agent={"popart": False, "gamma": 0.0},
        net={"atoms": 11},
        optim={"lr": 3e-3},
        guard={"action": "stop", "window": 5, "min_atom_utilisation": 0.2},
        replay={"n_step": 1},
    )
    t = trainer(**over)
    with pytest.raises(GuardStop, match="atom_utilisation = 0.0909 < 0.2"):
        t.run(200)
    assert t.events[-1]["action"] == "stop" and "atom_utilisation" in t.events[-1]["message"]
    healthy = trainer(**{**over, "agent": {"popart": True, "gamma": 0.0}})
    healthy.run(200)  # PopArt fits the returns to the support: the rule never trips
    assert healthy.monitor.last_stats["atom_utilisation"] > 0.5


# --- GPU ---------------------------------------------------------------------------------------------
def _graphed_and_eager(**over):
    g = Trainer(gpu_small(**over), run_dir=False, echo=lambda m: None)
    e = Trainer(gpu_small(**over), run_dir=False, echo=lambda m: None)
    e.collect_graph.replay = e.collect_graph.run_eager
    e.train_graph.replay = e.train_graph.run_eager
    return g, e


def _assert_same_bits(g, e):
    assert g.losses == e.losses
    for a, b in ((g.agent.online.params, e.agent.online.params), (g.agent.target.params, e.agent.target.params)):
        assert np.array_equal(a.get(), b.get())
    assert g.monitor.last_stats == e.monitor.last_stats


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "iqn", "qrdqn"])
def test_gpu_popart_and_q_statistics_graphed_equal_eager(head):
    """PopArt (the rescale of head.out for the quantile heads, the freeze after the warm-up) and the Q
    statistics' phase and ring, graphed and eager, bit for bit; the unnormalised outputs preserved."""
    over = {"net": {"head": head}, "agent": {"popart": True, "popart_warmup": 25}}
    g, e = _graphed_and_eager(**over)
    g.run(40)
    e.run(40)
    _assert_same_bits(g, e)
    assert np.array_equal(g.agent.popart.state.get(), e.agent.popart.state.get())
    assert g.agent.popart.frozen
    assert g.monitor.last_stats["q_var"] > 0
    if head == "c51":
        assert 0 < g.monitor.last_stats["atom_utilisation"] <= 1


# --- the plan head (net.plan) ----------------------------------------------------------------------
def _cpu_run(source: str, steps: int, **over):
    from cudarl.config import from_dict, resolve_for_backend

    d = {
        "run": {"device": "cpu", "steps": steps, "eval_every": 0, "checkpoint_every": 0, "log_every": steps // 4},
        "data": {"source": source},
    }
    for sec, vals in over.items():
        d.setdefault(sec, {}).update(vals)
    t = Trainer(resolve_for_backend(from_dict(d), False, d), run_dir=False, echo=lambda m: None)
    rows = step_rows(t)
    t.run()
    return t, [r for r in rows if "loss" in r]


@pytest.mark.slow
def test_plan_gate_opens_on_a_signal_and_stays_shut_on_noise():
    """The leakage canary (the next return in the features): the gate opens for the batch (readiness
    learned, plan_ready -> 1) and conviction sizes positions, fractional in the environments and in the
    evaluation. A random walk: readiness never clears the hurdle, the gate stays shut (every scale 1)."""
    canary, rows = _cpu_run(
        "builtin:canary?n=3000",
        480,
        net={"plan": True},
        agent={"gamma": 0.5},
        replay={"n_step": 1},
        features={"extra": ["next_return"]},  # the leak, named
    )
    assert rows[0]["plan_ready"] == 0.0 and rows[-1]["plan_ready"] > 0.5, [r["plan_ready"] for r in rows]
    assert 0.5 < rows[-1]["plan_scale"] < 1.0
    held = np.abs(canary.env.state.position)
    assert ((held > 0) & (held < 1)).any()  # fractional positions in the training environments
    pos = np.abs(canary.greedy_positions(canary.data.splits.test))
    assert ((pos > 0) & (pos < 1)).mean() > 0.5  # and in the deployed policy
    noise, rows = _cpu_run("builtin:randomwalk?n=3000", 480, net={"plan": True})
    # at most one row of a 64-row batch at a time (measured: 0, 0, 0, 1 of 64 at the four logs)
    assert all(r["plan_ready"] <= 1 / 64 for r in rows), [r["plan_ready"] for r in rows]
    assert np.mean(noise.env.scale == 1.0) > 0.9
    pos = np.abs(noise.greedy_positions(noise.data.splits.test))
    assert ((pos > 0) & (pos < 1)).mean() < 0.02  # held-out bars: the gate opened on 0.9% (4 of 439)


def test_readiness_is_trained_and_an_untrained_gate_is_exactly_one():
    """Readiness gets a gradient from its own loss (the seed's got none through the gate); at
    initialisation every gate is exactly 1, so the plan head cannot shrink positions before it learns."""
    t = trainer(net={"plan": True})
    w0 = t.agent.online.P["plan.lin.weight"].copy()
    t.run(20)
    w = t.agent.online.P["plan.lin.weight"]
    assert not np.array_equal(w0[:, 1], w[:, 1]) and not np.array_equal(w0[:, 0], w[:, 0])
    assert np.all(t.env.scale == 1.0) and t.monitor.last_stats["plan_ready"] == 0.0
    names = [n for n, _ in t.train_graph.phases]
    assert names.index("plan") == names.index("q_stats_join") + 1


def test_the_plan_head_off_builds_nothing_and_changes_no_bit():
    off, on = trainer(), trainer(net={"plan": True})
    assert "plan" not in dict(off.train_graph.phases) and off.agent.plan is None
    assert "plan.lin.weight" not in off.agent.online.P and "plan_ready" not in off.agent.stats.offsets
    off.run(30)
    base = trainer()
    base.run(30)
    assert off.losses == base.losses
    on.run(30)  # the head is a probe: the Q-network learns the same until the gate opens
    assert on.losses == off.losses


def test_a_policy_file_sizes_positions_as_the_trainer(tmp_path):
    from cudarl.policy import load_policy

    t = Trainer(small(tmp_path, net={"plan": True}, run={"checkpoint_every": 40}), run_dir=tmp_path / "r", echo=print)
    t.run(40)
    sc = t.agent.online.P["plan.lin.bias"]
    sc[...] = np.float32([0.0, 3.0])  # an open gate (readiness ~0.95) with conviction ~0.5
    t.save_policy("open")
    want = t.greedy_positions(t.data.splits.val)
    assert ((np.abs(want) > 0) & (np.abs(want) < 1)).any()
    p = load_policy(tmp_path / "r" / "checkpoints" / "open.safetensors", device="cpu")
    np.testing.assert_array_equal(p.evaluate(split="val").position, want)
    assert p._q_rows() is None  # no block Q: q_values is the network's forward, which the gate reads


# --- spectral normalisation (net.spectral) and shrink-and-perturb (optim.shrink_every) ---------------
def test_spectral_norm_keeps_the_layers_top_singular_value_at_one_through_the_trainer():
    on, off = trainer(net={"spectral": ["enc.1"]}), trainer()
    assert [n for n, _ in on.train_graph.phases][-2:] == ["spectral", "publish"]
    assert "spectral" not in dict(off.train_graph.phases)
    on.run(60)
    off.run(60)
    lin = on.agent.online.linears["enc.1"]
    W = on.agent.online.P["enc.1.weight"].astype(np.float64)
    np.testing.assert_allclose(np.linalg.svd(lin.sn["w"].astype(np.float64), compute_uv=False)[0], 1.0, rtol=0.05)
    np.testing.assert_allclose(lin.sn["w"], (W / lin.sn["sigma"][0]).astype(np.float32), rtol=1e-6)
    assert np.linalg.svd(off.agent.online.P["enc.1.weight"], compute_uv=False)[0] > 1.2  # the observable moved
    assert on.losses != off.losses and np.isfinite(on.losses).all()
    tlin = on.agent.target.linears["enc.1"]  # the target's own W_sn, of its own (soft-updated) weights
    np.testing.assert_allclose(tlin.sn["w"], on.agent.target.P["enc.1.weight"] / tlin.sn["sigma"][0], rtol=1e-6)


def test_spectral_norm_resumes_exactly_and_a_policy_file_acts_as_the_trainer(tmp_path):
    from cudarl.policy import load_policy

    cfg = small(net={"spectral": ["enc.1", "head.va"]}, run={"checkpoint_every": 50})
    _, full = resumed_and_uninterrupted(cfg, tmp_path)
    p = load_policy(tmp_path / "full" / "checkpoints" / "step-00000100.safetensors", device="cpu")
    np.testing.assert_array_equal(p.evaluate(split="val").position, full.greedy_positions(full.data.splits.val))


def test_shrink_and_perturb_acts_every_shrink_every_updates():
    """With perturb 0 and shrink 0.5 the online parameters after update 20 are exactly half those of a run
    without it (0.5 x is exact in float32); update 19 is untouched; the noise run differs again."""
    over = {"optim": {"shrink_every": 20, "shrink": 0.5, "perturb": 0.0}}
    sp, plain = trainer(**over), trainer()
    sp.run(19)
    plain.run(19)
    np.testing.assert_array_equal(sp.agent.online.params, plain.agent.online.params)
    sp.run(20)
    plain.run(20)
    np.testing.assert_array_equal(sp.agent.online.params, np.float32(0.5) * plain.agent.online.params)
    noisy = trainer(optim={"shrink_every": 20, "shrink": 0.5, "perturb": 0.01})
    noisy.run(20)
    d = noisy.agent.online.params - np.float32(0.5) * plain.agent.online.params
    assert 0.005 < float(np.std(d[np.flatnonzero(d)])) < 0.02  # N(0, 0.01^2) noise on every parameter


def test_shrink_and_perturb_resumes_exactly(tmp_path):
    """Shrunk at 30, saved at 50, shrunk again at 60 and 90 after the resume: the same losses."""
    resumed_and_uninterrupted(small(optim={"shrink_every": 30, "perturb": 0.01}), tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_gpu_plan_spectral_shrink_and_cql_graphed_equal_eager(head):
    """Every mechanism of issue 18 on at once: the plan head (collect gate and loss), spectral norm on two
    layers, shrink-and-perturb between replays, CQL and PopArt; graphed and eager, bit for bit."""
    spectral = ["enc.1", "head.va" if head == "c51" else "head.out"]
    over = {
        "net": {"head": head, "plan": True, "spectral": spectral},
        "optim": {"shrink_every": 15, "perturb": 0.01},
        "agent": {"cql_alpha": 0.5, "popart": True, "popart_warmup": 20},
    }
    g, e = _graphed_and_eager(**over)
    g.run(40)
    e.run(40)
    _assert_same_bits(g, e)
    assert np.array_equal(g.env.scale.get(), e.env.scale.get())
    assert g.monitor.last_stats["cql_loss"] > 0 and 0 <= g.monitor.last_stats["plan_ready"] <= 1


# --- input noise (agent.input_noise) -----------------------------------------------------------------
def _windows_of(t: Trainer, rows):
    return t.env.windows.of(np.asarray(rows))


@pytest.mark.parametrize("window", [1, 4])
def test_input_noise_moves_the_windows_of_s_by_the_twins_draws_and_leaves_s_prime_clean(window):
    """After a run, the learner's last batch: the windows of s are the clean windows of its state rows plus
    the twin's noise keyed by the optimiser's step (feature columns only), the windows of s' are clean;
    off, no phase runs and s is clean."""
    from cudarl.reference import window as wref

    t = trainer(agent={"input_noise": 0.5}, net={"window": window})
    t.run(60)
    a, B = t.agent, t.agent.batch_size
    assert "input_noise" in [n for n, _ in t.train_graph.phases]
    step = int(a.adam.scalars.view("step")[0])
    assert step > 0
    want = _windows_of(t, a.rows_pair[:B])
    wref.noise(want, np.array([step]), window, t.env.windows.n_features, wref.noise_scale(0.5), t.cfg.run.seed)
    assert np.array_equal(a.pair[:B], want)
    assert np.array_equal(a.pair[B:], _windows_of(t, a.rows_pair[B:]))
    moved = (a.pair[:B] - _windows_of(t, a.rows_pair[:B])).reshape(B, window, -1)
    f = t.env.windows.n_features
    assert np.all(moved[:, :, f:] == 0) and 0.4 < float(moved[:, :, :f].std()) < 0.6

    off = trainer(net={"window": window})
    off.run(60)
    assert "input_noise" not in [n for n, _ in off.train_graph.phases]
    assert np.array_equal(off.agent.pair[:B], _windows_of(off, off.agent.rows_pair[:B]))
    assert off.losses[:1] != t.losses[:1] or off.losses != t.losses


def test_input_noise_resumes_exactly(tmp_path):
    """The draws are keyed by the optimiser's step, which a checkpoint keeps: a resumed run draws the same."""
    resumed_and_uninterrupted(small(agent={"input_noise": 0.5}), tmp_path)


@pytest.mark.gpu
def test_gpu_input_noise_graphed_equals_eager():
    """agent.input_noise in the captured train step (after the join of the schedules' branch), graphed and
    eager, bit for bit."""
    g, e = _graphed_and_eager(agent={"input_noise": 0.5}, net={"window": 4})
    g.run(40)
    e.run(40)
    _assert_same_bits(g, e)
