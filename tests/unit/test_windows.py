"""Observation windows through the env and the trainer, and the temporal encoders trained end to end (CPU).

* No look-ahead with windows: changing every bar after t changes no observation of a bar up to t.
* The replay's memory does not grow with the window (it stores state rows); its bytes per row.
* The act path is the windowed forward: the Q-values the collect step acted on equal the network's
  forward of windows cut from the feature matrix by hand.
* Each encoder trains through the trainer (its parameters move; same seed, same bits).
* On ``builtin:lag`` the signal reaches the agent: bar t - 4's return sits at its window slot, the
  reward correlates with that slot alone, and a ridge regression on 64-bar windows recovers it
  (tools/probe_window.py, whose probes are smoke-tested here too).
GPU: the same through the graphs (graphed equals eager, and against the NumPy backend).
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from test_features import perturb_after
from test_trainer import gpu_small, small

from cudarl.data import load
from cudarl.env import TradingEnv
from cudarl.prepare import prepare_data
from cudarl.reference.window import BAR, HOLD, MIRROR, POSITION
from cudarl.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

#: Small temporal encoders (odd sizes: a window the chunk does not divide, two groups of heads).
ENCODER_NETS = {
    "ssm": {"encoder": "ssm", "window": 7, "d_model": 8, "layers": 2, "ssm_state": 4, "ssm_headdim": 4,
            "ssm_groups": 2, "ssm_chunk": 3},
    "attention": {"encoder": "attention", "window": 7, "d_model": 8, "layers": 2, "attn_heads": 2,
                  "attn_mlp_ratio": 2},
    "mlp": {"encoder": "mlp", "window": 7},
}  # fmt: skip


def quiet(_):
    pass


def by_hand(rows, feats, sign, window):
    """Windows cut from the feature matrix with slices, one row at a time (independent of the gather)."""
    f_n = feats.shape[1]
    out = np.zeros((rows.shape[0], window, f_n + 2), np.float32)
    for i, r in enumerate(rows):
        t = int(r[BAR])
        for w in range(window):
            b = t - window + 1 + w
            if b >= 0:
                out[i, w, :f_n] = feats[b] * sign if r[MIRROR] else feats[b]
        out[i, -1, f_n:] = r[POSITION], r[HOLD]
    return out.reshape(rows.shape[0], -1)


def test_no_lookahead_with_windows(rng):
    """An env walks the same steps over two markets that differ only after bar t: every observation
    whose bar is at most t (its whole window of 16 bars) is the same; later ones differ."""
    cfg = small(net={"window": 16})
    bars = load("builtin:regime?n=1500")
    base = prepare_data(cfg, bars)
    tr = base.splits.train
    for t in ((tr.start + tr.stop) // 2, tr.stop - 150):
        other = prepare_data(cfg, perturb_after(bars, t, rng), base.normaliser)
        obs = []
        for p in (base, other):
            env = TradingEnv(
                p.bars.open, p.bars.close, p.x, p.sign, cfg.env, t_begin=tr.start, t_end=tr.stop, window=p.window,
                backend="numpy",
            )  # fmt: skip
            seen = []
            for _ in range(400):
                seen.append((env.rows.copy(), env.obs.copy()))
                env.step(np.arange(env.n_envs, dtype=np.int32) % 3)
            obs.append(seen)
        past = future = 0
        for (rows_a, obs_a), (rows_b, obs_b) in zip(*obs, strict=True):
            np.testing.assert_array_equal(rows_a, rows_b)  # the env's walk does not depend on prices
            early = rows_a[:, BAR] <= t
            np.testing.assert_array_equal(obs_a[early], obs_b[early])
            past += int(early.sum())
            future += int(np.any(obs_a[~early] != obs_b[~early]))
        assert past > 100 and future > 10  # both kinds were seen, and the change is visible after t


def walk_long(spec, window, episode_len):
    """One env, always long, over the training split of ``spec`` from its first bar whose window is past
    the features' warm-up (whose rows are zeros): the prepared data, the observations it saw
    [S, window, F + 2], their bars [S] and the rewards they earned [S]."""
    cfg = small(net={"window": window}, env={"n_envs": 1, "episode_len": episode_len, "stagger": False})
    p = prepare_data(cfg, load(spec))
    t0 = p.splits.train.start + window
    env = TradingEnv(
        p.bars.open, p.bars.close, p.x, p.sign, cfg.env, t_begin=t0, t_end=t0 + episode_len + 2,
        window=p.window, backend="numpy",
    )  # fmt: skip
    long_ = np.full(1, cfg.env.n_actions - 1, np.int32)
    obs, bars, rewards = [], [], []
    for _ in range(episode_len):
        obs.append(env.obs[0].copy())
        bars.append(int(env.rows[0, BAR]))
        env.step(long_)
        rewards.append(float(env.reward[0]))
    return p, np.array(obs).reshape(episode_len, window, -1), np.array(bars), np.array(rewards)


def test_a_window_holds_each_past_bars_return_at_its_slot():
    """Slot ``window - 1 - k`` of the observation of bar t holds bar t - k's normalised 1-bar return,
    computed here from the closes: ``clip(log(C_b / C_(b-1)) / (sigma_b std), 5)``. On ``builtin:lag``
    (lag 5) the slot ``window - 5`` (bar t - 4) is the one the next return echoes."""
    from cudarl.features import FeatureContext

    window = 8
    p, obs, bars, _ = walk_long("builtin:lag?n=3000", window, 600)
    assert np.array_equal(bars, p.splits.train.start + window + np.arange(bars.size))  # one bar at a time
    j = p.names.index("ret_1")
    c = p.bars.close
    sigma = FeatureContext.of(p.bars, small().features).sigma
    for k in range(window):
        b = bars - k
        want = np.clip(np.log(c[b] / c[b - 1]) / sigma[b] / p.normaliser.std[j], -5, 5)
        np.testing.assert_allclose(obs[:, window - 1 - k, j], want, rtol=1e-5, atol=1e-6)


def test_the_lag_signal_reaches_the_reward_through_its_slot_alone():
    """End to end through the env: the reward of a long position taken at bar t (``R_(t+1)`` less costs)
    correlates with the window slot of bar t - 4's return (``phi = 0.15``) and with no other slot's.
    The bound is 4 standard errors of a correlation (``1 / sqrt(n)``) on these fixed bars."""
    window, n = 8, 6000
    p, obs, _, reward = walk_long(f"builtin:lag?n={n}", window, 3500)
    j = p.names.index("ret_1")
    corr = np.array([np.corrcoef(obs[:, w, j], reward)[0, 1] for w in range(window)])
    se = 1 / np.sqrt(reward.size)
    assert abs(corr[window - 5] - 0.15) < 4 * se, corr
    others = np.delete(corr, window - 5)
    assert np.all(np.abs(others) < 4 * se), corr


def test_least_squares_on_the_windows_recovers_the_lag_signal():
    """The information is there and usable: a ridge regression of ``R_(t+1)`` on the 64-bar windows of the
    training split (832 inputs, a ridge of one per training row: a prior chosen before looking, no
    tuning) puts its largest weight on bar t - 4's return (``ret_1``, or ``body``, the same column on a
    synthetic market whose bars open at the previous close), and its forecast correlates with the
    validation split's next returns by more than half of ``phi = 0.15``, the best causal forecast's."""
    from probe_window import ridge_fit, ridge_predict, split_windows

    window = 64
    p = prepare_data(small(net={"window": window}), load("builtin:lag?n=20000"))
    x, y = split_windows(p, p.splits.train, window)
    beta = ridge_fit(x, y, penalty=float(len(x)))
    slot, col = divmod(int(np.argmax(np.abs(beta[:-1]))), p.x.shape[1] + 2)
    assert slot == window - 5 and p.names[col] in ("ret_1", "body"), (slot, col)
    xv, yv = split_windows(p, p.splits.val, window)
    corr = np.corrcoef(ridge_predict(beta, xv), yv)[0, 1]
    assert corr > 0.15 / 2, corr


def test_probe_window_reports_every_fit():
    """tools/probe_window.py end to end on a small market: the linear probes, and the MLP twin's curve
    when PyTorch is installed."""
    import probe_window

    from cudarl.config import from_dict

    use_mlp = probe_window_has_torch()
    cfg = from_dict({"data": {"source": "builtin:lag?n=3000"}, "net": {"window": 4, "hidden": [8]},
                     "run": {"steps": 20}, "agent": {"batch_size": 16}})  # fmt: skip
    rows = probe_window.probe(cfg, [0], ["mlp"] * use_mlp)
    assert [r["fit"] for r in rows] == ["ols", "ridge"] + ["mlp"] * use_mlp
    assert rows[0]["inputs"] == 4 * (len(prepare_data(cfg).names) + 2) and rows[0]["reference_test_sharpe"] > 0
    assert all(np.isfinite(r["val_corr"]) for r in rows[:2])
    if use_mlp:
        assert [c["update"] for c in rows[2]["curve"]] == list(range(2, 21, 2))


@pytest.mark.parametrize("kind", ["ssm", "attention"])
def test_probe_window_fits_the_temporal_encoders(kind):
    """tools/probe_window.py's ``ssm`` and ``attention`` bodies (the encoders' PyTorch twins, one linear
    output) end to end on a tiny market: a row per seed with the widths of the config and a finite curve
    at every tenth of the budget, and the body starts from cudarl's initial parameters of that seed."""
    torch = pytest.importorskip("torch", reason="the encoder probes run the PyTorch twins; torch is not installed")
    import probe_window
    import torch_encoders as te

    from cudarl.config import from_dict
    from cudarl.nn.encoders import ENCODERS, Standalone

    cfg = from_dict({"data": {"source": "builtin:lag?n=3000"}, "run": {"steps": 10}, "agent": {"batch_size": 8},
                     "net": {**ENCODER_NETS[kind], "window": 8}})  # fmt: skip
    rows = probe_window.probe(cfg, [1], [kind])
    assert [r["fit"] for r in rows] == ["ols", "ridge", kind]
    r = rows[2]
    assert {f: r[f] for f in probe_window.WIDTHS[kind]} == {f: getattr(cfg.net, f) for f in probe_window.WIDTHS[kind]}
    assert (r["seed"], r["updates"], r["batch"]) == (1, 10, 8)
    assert [c["update"] for c in r["curve"]] == list(range(1, 11))
    for c in r["curve"]:
        assert set(c) == {"update", "train_corr", "val_corr", "test_corr", "test_sign_sharpe"}
        assert all(np.isfinite(c[k]) for k in ("train_corr", "val_corr", "test_corr"))
    net, _ = probe_window.body(cfg, r["inputs"] // 8, kind, seed=1)
    enc = ENCODERS[kind]("enc", r["inputs"], cfg.net)
    want = te.cudarl_grads_like(net[1], Standalone(enc, np, np.float64, seed=1).P)
    for p, w in zip(net[1].parameters(), want, strict=True):
        np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-6)
    assert torch.is_tensor(net(torch.zeros(2, r["inputs"])))


def test_probe_window_corrupts_the_features_of_training_batches_only_and_keeps_their_scale():
    """``corrupt`` (the probe's ``--input-noise`` and ``--input-dropout``): the two position columns of every bar
    untouched; the features moved by the agent's own input noise (the twin's draws for that update and seed),
    or zeroed at the asked rate and the rest scaled by ``1 / (1 - p)`` so each input keeps its mean; nothing
    asked, the batch itself."""
    torch = pytest.importorskip("torch", reason="the probe's bodies are PyTorch; torch is not installed")
    import probe_window

    from cudarl.reference import window as wref

    bar, window, b = 5, 6, 4000
    x = torch.ones(b, window * bar)
    gen = torch.Generator().manual_seed(0)
    assert probe_window.corrupt(x, gen, 0.0, 0.0, bar) is x
    noisy = probe_window.corrupt(x, gen, 0.5, 0.0, bar, update=3, seed=9)
    want = np.ones((b, window * bar), np.float32)
    wref.noise(want, np.array([3]), window, bar - 2, wref.noise_scale(0.5), 9)
    assert np.array_equal(noisy.numpy(), want)
    dropped = probe_window.corrupt(x, gen, 0.0, 0.25, bar).reshape(b, window, bar)
    assert torch.equal(dropped[:, :, bar - 2 :], torch.ones(b, window, 2))
    f = dropped[:, :, : bar - 2]
    assert torch.unique(f).tolist() == [0.0, np.float32(1 / 0.75)]
    assert abs(float((f == 0).float().mean()) - 0.25) < 0.01 and abs(float(f.mean()) - 1.0) < 0.02
    assert torch.equal(x, torch.ones(b, window * bar))  # the batch itself is not written


def probe_window_has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def test_replay_memory_does_not_grow_with_the_window():
    """The replay stores state rows (4 floats): its bytes are the same for a window of 1 and of 64 bars,
    while the network's input grows 64 times."""
    one = Trainer(small(), run_dir=False, echo=quiet)
    wide = Trainer(small(net={"window": 64}), run_dir=False, echo=quiet)
    assert wide.env.obs_dim == 64 * one.env.obs_dim
    assert one.replay.spec.obs_dim == wide.replay.spec.obs_dim == 4
    assert one.replay.nbytes() == wide.replay.nbytes()
    per_row = one.replay.nbytes() / one.replay.capacity
    # state row 16, action, reward, discount 4 each, owner 4, leaf 8, internal nodes about 8 / 31
    assert 40 <= per_row < 41.5, per_row


def test_the_act_path_is_the_windowed_forward():
    """The Q-values the collect step acted on (the agent's q_act) equal the online network's forward of
    windows cut by hand from the feature matrix at each env's bar, bit for bit, at bars past the window."""
    t = Trainer(small(net=ENCODER_NETS["ssm"]), run_dir=False, echo=quiet)
    t.run(30)
    env, ag = t.env, t.agent
    for _ in range(3):
        rows = env.rows.copy()
        t.collect_graph.replay()
        assert np.all(rows[:, BAR] - env.t_begin >= 0)
        x = by_hand(rows, env.data.features, env.data.sign, env.window)
        q = np.zeros_like(ag.buffers.q_act)
        ag.rule.values(q, x, ag.online.new_workspace(env.n_envs))
        np.testing.assert_array_equal(ag.buffers.q_act, q)
    assert np.any(rows[:, BAR] - env.state.start >= env.window)  # some windows reach before the episode


def test_the_train_batch_is_the_sampled_rows_windows():
    """The train step's observations are the windows of the rows the replay sampled (s and s')."""
    t = Trainer(small(net=ENCODER_NETS["attention"]), run_dir=False, echo=quiet)
    t.run(10)
    ag, env = t.agent, t.env
    x = by_hand(ag.rows_pair, env.data.features, env.data.sign, env.window)
    np.testing.assert_array_equal(ag.pair, x)
    np.testing.assert_array_equal(ag.rows_pair[: ag.batch_size], t.replay.bufs.obs[ag.buffers.idx])


@pytest.mark.parametrize("name", sorted(ENCODER_NETS))
def test_each_encoder_trains_through_the_trainer(name):
    """Every encoder parameter tensor moves, losses are finite, and a second run gives the same bits."""
    cfg = small(net=ENCODER_NETS[name])
    a = Trainer(cfg, run_dir=False, echo=quiet)
    p0 = a.agent.online.params.copy()
    a.run(25)
    assert np.all(np.isfinite(a.losses)) and len(a.losses) == 25
    P0, P1 = a.agent.online.layout.views(p0), a.agent.online.P
    enc = [k for k in P1 if k.startswith("enc.")]
    assert enc and all(not np.array_equal(P0[k], P1[k]) for k in enc), [k for k in enc if np.array_equal(P0[k], P1[k])]
    b = Trainer(cfg, run_dir=False, echo=quiet)
    b.run(25)
    assert a.losses == b.losses


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["ssm", "attention"])
def test_gpu_encoder_graphed_equals_eager_and_params_move(name):
    g = Trainer(gpu_small(net=ENCODER_NETS[name]), run_dir=False, echo=quiet)
    e = Trainer(gpu_small(net=ENCODER_NETS[name]), run_dir=False, echo=quiet)
    e.collect_graph.replay = e.collect_graph.run_eager  # the same phases, launched one by one
    e.train_graph.replay = e.train_graph.run_eager
    p0 = g.agent.online.params.get()
    g.run(30)
    e.run(30)
    assert g.losses == e.losses and np.all(np.isfinite(g.losses))
    assert np.array_equal(g.agent.online.params.get(), e.agent.online.params.get())
    P0, P1 = g.agent.online.layout.views(p0), g.agent.online.layout.views(g.agent.online.params.get())
    assert all(not np.array_equal(P0[k], P1[k]) for k in P1 if k.startswith("enc."))


ONE_SAMPLE = [({"n_envs": 1}, {"batch_size": 64, "learning_starts": 200}), ({}, {"batch_size": 1})]


def _one_sample_config(make, env, agent):
    return make(net=ENCODER_NETS["ssm"], env=env, agent=agent)


@pytest.mark.parametrize("env,agent", ONE_SAMPLE)
def test_ssm_trains_and_acts_over_one_sample(env, agent):
    """One environment (the collect step's windowed forward over one sample) and a batch of one (the train step's):
    the top block's split in-projection over one row a GEMM, on NumPy (its GPU twin below)."""
    t = Trainer(_one_sample_config(small, env, agent), run_dir=False, echo=quiet)
    t.run(5)
    assert t.losses and np.all(np.isfinite(t.losses))


@pytest.mark.gpu
@pytest.mark.parametrize("env,agent", ONE_SAMPLE)
def test_gpu_ssm_trains_and_acts_over_one_sample(env, agent):
    """The same on the GPU, through the captured graphs: the top block's split in-projection over one sample has
    one-row operands, whose plan keys prepare must name as the calls do (a row's length for its pitch, blas._lt_key,
    session 25: it named the sample's pitch, and a capture met a plan it was not given)."""
    t = Trainer(_one_sample_config(gpu_small, env, agent), run_dir=False, echo=quiet)
    t.run(20)
    assert t.losses and np.all(np.isfinite(t.losses))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["ssm", "attention"])
def test_gpu_act_path_matches_the_numpy_windowed_forward(name):
    """The GPU collect step's Q-values against the NumPy network's forward of hand-cut windows, on the
    GPU run's weights (float32 rounding: relative error 1e-4)."""
    from cudarl.nn import QNetwork
    from cudarl.testing import assert_parity

    t = Trainer(gpu_small(net=ENCODER_NETS[name]), run_dir=False, echo=quiet)
    t.run(20)
    rows = t.env.rows.get()
    t.collect_graph.replay()
    t.synchronize()
    cfg, ag = t.cfg, t.agent
    net = QNetwork(t.env.obs_dim, t.env.n_actions, cfg.net, xp=np, max_batch=t.env.n_envs)
    net.params[...] = ag.online.params.get()
    x = by_hand(rows, t.env.data.features.get(), t.env.data.sign.get(), t.env.window)
    q = np.zeros((t.env.n_envs, t.env.n_actions), np.float32)
    type(ag.rule).greedy_values(net, cfg)(q, x, net.ws)  # C51: no counters
    assert_parity(ag.buffers.q_act, q, rtol=1e-4, what="acting Q")


@pytest.mark.parametrize(
    "encoder,field,value",
    [("ssm", f, v) for f, v in [("window", 5), ("d_model", 16), ("layers", 1), ("ssm_expand", 4), ("ssm_state", 8),
                                ("ssm_headdim", 2), ("ssm_groups", 1), ("ssm_conv", 3), ("ssm_chunk", 2)]]
    + [("attention", f, v) for f, v in [("window", 5), ("d_model", 12), ("layers", 1), ("attn_heads", 1),
                                        ("attn_mlp_ratio", 3)]],
)  # fmt: skip
def test_every_encoder_field_reaches_the_encoder(encoder, field, value):
    """No dead field: changing any of an encoder's fields changes the network it builds."""
    from dataclasses import replace

    from cudarl.config import NetConfig
    from cudarl.nn import QNetwork

    def built(net):
        q = QNetwork(6 * net.window, 3, net, max_batch=2)
        enc = q.encoder  # the layout, and what shapes no parameter: the window, the heads, the scan's chunk
        return [(e.name, e.shape) for e in q.layout.entries], enc.W, enc.H, getattr(enc, "Q", None)

    base = NetConfig(**{k: v for k, v in ENCODER_NETS[encoder].items()})
    assert getattr(base, field) != value
    assert built(replace(base, **{field: value})) != built(base)
