"""The auxiliary signals of issue 19 through the trainer: multi-horizon returns (``horizons``), risk
(``risk``, its head on its own SGD step) and denoising (``denoise``, its encoder pass and decoder on their
own SGD step). Each is reached from config, runs in the train graph, and its
observable moves when on and is absent when off; no auxiliary target reaches an observation; they work
on the MLP and the temporal encoders. GPU tests (graphed == eager, bit for bit) are marked."""

import json

import numpy as np
import pytest
from test_features import perturb_after
from test_trainer import gpu_small, resumed_and_uninterrupted, small
from test_windows import ENCODER_NETS

from cudarl.auxiliary.future import param_span
from cudarl.data import load
from cudarl.reference.window import STATE_DIM
from cudarl.trainer import Trainer

SIGNALS = {"horizons": ("loss", "valid"), "risk": ("loss", "valid"), "denoise": ("loss",)}


def own_params(t: Trainer, name: str) -> np.ndarray:
    """A host copy of the parameters only the signal trains: its head's weight, or denoise's decoder."""
    sig = next(s for s in t.agent.aux if s.name == name)
    return np.array(sig.dec_params if name == "denoise" else t.agent.online.P[f"aux.{name}.weight"])


def trainer(tmp_path=None, **over) -> Trainer:
    return Trainer(
        small(tmp_path, **over), run_dir=False if tmp_path is None else tmp_path / "run", echo=lambda m: None
    )


def rows_of(tmp_path) -> list:
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("head", ["c51", "iqn"])
@pytest.mark.parametrize("name", sorted(SIGNALS))
def test_each_signal_runs_in_the_train_graph_and_its_observable_moves(tmp_path, head, name):
    t = trainer(tmp_path, net={"head": head}, agent={"aux": [name]}, run={"log_every": 10})
    phases = [p for p, _ in t.train_graph.phases]
    # then the extra heads' backward on the auxiliary branch (a signal with a head, C51: Agent.extras_early;
    # IQN's mixing kernel overwrites dL/dpsi), then the priorities
    early = head == "c51" and bool(t.agent.online.extras)
    assert t.agent.extras_early is early and (name == "denoise" or t.agent.online.extras)
    after = ["extras_backward"] if early else []
    i = phases.index(f"aux_{name}")
    if name == "denoise":  # its pass reads only the batch's s: an early phase, right after sample
        assert phases[i - 1 : i + 2] == ["sample", "aux_denoise", "forward"]
    else:
        assert phases[i + 1 : i + 2 + len(after)] == [*after, "priorities"]
    w0 = own_params(t, name)
    t.run(40)
    seen = [r for r in rows_of(tmp_path) if f"aux.{name}.loss" in r]
    assert len(seen) == 4 and all(f"aux.{name}.{what}" in r for r in seen for what in SIGNALS[name])
    losses = [r[f"aux.{name}.loss"] for r in seen]
    assert np.all(np.isfinite(losses)) and len(set(losses)) == 4, losses
    assert all(0 < r[f"aux.{name}.valid"] <= 1 for r in seen if "valid" in SIGNALS[name])
    assert not np.array_equal(w0, own_params(t, name)), "its head was not trained"


def test_off_by_default_no_head_no_phase_no_observable(tmp_path):
    t = trainer(tmp_path, run={"log_every": 10})
    assert t.cfg.agent.aux == ()
    assert not any(p.startswith("aux") for p, _ in t.train_graph.phases)
    assert not any(k.startswith("aux.") for k in t.agent.online.P)
    t.run(20)
    assert not any(k.startswith("aux.") for r in rows_of(tmp_path) for k in r)


@pytest.mark.parametrize("name", sorted(SIGNALS))
def test_the_signal_moves_the_encoder(name):
    plain, aux = trainer(), trainer(agent={"aux": [name]})
    heads = set() if name == "denoise" else {f"aux.{name}.weight", f"aux.{name}.bias"}  # its decoder is its own
    assert set(aux.agent.online.P) - set(plain.agent.online.P) == heads
    plain.run(1)
    aux.run(1)
    assert not np.array_equal(plain.agent.online.P["enc.0.weight"], aux.agent.online.P["enc.0.weight"])


def test_the_risk_head_steps_by_its_own_sgd_and_adam_leaves_it_alone():
    """The risk head moves by its span of aux_sgd only: Adam's moments on its span stay zero, a rate of 0
    freezes it, and its gradient is spent (zero) when Adam runs; the horizons head, on Adam, has moments."""
    t = trainer(agent={"aux": ["risk", "horizons"]})
    phases = [p for p, _ in t.train_graph.phases]
    assert phases.index("backward") < phases.index("aux_sgd") < phases.index("adam")
    w0 = t.agent.online.P["aux.risk.weight"].copy()
    t.run(30)
    lo, hi = param_span(t.agent.online, "aux.risk.")
    assert not t.agent.adam.m[lo:hi].any() and not t.agent.adam.v[lo:hi].any()
    assert not t.agent.online.grads[lo:hi].any()
    assert not np.array_equal(w0, t.agent.online.P["aux.risk.weight"])
    hlo, hhi = param_span(t.agent.online, "aux.horizons.")
    assert t.agent.adam.m[hlo:hhi].any()
    frozen = trainer(agent={"aux": ["risk"], "aux_risk_lr": 0.0})
    w0 = frozen.agent.online.P["aux.risk.weight"].copy()
    frozen.run(10)
    np.testing.assert_array_equal(w0, frozen.agent.online.P["aux.risk.weight"])


@pytest.mark.parametrize("kind", ["ssm", "attention"])
def test_the_signals_run_on_the_temporal_encoders(tmp_path, kind):
    t = trainer(tmp_path, net=ENCODER_NETS[kind], agent={"aux": list(SIGNALS)}, run={"log_every": 10})
    enc0 = t.agent.online.params.copy()
    t.run(20)
    row = [r for r in rows_of(tmp_path) if "aux.risk.loss" in r][-1]
    assert all(np.isfinite(row[f"aux.{name}.loss"]) for name in SIGNALS)
    assert not np.array_equal(enc0, t.agent.online.params)


def test_denoise_steps_the_encoder_by_its_own_sgd_and_nothing_else():
    """With a rate of 0 its pass changes nothing a run without it has (the same bits: its draws, buffers
    and gradients are its own); with a rate it moves the encoder, and its decoder and counter are in the
    checkpoint."""
    plain, zero = trainer(), trainer(agent={"aux": ["denoise"], "aux_denoise_lr": 0.0})
    plain.run(25)
    zero.run(25)
    np.testing.assert_array_equal(plain.agent.online.params, zero.agent.online.params)
    assert plain.losses == zero.losses
    on = trainer(agent={"aux": ["denoise"], "aux_denoise_lr": 0.05})
    on.run(25)
    assert not np.array_equal(plain.agent.online.P["enc.0.weight"], on.agent.online.P["enc.0.weight"])
    state = on.agent.state_dict()["aux.denoise"]
    assert state["counter"][0] == on.step and state["decoder"].shape == on.agent.aux[0].dec_params.shape
    other = trainer(agent={"aux": ["denoise"], "aux_denoise_lr": 0.05})
    other.agent.load_state_dict(on.agent.state_dict())
    np.testing.assert_array_equal(other.agent.aux[0].dec_params, on.agent.aux[0].dec_params)
    assert other.agent.aux[0].counter[0] == on.step


def test_all_signals_resume_exactly_and_a_policy_file_acts_as_the_trainer(tmp_path):
    """A run with every signal stopped, saved and resumed continues bit for bit (denoise's decoder and draw
    counter are in the checkpoint); its policy file (the heads' weights, no decoder) acts as the trainer."""
    from cudarl.policy import load_policy

    cfg = small(agent={"aux": list(SIGNALS), "aux_denoise_lr": 0.01}, run={"checkpoint_every": 50})
    resumed, full = resumed_and_uninterrupted(cfg, tmp_path)
    np.testing.assert_array_equal(resumed.agent.online.params, full.agent.online.params)
    np.testing.assert_array_equal(resumed.agent.aux[2].dec_params, full.agent.aux[2].dec_params)
    p = load_policy(tmp_path / "full" / "checkpoints" / "step-00000100.safetensors", device="cpu")
    np.testing.assert_array_equal(p.evaluate(split="val").position, full.greedy_positions(full.data.splits.val))


def test_a_population_member_with_every_signal_is_that_agent_trained_alone():
    """The signals' branches and own steps inside a population's graphs (each member's on its branch)
    leave each member bitwise equal to the agent trained alone."""
    from test_population import assert_same_agent, population_and_alone, variants

    configs = variants(small(agent={"aux": list(SIGNALS), "aux_denoise_lr": 0.01}))[:2]
    pop, _, alone = population_and_alone(configs)
    for m, a in zip(pop.members, alone, strict=True):
        assert [s.name for s in m.agent.aux] == list(SIGNALS) and m.step > 0 and m.agent.aux[2].counter[0] == m.step
        assert_same_agent(m, a)
        np.testing.assert_array_equal(m.agent.aux[2].dec_params, a.agent.aux[2].dec_params)


def test_denoise_refuses_spectral_norm():
    with pytest.raises(ValueError, match="net.spectral"):
        trainer(agent={"aux": ["denoise"]}, net={"spectral": ["enc.1"]})


def _targets(t: Trainer, rows: np.ndarray) -> dict:
    """Each signal's gradient rows for ``rows`` with its head's outputs at zero (= -2 w / n times the targets)."""
    buf, B = t.agent.buffers, t.cfg.agent.batch_size
    buf.rows[...] = rows
    out = {}
    for sig in t.agent.aux[:2]:  # horizons, risk (denoise's target is the window itself)
        buf.ws.rows(f"{sig.head_name}.out", B)[...] = 0
        sig.phases()[0][1]()
        out[sig.name] = buf.ws.rows(f"{sig.head_name}.dout", B).copy()
    return out


def test_no_auxiliary_target_reaches_an_observation(rng):
    """Two markets equal up to bar c: every observation at a bar <= c is the same bit for bit, while the
    auxiliary targets of decisions whose horizon reaches past c differ (and those that do not, agree)."""
    cfg = dict(agent={"aux": ["horizons", "risk"], "batch_size": 32}, net={"window": 8})
    bars = load("builtin:regime?n=1500")
    a = Trainer(small(**cfg), bars=bars, run_dir=False, echo=lambda m: None)
    tr = a.data.splits.train
    c = (tr.start + tr.stop) // 2
    b = Trainer(
        small(**cfg), bars=perturb_after(bars, c, rng), normaliser=a.data.normaliser, run_dir=False, echo=lambda m: None
    )
    rows = np.zeros((32, STATE_DIM), np.float32)
    rows[:, 0] = np.linspace(c - 100, c, 32).round()
    rows[::2, 1] = 1.0  # mirror rows too
    np.testing.assert_array_equal(a.env.windows.of(rows), b.env.windows.of(rows))
    # the targets' unit is a statistic of the whole training split, as the features' normaliser is (shared
    # above): share it too, so what differs is only what the decision's own future bars put in
    b.agent.buffers.future.inv_sigma = a.agent.buffers.future.inv_sigma
    b.agent.aux[0].hscale[...] = a.agent.aux[0].hscale
    ta, tb = _targets(a, rows), _targets(b, rows)
    far = rows[:, 0] + 64 + 1 >= c  # the longest horizon reads a price after c
    for name in ("horizons", "risk"):
        assert np.any(ta[name][far] != tb[name][far]), f"{name}: the perturbed future did not reach the target"
    near = rows[:, 0] + 16 + 1 < c  # every horizon and the risk window stay at or before c
    np.testing.assert_array_equal(ta["risk"][near], tb["risk"][near])
    np.testing.assert_array_equal(ta["horizons"][near, :3], tb["horizons"][near, :3])


def test_config_validates_the_horizons():
    from cudarl.config import ConfigError, from_dict

    for bad in ([4, 1], [1, 1], [], [0]):
        with pytest.raises(ConfigError, match="aux_horizons"):
            from_dict({"agent": {"aux_horizons": bad}})
    with pytest.raises(ConfigError, match="aux_risk_weight"):
        from_dict({"agent": {"aux_risk_weight": 0.0}})


# --- GPU ---------------------------------------------------------------------------------------------
def graphed_and_eager(over: dict, steps: int = 40) -> tuple[Trainer, Trainer]:
    """Two GPU trainers of ``gpu_small(**over)``, one replaying its captured graphs, one running the same
    phases eagerly, after ``steps`` updates; asserts their losses, weights and observables are equal."""
    g = Trainer(gpu_small(**over), run_dir=False, echo=lambda m: None)
    e = Trainer(gpu_small(**over), run_dir=False, echo=lambda m: None)
    e.collect_graph.replay = e.collect_graph.run_eager
    e.train_graph.replay = e.train_graph.run_eager
    g.run(steps)
    e.run(steps)
    assert g.losses == e.losses
    for x, y in ((g.agent.online.params, e.agent.online.params), (g.agent.target.params, e.agent.target.params)):
        assert np.array_equal(x.get(), y.get())
    assert g.agent.observables() == e.agent.observables()
    return g, e


@pytest.mark.gpu
@pytest.mark.parametrize("encoder", ["mlp", "ssm"])
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_gpu_aux_heads_graphed_equal_eager(head, encoder):
    """horizons, risk and denoise (their loss branches, their own SGD steps), graphed and eager, bit for bit."""
    net = {"head": head, **({} if encoder == "mlp" else ENCODER_NETS["ssm"])}
    g, e = graphed_and_eager({"net": net, "agent": {"aux": list(SIGNALS), "aux_denoise_lr": 0.01}})
    assert all(np.isfinite(g.agent.observables()[f"aux.{name}.loss"]) for name in SIGNALS)
    assert np.array_equal(g.agent.aux[2].dec_params.get(), e.agent.aux[2].dec_params.get())
