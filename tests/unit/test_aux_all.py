"""All seven auxiliary signals of issue 19 on together, through the trainer: the heads (``horizons``,
``risk``, ``denoise``) and the regularisers (``homeostatic``, ``causal``, ``vaccine``, ``selectivity``) in
one train graph, in the order docs/architecture.md gives (loss phases - backward - grad phases - own
optimiser steps - Adam); each signal's observable is in ``metrics.jsonl`` and moves; a run stopped, saved
and resumed continues bit for bit. CPU (NumPy backend); the GPU twin is the graphed == eager test of
tests/unit/test_aux_reg.py with every signal."""

import json

import numpy as np
import pytest
from test_trainer import small
from test_windows import ENCODER_NETS

from cudarl.trainer import Trainer

ALL = ["horizons", "risk", "denoise", "homeostatic", "causal", "selectivity", "vaccine"]
#: one observable per signal that must be in metrics.jsonl and move
KEYS = {
    "horizons": "aux.horizons.loss",
    "risk": "aux.risk.loss",
    "denoise": "aux.denoise.loss",
    "homeostatic": "aux.homeostatic.utilisation",
    "causal": "aux.causal.loss",
    "selectivity": "aux.selectivity.mean",
    "vaccine": "aux.vaccine.cos",
}


def _cfg(tmp_path, encoder):
    return small(
        tmp_path,
        net=dict(ENCODER_NETS[encoder]),
        agent={"aux": ALL, "aux_denoise_lr": 0.01, "vaccine_beta": 0.2},
        run={"log_every": 5, "checkpoint_every": 10},
    )


def test_the_phases_of_all_seven_sit_in_the_documented_order():
    t = Trainer(_cfg(None, "mlp"), run_dir=False, echo=lambda m: None)
    names = [n for n, _ in t.train_graph.phases]
    after = names[names.index("backward") :]
    # the heads' own SGD steps forked beside vaccine's grad phase (it touches only a span of the flat gradient
    # no SGD span lies in: grad_span), then Adam, which joins them; causal's grad phase is not run: vaccine's
    # kernels add its gradient (takes_addend)
    assert after[: after.index("adam") + 1] == ["backward", "aux_sgd", "vaccine", "adam"]
    causal, vac = t.agent.aux[ALL.index("causal")], t.agent.aux[-1]
    assert vac.addend is not None and vac.addend.grads is causal.extra.grads and vac.addend.side is causal.side
    assert vac.grad_span() == (0, vac.addend.stop) and vac.addend.stop > vac.hi
    assert [s.grad_span() for s in t.agent.aux[:-1]] == [None] * 6
    loss = names[: names.index("backward")]
    assert all(p in loss for p in ("aux_horizons", "aux_risk", "aux_homeostatic", "aux_causal"))
    # the passes that read only the batch's s and the parameters fork right after sample, before the forward
    assert names[names.index("sample") + 1 : names.index("forward")] == ["aux_denoise", "aux_causal_do"]
    assert t.agent.aux[-1].aux_heads == ["horizons", "risk"]  # vaccine aligns the two heads


def test_the_own_sgd_steps_of_all_seven_are_one_launch_over_three_spans(monkeypatch):
    """Issue 19's MLP chain: ``aux_sgd``, the one phase between the grad phases and Adam that steps the
    signals' own parameters, is one call of ``auxsgd.steps`` (the family's only kernel; NumPy twins here,
    the phase code the GPU runs) over risk's head, the encoder (from denoise's own gradient) and denoise's
    decoder, in that order, at their rates; each span moves by ``-lr g`` and its gradient is cleared."""
    from cudarl import kernels, signatures
    from cudarl.reference import auxsgd as ref

    assert set(signatures.parse_source(kernels.SRC_DIR / "auxsgd.cu", "auxsgd")) == {"steps"}
    calls, real = [], ref.steps

    def spy(spans):
        before = [(p.copy(), g.copy()) for p, g, _, _ in spans]
        real(spans)
        calls.append((spans, before, [(p.copy(), g.copy()) for p, g, _, _ in spans]))  # Adam moves the encoder

    monkeypatch.setattr(ref, "steps", spy)
    t = Trainer(_cfg(None, "mlp"), run_dir=False, echo=lambda m: None)
    risk, den = t.agent.aux[ALL.index("risk")], t.agent.aux[ALL.index("denoise")]
    inner, per_phase = dict(t.train_graph.phases)["aux_sgd"], []

    def phase():
        n = len(calls)
        inner()
        per_phase.append(len(calls) - n)

    t.train_graph.phases = [(n, phase if n == "aux_sgd" else f) for n, f in t.train_graph.phases]
    t.run(t.cfg.agent.learning_starts // t.cfg.env.n_envs + 3)
    assert len(per_phase) >= 2 and set(per_phase) == {1}
    want = [(risk.params, risk.grads), (den.enc_params, den.enc_grads), (den.dec_params, den.dec_grads)]
    for spans, before, after in calls:
        assert len(spans) == 3 and all(p is wp and g is wg for (p, g, _, _), (wp, wg) in zip(spans, want, strict=True))
        assert [lr for _, _, lr, _ in spans] == [risk.lr / risk.weight, den.lr, den.lr]
        for (_, _, lr, clear), (p0, g0), (p1, g1) in zip(spans, before, after, strict=True):
            assert clear and g0.any() and not g1.any()
            np.testing.assert_array_equal(p1, p0 - np.float32(lr) * g0)


@pytest.mark.parametrize("encoder", ["mlp", "ssm"])
def test_all_seven_signals_train_show_their_observables_and_resume_bitwise(tmp_path, encoder):
    cfg = _cfg(tmp_path, encoder)
    full = Trainer(cfg, run_dir=tmp_path / "full", echo=lambda m: None)
    full.run(20)
    rows = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    for name, key in KEYS.items():
        seen = [r[key] for r in rows if key in r]
        assert len(seen) == 4 and np.all(np.isfinite(seen)) and len(set(seen)) > 1, (name, seen)
    half = Trainer(cfg, run_dir=tmp_path / "half", echo=lambda m: None)
    half.run(10)
    resumed = Trainer.resume(half.save(), run_dir=tmp_path / "resumed", echo=lambda m: None)
    assert resumed.step == 10
    resumed.run(20)
    assert resumed.losses == full.losses[10:20]
    np.testing.assert_array_equal(resumed.agent.online.params, full.agent.online.params)
    np.testing.assert_array_equal(resumed.agent.target.params, full.agent.target.params)
    for a, b in zip(resumed.agent.aux, full.agent.aux, strict=True):
        for k, v in b.state_dict().items():
            np.testing.assert_array_equal(a.state_dict()[k], v, err_msg=f"{b.name}.{k}")
    assert resumed.agent.observables() == full.agent.observables()


def test_a_population_member_with_all_seven_is_that_agent_trained_alone():
    """Every signal's branches, grad phases and own steps inside a population's graph (two members)
    leave each member bitwise equal to the agent trained alone, the signals' states included."""
    from test_population import assert_same_agent, population_and_alone, variants

    configs = variants(small(agent={"aux": ALL, "aux_denoise_lr": 0.01}))[:2]
    pop, _, alone = population_and_alone(configs)
    for m, a in zip(pop.members, alone, strict=True):
        assert [s.name for s in m.agent.aux] == ALL and m.step > 0
        assert_same_agent(m, a)
        for sm, sa in zip(m.agent.aux, a.agent.aux, strict=True):
            for k, v in sa.state_dict().items():
                np.testing.assert_array_equal(sm.state_dict()[k], v, err_msg=f"{sa.name}.{k}")
        assert m.agent.observables() == a.agent.observables()


# --- GPU ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("encoder", ["mlp", "ssm", "attention"])
@pytest.mark.parametrize("head", ["c51", "iqn"])
def test_gpu_all_seven_graphed_equal_eager(head, encoder):
    """All seven signals (IQN: six, homeostatic is C51's) in one captured train graph, replayed, against
    the same phases run eagerly: losses, weights, every signal's state and observables, bit for bit."""
    from test_aux_heads import graphed_and_eager

    from cudarl.backend import to_numpy

    aux = [s for s in ALL if head == "c51" or s != "homeostatic"]
    g, e = graphed_and_eager(
        {"net": {"head": head, **ENCODER_NETS[encoder]}, "agent": {"aux": aux, "aux_denoise_lr": 0.01}}
    )
    for sg, se in zip(g.agent.aux, e.agent.aux, strict=True):
        for k, v in se.state_dict().items():
            assert np.array_equal(to_numpy(sg.state_dict()[k]), to_numpy(v)), f"{se.name}.{k}"
    obs = g.agent.observables()
    assert all(KEYS[s] in obs and np.isfinite(obs[KEYS[s]]) for s in aux)
