"""Joined members with their own settings (issue 23: "agents may differ in everything that does not change
shapes"; docs/perf-notes.md, "The agent axis, in stages", per-member settings): a ``run.population =
"joined"`` population whose members differ in the fields of :data:`cudarl.stacked_agent.MEMBER_SETTINGS`
(each a ``[P]`` device array the stacked kernels read at the member) is, member by member, the Trainer of
that member's config trained alone, bit for bit; the fields not built per member are refused, named, those of
issue 23's list with why (:data:`cudarl.stacked_agent.NOT_MEMBER_SETTINGS`; the n-step: the shared loop).

CPU (NumPy backend) always; GPU twins marked (graphs captured; ``tools/gpu_pop_axis.sh`` part c).
"""

from dataclasses import replace

import numpy as np
import pytest
from test_population import QUIET, assert_joined_member_is_alone, joined
from test_trainer import gpu_small, small

from cudarl.config import from_dict
from cudarl.population import JOINED_MAY_DIFFER, Population
from cudarl.stacked_agent import MEMBER_SETTINGS, NOT_MEMBER_SETTINGS
from cudarl.trainer import Trainer

STEPS = 40

#: Per group of settings, three members' values, each member's its own (so a member that ran another's
#: value, or the single value of another, differs from its Trainer alone within the run).
SETTINGS = {
    "lr": [
        {"optim": {"schedule": "cosine", "lr": 3e-4, "lr_min": 1e-5, "warmup": 5, "period": 30}},
        {"optim": {"schedule": "cosine_restarts", "lr": 1e-4, "lr_min": 2e-5, "warmup": 3, "period": 8,
                   "mult": 2, "restart_m_scale": 0.5}},
        {"optim": {"schedule": "constant", "lr": 5e-5, "warmup": 10}},
    ],
    "adam": [
        {"optim": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "max_grad_norm": 0.2}},
        {"optim": {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.01, "max_grad_norm": 0.5}},
        {"optim": {"beta1": 0.95, "beta2": 0.995, "eps": 1e-7, "weight_decay": 0.05, "max_grad_norm": 0.05}},
    ],
    "gamma": [{"agent": {"gamma": 0.99}}, {"agent": {"gamma": 0.95}}, {"agent": {"gamma": 0.9}}],
    "tau": [
        {"agent": {"tau_start": 0.05, "tau_end": 0.005, "tau_period": 10}},
        {"agent": {"tau_start": 0.2, "tau_end": 0.01, "tau_period": 25}},
        {"agent": {"tau_start": 0.02, "tau_end": 0.02, "tau_period": 1}},
    ],
    "epsilon": [
        {"agent": {"eps_start": 1.0, "eps_end": 0.02, "eps_steps": 300}},
        {"agent": {"eps_start": 0.5, "eps_end": 0.1, "eps_steps": 100}},
        {"agent": {"eps_start": 0.3, "eps_end": 0.05, "eps_steps": 1000}},
    ],
    "per": [
        {"replay": {"alpha": 0.6, "eps": 1e-6, "beta0": 0.4, "beta_final": 1.0, "beta_steps": 100}},
        {"replay": {"alpha": 0.4, "eps": 1e-3, "beta0": 0.6, "beta_final": 0.9, "beta_steps": 30}},
        {"replay": {"alpha": 0.8, "eps": 1e-2, "beta0": 0.2, "beta_final": 0.7, "beta_steps": 500}},
    ],
    "costs": [
        {"env": {"cost_bps": 1.0, "slippage_bps": 0.0}, "agent": {"train_cost_bps": 0.0}},
        {"env": {"cost_bps": 3.0, "slippage_bps": 0.5}, "agent": {"train_cost_bps": 2.0}},
        {"env": {"cost_bps": 0.0, "slippage_bps": 2.0}, "agent": {"train_cost_bps": 5.0}},
    ],
    "popart": [
        {"agent": {"popart_beta": 3e-4, "popart_warmup": 10}},
        {"agent": {"popart_beta": 1e-2, "popart_warmup": 25}},
        {"agent": {"popart_beta": 3e-3, "popart_warmup": 0}},
    ],
    "shrink": [
        {"optim": {"shrink_every": 0}},
        {"optim": {"shrink_every": 15, "shrink": 0.8, "perturb": 0.01}},
        {"optim": {"shrink_every": 10, "shrink": 0.9, "perturb": 0.02}},
    ],
    "reward": [
        {"env": {"hold_cap": 64, "fill": "open"}},
        {"env": {"hold_cap": 16, "fill": "close", "levels": [-0.5, 0.0, 0.5]}},
        {"env": {"hold_cap": 8, "fill": "open", "levels": [-1.0, 0.25, 1.0]}},
    ],
}  # fmt: skip

#: Fields members of a joined population may not yet set differently, with a value other than the default.
REFUSED = [
    ("agent", "kappa", 2.0),
    ("agent", "cql_alpha", 0.5),
    ("agent", "plan_hurdle", 0.3),
    ("replay", "n_step", 1),
    ("agent", "priority", "ce"),
    ("agent", "updates_per_collect", 2),
]


def _merge(*overs) -> dict:
    out: dict = {}
    for o in overs:
        for sec, vals in o.items():
            out.setdefault(sec, {}).update(vals)
    return out


def settings_variants(base, groups=tuple(SETTINGS)):
    """Three joined members with their own seeds and the settings of ``groups`` (:data:`SETTINGS`)."""
    seeds = [{}, {"run": {"seed": 7}, "env": {"seed": 3}}, {"run": {"seed": 11}, "env": {"seed": 12}}]
    return joined([from_dict(_merge(seeds[i], *(SETTINGS[g][i] for g in groups)), base=base) for i in range(3)])


def _alone(c, steps):
    t = Trainer(replace(c, run=replace(c.run, population="branches")), run_dir=False, **QUIET)
    t.run(steps)
    return t


def test_settings_are_the_learners_member_settings():
    """Every group the tests vary is a field of MEMBER_SETTINGS, and JOINED_MAY_DIFFER takes them all."""
    varied = {(sec, f) for g in SETTINGS.values() for o in g for sec, vals in o.items() for f in vals}
    assert varied <= {(sec, f) for sec, fs in MEMBER_SETTINGS.items() for f in fs}
    assert all(set(fs) <= JOINED_MAY_DIFFER[sec] for sec, fs in MEMBER_SETTINGS.items())


@pytest.mark.parametrize("groups", [tuple(SETTINGS), *((g,) for g in SETTINGS)], ids=["all", *SETTINGS])
def test_joined_members_with_their_own_settings_are_those_agents_alone(groups):
    """Three joined members differing in seeds and in ``groups``: member i is its config's Trainer alone
    (losses, weights, moments, sum tree, evaluation), bit for bit, and the members' own scalars hold their
    own values."""
    configs = settings_variants(small(), groups)
    pop = Population(configs, run_dirs=[False] * 3, **QUIET)
    pop.run(STEPS)
    for i, c in enumerate(configs):
        assert_joined_member_is_alone(pop, i, _alone(c, STEPS))
    L = pop.learner
    if "gamma" in groups:
        np.testing.assert_array_equal(L.scalars.get("gamma"), np.float32([0.99, 0.95, 0.9]))
    if "lr" in groups:
        assert len(set(L.adam.scalars.get("lr").tolist())) == 3
    if "epsilon" in groups:
        assert len(set(L.scalars.get("epsilon").tolist())) == 3
    if "per" in groups:
        assert len(set(pop.replay.bufs.beta.tolist())) == 3
        assert [pop.replay.member_spec(i).alpha for i in range(3)] == [0.6, 0.4, 0.8]
    if "costs" in groups:
        assert len(set(pop.env.rates.tolist())) == 3
    if "popart" in groups:
        assert L.popart.frozen_members() == [True, True, False]  # member 2's warm-up 0: never frozen
        assert len(set(L.popart.scalars.get("beta").tolist())) == 2
    if "reward" in groups:
        assert pop.env.hold_caps.tolist() == [64, 16, 8] and pop.env.member_data.ret.shape[0] == 3
    if "tau" in groups:
        assert len(set(L.soft.scalars.get("tau").tolist())) == 3


@pytest.mark.parametrize("sec, field, value", REFUSED, ids=[f"{s}.{f}" for s, f, _ in REFUSED])
def test_joined_refuses_members_that_differ_in_a_setting_not_built_per_member(sec, field, value):
    """Refused naming the field, and, for a field of issue 23's list (NOT_MEMBER_SETTINGS), why."""
    a, b = joined([small(), from_dict({sec: {field: value}}, base=small())])
    with pytest.raises(ValueError, match=rf"{sec}\.{field}.*JOINED_MAY_DIFFER") as exc:
        Population([a, b], run_dirs=[False, False], **QUIET)
    why = NOT_MEMBER_SETTINGS.get(f"{sec}.{field}")
    assert why is None or f"; {sec}.{field}: {why})" in str(exc.value)


def test_not_member_settings_are_refused_fields_of_the_joined_step():
    """Every field NOT_MEMBER_SETTINGS explains is one a joined population refuses (none is a member setting),
    and the n-step is the only one the branches mode refuses too (the others it takes per member)."""
    from cudarl.population import MAY_DIFFER

    for name in NOT_MEMBER_SETTINGS:
        sec, field = name.split(".")
        assert field not in MEMBER_SETTINGS.get(sec, ()) and field not in JOINED_MAY_DIFFER.get(sec, ())
    assert [n for n in NOT_MEMBER_SETTINGS if n.split(".")[1] not in MAY_DIFFER[n.split(".")[0]]] == ["replay.n_step"]


def test_the_n_step_sets_the_collections_before_the_first_update():
    """NOT_MEMBER_SETTINGS' reason for the n-step: a Trainer alone collects n_step + ceil(max(learning_starts,
    batch_size) / rows a collection) times before its first update, so runs that differ in it start learning
    on different collections, which members sharing one loop cannot (the branches mode refuses it, with why)."""
    counts = {}
    for n in (1, 3, 5):
        t = Trainer(from_dict({"replay": {"n_step": n}}, base=small()), run_dir=False, **QUIET)
        t.prime()
        a = t.cfg.agent
        counts[n] = t.collect_steps
        assert t.collect_steps == n + -(-max(a.learning_starts, a.batch_size) // t.rows_per_collect)
    assert counts[3] - counts[1] == 2 and counts[5] - counts[3] == 2
    with pytest.raises(ValueError, match=r"replay\.n_step.*MAY_DIFFER.*replay\.n_step: the n-step sets when"):
        Population([small(), from_dict({"replay": {"n_step": 1}}, base=small())], run_dirs=[False] * 2, **QUIET)


def test_stacked_learner_refuses_configs_that_differ_outside_its_member_settings():
    from cudarl.stacked_agent import StackedLearner

    a, b = small(), from_dict({"agent": {"batch_size": 16}, "optim": {"lr": 3e-4}}, base=small())
    with pytest.raises(ValueError, match=r"members differ in agent\.batch_size; only the fields of MEMBER_SETTINGS"):
        StackedLearner(a, 6, 3, [0, 1], np, configs=[a, b])
    c = from_dict({"replay": {"n_step": 2}, "agent": {"kappa": 2.0}}, base=small())
    with pytest.raises(
        ValueError, match=r"agent\.kappa, replay\.n_step; .*MEMBER_SETTINGS.*agent\.kappa: .*replay\.n_step: "
    ):
        StackedLearner(a, 6, 3, [0, 1], np, configs=[a, c])


def _checkpoints_are_trainers(base, tmp_path, steps):
    """Joined members with their own settings and run directories: each member's latest.npz is the state tree
    its Trainer alone writes at that update, bit for bit."""
    from test_population_resume import assert_same_checkpoint, latest, member_dirs

    configs = settings_variants(base)
    dirs = member_dirs(tmp_path / "pop", 3)
    Population(configs, run_dirs=dirs, **QUIET).run(steps)
    for i, c in enumerate(configs):
        alone = Trainer(replace(c, run=replace(c.run, population="branches")), run_dir=tmp_path / f"alone{i}", **QUIET)
        alone.run(steps)
        assert_same_checkpoint(latest(dirs[i]), latest(tmp_path / f"alone{i}"), f"member {i}")


def test_joined_members_with_their_own_settings_checkpoint_as_their_trainers(tmp_path):
    _checkpoints_are_trainers(small(), tmp_path, STEPS)


def test_joined_members_with_their_own_settings_resume_exactly(tmp_path):
    """SIGTERM at update 20, Population.resume from the members' checkpoints (each member's config, its own
    settings, rebuilt from its checkpoint), on to 40: the uninterrupted population, bit for bit."""
    from test_population_resume import resumes_exactly

    resumes_exactly(settings_variants(small()), tmp_path, STEPS)


# --- GPU --------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("groups", [tuple(SETTINGS)], ids=["all"])
def test_gpu_joined_members_with_their_own_settings_are_those_agents_alone(groups):
    """The joined population on the GPU (graphs captured, the learner's one-launch optimiser) whose members
    differ in seeds and every per-member setting: member i against its Trainer alone, bitwise."""
    configs = settings_variants(gpu_small(), groups)
    pop = Population(configs, run_dirs=[False] * 3, **QUIET)
    pop.run(60)
    for i, c in enumerate(configs):
        assert_joined_member_is_alone(pop, i, _alone(c, 60))


@pytest.mark.gpu
def test_gpu_joined_members_with_their_own_settings_checkpoint_as_their_trainers(tmp_path):
    _checkpoints_are_trainers(gpu_small(), tmp_path, 60)


@pytest.mark.gpu
def test_gpu_joined_members_with_their_own_settings_resume_exactly(tmp_path):
    from test_population_resume import resumes_exactly

    resumes_exactly(settings_variants(gpu_small()), tmp_path, 60)
