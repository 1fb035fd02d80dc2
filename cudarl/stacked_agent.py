"""``StackedLearner``: the train step of P agents, one launch per operation for all P members.

Issue 23's agent axis, stage 6a (docs/perf-notes.md, "The agent axis, in stages"): the phases of
:meth:`cudarl.agent.Agent.train_phases` for the reference configuration (MLP encoder, dueling C51,
``net.gemm`` ``"cublaslt_nosplit"`` or ``"chain"``, PopArt on or off, no auxiliary signals), composed from the stacked
pieces of stages 0-5 instead of one agent's::

    schedules     StackedAdam.schedule_step, StackedSoftUpdate.schedule_step    (a branch, as alone)
    sample        StackedPrioritizedReplay.sample: search, gather and windows; the weights on a branch
    forward       StackedQNetwork: target at s' | online at s' (branches) | online at s (chain)
    targets_loss  losses.c51_targets_loss over [P, ...] (PopArt: StackedPopArt's [P, 8] state; its one
                  launch with a grid barrier, or two launches: below)
    q_stats       dueling combine, qstats per_sample; the reduction on a branch
    priorities    StackedPrioritizedReplay.update_priorities (a branch to the end)
    backward      StackedQNetwork.backward (dW by net.dw_gemm: see below)
    adam          StackedAdam.clip_update_publish (norm, clip, update, soft update, the publish of
                  loss and norm to a [P, 2 slots] ring): one launch with a grid barrier, or two
                  without (the norm, its last block publishing; the update): below
    publish       the Q statistics of every member to their pinned ring (one publish_row launch)

The forms of the PopArt loss and the optimiser (:meth:`StackedLearner.one_launch_forms`): each has one
launch whose blocks wait for one another (``cudarl::grid_barrier``) and a form in two launches without
it, the same bits. The barrier needs every block of the launch resident at once, so the launch has at
most :func:`cudarl.kernels.resident_grid_limit` blocks (one per multiprocessor) for all P members. The
launchers pick the form (``c51.targets_loss_popart_one_launch``, ``optim.clip_adam_soft_one_launch``):
with ``run.grid_barrier`` on each operation takes its one launch only where every member still gets the
blocks the single agent gets alone (:func:`cudarl.kernels.barrier_grid_fits`): P = 1 always (a population
of one launches what the single agent does); in the reference configuration on an H200 (132 blocks; the
single agent's loss takes 128 of them, its optimiser all 132) no P above 1, since a member given fewer
blocks works through its batch or its parameters on them one after another. ``run.grid_barrier = false``:
the launches without the barrier at every P.

Member ``i`` is bitwise the :class:`cudarl.agent.Agent` of ``run.seed = seeds[i]`` fed the same replay
(``tests/unit/test_stacked_agent.py``): each operation is P copies of the single one (DESIGN.md: "a
population is an extra leading axis on every buffer of an agent"), and every per-member scalar (the
optimiser's step, lr, bias corrections, grad norm and clip scale; tau; PopArt's statistics and beta;
the replay's counters, beta and Philox key; the loss) is a ``[P]`` device array.

The weight gradients follow ``net.dw_gemm``, as the single agent's do (``StackedQNetwork.backward``):
``"one_kernel"``, one batched GEMM a layer for every member; ``"split_k"`` (the default), still per
member (a loop of the single agent's split-K cuBLAS GEMM, which a batched GEMM does not reproduce).
Either way each layer's dW runs on that layer's branch, as the single agent's one GEMM. Still per
member: shrink-and-perturb between updates (``optim.shrink_every``). The statistics' publish
is one launch over the ``[P, n]`` statistics with member 0's step counter naming the ring slot: the
members' counters advance together (one ``lr_schedule_members`` launch for all), so it is every member's slot.
Members may differ in the settings of :data:`MEMBER_SETTINGS` (``configs``): each a ``[P]`` device array
read by a ``_members`` kernel (the single kernel's body with member ``i``'s value) or host work done member
by member (docs/perf-notes.md, "The agent axis, in stages", 6c).
The collect step (stage 6b), :meth:`StackedLearner.collect_phases`, is the single agent's
(:meth:`cudarl.agent.Agent.collect_phases` with the C51 rule) over the members::

    act            StackedQNetwork forward over the envs' windows [P, N, width] (raw head), then
                   act_c51_dueling_members over every member (its own epsilon schedule, counters and env seed)
    env_step       StackedTradingEnv.record_step (record, discounts with gamma [P], step, windows)
    replay_insert  StackedPrioritizedReplay.add of every member's rows

:class:`cudarl.population.Population` runs both with ``run.population = "joined"``; each member's guard
reads its loss and grad norm from the ``[P, 2 slots]`` ring (one event for every member's ring: the read of
update t - 1 waits for update t) and rolls that member back through :meth:`StackedLearner.member_state_dict`
and :meth:`StackedLearner.load_member_state_dict`. Checkpoints:
:meth:`StackedLearner.state_dict` (every member) and :meth:`StackedLearner.member_state_dict` (one
member, the :meth:`cudarl.agent.Agent.state_dict` of the agent it equals) and their loads.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from . import losses
from .agent import PUBLISH_SLOTS
from .backend import family
from .config import Config
from .graph import SideStream
from .nn.params import stacked_zeros
from .nn.stacked import StackedQNetwork, _reference_network
from .optim import StackedAdam, StackedSoftUpdate, shrink_perturb
from .pinned import MemberScalars, PinnedReadback, member_index
from .popart import StackedPopArt, targets_loss_kwargs
from .reference.window import STATE_DIM
from .replay import Batch
from .rules.c51 import C51Rule, support


def reference_config(cfg: Config) -> None:
    """Refuse a configuration whose train step :class:`StackedLearner` does not build: the reference
    network's (:class:`cudarl.nn.StackedQNetwork`'s refusals) without auxiliary signals, CQL or input noise."""
    _reference_network(cfg.net)
    a = cfg.agent
    flags = {"agent.aux": bool(a.aux), "agent.cql_alpha": a.cql_alpha > 0, "agent.input_noise": a.input_noise > 0}
    bad = sorted(k for k, v in flags.items() if v)
    if bad:
        raise ValueError(
            "StackedLearner builds the reference train step only (no auxiliary signals, no CQL, no input "
            f"noise); not {bad}"
        )


def reference_collect_config(cfg: Config) -> None:
    """Refuse a configuration whose collect step :meth:`StackedLearner.collect_phases` does not build: the
    reference train step's refusals (:func:`reference_config`), and acting by the expected Q
    (``agent.act_by = "mean"``: the fused ``act_c51_dueling``)."""
    reference_config(cfg)
    if cfg.agent.act_by != "mean":
        raise ValueError(
            "StackedLearner builds the reference collect step only (acting by the expected Q); "
            f"not agent.act_by = {cfg.agent.act_by!r}"
        )


def stacked_replay(cfg: Config, n_envs: int, seeds, backend: str | None = None, configs=None):
    """The :class:`cudarl.stacked_replay.StackedPrioritizedReplay` of state rows whose member ``i`` is the
    replay :class:`cudarl.trainer.Trainer` makes for ``cfg`` with ``run.seed = seeds[i]`` (``n_envs``: its
    interleaved columns, rows of a collect step); ``configs``: optional P configs, member ``i``'s alpha, eps
    and beta schedule ``configs[i].replay``'s (:data:`MEMBER_SETTINGS`)."""
    from .stacked_replay import MEMBER_FIELDS, StackedPrioritizedReplay

    r = cfg.replay
    per = [c.replay for c in configs] if configs is not None else [r]
    own = {k: [getattr(m, k) for m in per] if configs is not None else getattr(r, k) for k in MEMBER_FIELDS}
    return StackedPrioritizedReplay(
        len(seeds), r.capacity, STATE_DIM, seeds=np.asarray(seeds, np.int64), n_step=r.n_step, n_envs=n_envs,
        store_next_obs=cfg.env.counterfactual, backend=backend, **own,
    )  # fmt: skip


#: The settings members of a joined population (:class:`StackedLearner`, :func:`stacked_replay` and
#: :class:`cudarl.stacked_env.StackedTradingEnv`) may set differently (section -> fields): each is a ``[P]``
#: device array (an optimiser's, schedule's, replay's or env's table, or the initial value of a per-member
#: device scalar), so member ``i`` runs its own value with the single kernel's arithmetic (Adam's betas, eps,
#: weight decay and clip norm: :attr:`cudarl.optim.StackedAdam.constant_table`). The costs
#: (``env.cost_bps``, ``env.slippage_bps`` and the training reward's ``agent.train_cost_bps``) are the
#: stacked env's cost rates, the reward options (``env.hold_cap``, ``env.fill``, ``env.levels``) its hold
#: caps, return rows and level rows (:data:`cudarl.stacked_env.MEMBER_FIELDS`). Shrink-and-perturb
#: (``optim.shrink_every``, ``shrink``, ``perturb``) and PopArt's freeze (``agent.popart_warmup``) are
#: host-driven work between updates, member by member; ``agent.popart_beta`` is the initial value of
#: PopArt's ``beta [P]``. Every other field the learner reads is one for every member (why, for those of issue
#: 23's list: :data:`NOT_MEMBER_SETTINGS`).
MEMBER_SETTINGS = {
    "optim": (
        "schedule",
        "lr",
        "lr_min",
        "warmup",
        "period",
        "mult",
        "restart_m_scale",
        "beta1",
        "beta2",
        "eps",
        "weight_decay",
        "max_grad_norm",
        "shrink_every",
        "shrink",
        "perturb",
    ),
    "agent": (
        "gamma",
        "tau_start",
        "tau_end",
        "tau_period",
        "eps_start",
        "eps_end",
        "eps_steps",
        "train_cost_bps",
        "popart_beta",
        "popart_warmup",
    ),
    "replay": ("alpha", "eps", "beta0", "beta_final", "beta_steps"),
    "env": ("cost_bps", "slippage_bps", "hold_cap", "fill", "levels"),
}


#: The fields of issue 23's list, or of the branches mode's :data:`cudarl.population.MAY_DIFFER`, that stay one for
#: every member of a joined population, each with why (``section.field`` -> the reason; :class:`StackedLearner`'s
#: and :class:`cudarl.population.Population`'s refusals append it to the field's name).
NOT_MEMBER_SETTINGS = {
    "replay.n_step": (
        "the n-step sets when a run starts learning: Trainer.prime collects until min(rows collected, "
        "replay.capacity) - n_step * (rows a collection) >= max(agent.learning_starts, agent.batch_size), so "
        "n_step + ceil(that maximum / rows a collection) times before the first update, and a population's "
        "members collect and update in step (either mode; no member's updates are masked): a member whose "
        "n_step differed from the first's by k would make its first update k collections away from its run "
        "alone's and differ from it from then on (the replay's kernels could take each member's n and lag as [P] "
        "arrays with no shape changed; the shared loop is the obstacle)"
    ),
    "agent.kappa": (
        "the quantile heads' Huber threshold (net.head 'iqn', 'qrdqn', 'c51+iqn'); the joined step is "
        "dueling C51 and never reads it (the branches mode takes it per member)"
    ),
    "agent.cql_alpha": (
        "conservative Q-learning's weight; the joined step builds no CQL (agent.cql_alpha > 0 is refused for "
        "every member) and never reads it (the branches mode takes it per member)"
    ),
    "agent.plan_hurdle": (
        "the plan head's hurdle (net.plan); the joined step builds no plan head and never reads it (the "
        "branches mode takes it per member)"
    ),
}


def why_not_member_settings(fields) -> str:
    """The reasons :data:`NOT_MEMBER_SETTINGS` gives for those of ``fields`` (``section.field`` names) it holds,
    as a refusal's tail (``"; field: reason"`` each; empty when none)."""
    return "".join(f"; {f}: {NOT_MEMBER_SETTINGS[f]}" for f in fields if f in NOT_MEMBER_SETTINGS)


def member_settings(configs) -> list[str]:
    """The ``section.field`` names of :data:`MEMBER_SETTINGS` in which ``configs`` differ (for messages)."""
    return [
        f"{sec}.{f}"
        for sec, fields in MEMBER_SETTINGS.items()
        for f in fields
        if len({getattr(getattr(c, sec), f) for c in configs}) > 1
    ]


def _learner_differences(a: Config, b: Config) -> list[str]:
    """The ``section.field`` names of the sections the learner reads (net, agent, optim, replay) where ``a`` and
    ``b`` differ outside :data:`MEMBER_SETTINGS`."""
    out = []
    for sec in ("net", "agent", "optim", "replay"):
        da, db = getattr(a, sec).__dict__, getattr(b, sec).__dict__
        out += [f"{sec}.{k}" for k in da if da[k] != db[k] and k not in MEMBER_SETTINGS.get(sec, ())]
    return out


class StackedLearner:
    """The learner of P agents of one reference configuration, members differing in their seeds and in the
    settings of :data:`MEMBER_SETTINGS`.

    Args:
        cfg: the :class:`cudarl.config.Config` every member runs (``run.seed`` is not read: ``seeds``);
            the reference train step only (:func:`reference_config`).
        obs_dim: the network's input (:attr:`cudarl.window.Windows.width`); n_actions: A.
        seeds: P seeds, member ``i`` initialised as ``Agent`` with ``run.seed = seeds[i]``.
        xp: ``numpy`` or ``cupy``.
        configs: optional P configs, member ``i`` reading the fields of :data:`MEMBER_SETTINGS` from
            ``configs[i]`` (its optimiser, gamma, tau and epsilon schedules, PopArt, shrink-and-perturb; its
            replay's PER settings are :func:`stacked_replay`'s); the rest from ``cfg``. Default: ``cfg`` for
            every member.

    Buffers (member ``i`` at index ``i`` of the leading axis): :attr:`online`, :attr:`target`
    (:class:`cudarl.nn.StackedQNetwork`), :attr:`adam` (:class:`cudarl.optim.StackedAdam`),
    :attr:`soft`, :attr:`popart` (:class:`cudarl.popart.StackedPopArt` or None), :attr:`out` (the
    targets-and-loss buffers: ``loss [P]``, ``loss_per``, ``priority [P, B]``, ...), :attr:`loss`,
    :attr:`priority`, :attr:`grad_norm` ``[P]``, :attr:`stats` float32 ``[P, 2A + 2]`` (the Q statistics,
    :func:`cudarl.reference.qstats.layout`), :attr:`batch` (the windows ``[P, B, obs_dim]`` and the
    batch's action, return and discount), and the host rings :attr:`readback` (loss and grad norm,
    ``ring [P, 2 * PUBLISH_SLOTS]``) and :attr:`stats_ring` (``[slots, P * (2A + 2)]``).
    """

    def __init__(self, cfg: Config, obs_dim: int, n_actions: int, seeds, xp, configs=None):
        reference_config(cfg)
        self.cfg, self.xp = cfg, xp
        self.seeds = [int(s) for s in seeds]
        P = self.members = len(self.seeds)
        configs = [cfg] * P if configs is None else list(configs)
        if len(configs) != P:
            raise ValueError(f"StackedLearner: {len(configs)} configs for {P} members")
        bad = sorted({f for c in configs for f in _learner_differences(cfg, c)})
        if bad:
            raise ValueError(
                f"StackedLearner: members differ in {', '.join(bad)}; only the fields of MEMBER_SETTINGS may differ"
                + why_not_member_settings(bad)
            )
        #: member ``i``'s config (its :data:`MEMBER_SETTINGS`)
        self.configs = configs
        per = [c.agent for c in configs]
        B = self.batch_size = cfg.agent.batch_size
        a = cfg.agent
        A, K = int(n_actions), cfg.net.atoms
        net = dict(members=P, xp=xp, max_batch=B, seeds=self.seeds)
        self.online = StackedQNetwork(obs_dim, A, cfg.net, **net)
        self.target = StackedQNetwork(obs_dim, A, cfg.net, **net)
        self.target.params[...] = self.online.params
        self.ws = self.online.ws  # the online forward at s, which the backward runs over
        self.ws_next = self.online.new_workspace(B)  # the online forward at s', on a branch
        # the state rows the replay gathers, and the windows of s and s' (halves of one pair a member,
        # members 256 bytes apart, as the batched GEMMs' inputs)
        f32 = np.float32
        self.rows = Batch(
            xp.zeros((P, B, STATE_DIM), f32), xp.zeros((P, B, STATE_DIM), f32), xp.zeros((P, B), np.int32),
            xp.zeros((P, B), f32), xp.zeros((P, B), f32),
        )  # fmt: skip
        self.pair = stacked_zeros(xp, P, (2 * B, obs_dim))
        self.batch = Batch(self.pair[:, :B], self.pair[:, B:], *self.rows[2:])
        # their plans before any capture (s' has the stride); the backward runs over the online forward at s
        self.online.prepare_input(self.batch.obs, self.ws, backward=True)
        self.target.prepare_input(self.batch.next_obs, self.target.ws)
        self.support = xp.asarray(support(cfg.net))
        self.popart = (
            StackedPopArt(P, beta=[m.popart_beta for m in per], scale=C51Rule.popart_scale(cfg.net), xp=xp)
            if a.popart
            else None
        )
        self.ws.set_batch(B)
        self.out = losses.C51TargetsLoss.empty(
            xp, B, A, K, popart=a.popart, members=P, dva=self.online.grad_output(self.ws, raw_head=True)
        )
        self.loss, self.priority = self.out.loss, self.out.priority
        n_stats = 2 * A + 2  # the single agent's one statistics block, "q" (cudarl.reference.qstats.layout)
        self.stats = xp.full((P, n_stats), np.nan, f32)
        self.qs = losses.QStats(
            stats=self.stats, q=xp.zeros((P, B, A), f32), ent=xp.zeros((P, B), f32), mass=xp.zeros((P, B, K), f32)
        )
        self.stats_ring = PinnedReadback(P * n_stats, f32, xp, slots=PUBLISH_SLOTS)
        #: loss and grad norm of every member, ``ring`` ``[P, 2 * PUBLISH_SLOTS]`` as each member's own
        #: ring alone (one event for all of it: the per-member monitor is not built)
        self.readback = PinnedReadback(P * 2 * PUBLISH_SLOTS, f32, xp)
        self.ring = self.readback.device.reshape(P, 2 * PUBLISH_SLOTS)
        self.grad_norm = xp.zeros(P, f32)
        self.adam = StackedAdam.from_config(self.online, [c.optim for c in configs], self.grad_norm, xp)
        self.soft = StackedSoftUpdate(
            self.target.params,
            self.online.params,
            *([getattr(m, k) for m in per] for k in ("tau_start", "tau_end", "tau_period")),
            xp=xp,
        )
        #: tests and benchmarks: ``{"targets_loss": bool, "adam": bool}`` forces each form (True: the one launch
        #: even where it squeezes the members, the launchers' ``grid_barrier="always"``; False: the launches
        #: without the barrier) in place of the launchers' choice; None (default): the launchers choose
        self.force_forms: dict | None = None
        #: per operation with a grid-barrier form, whether its launcher takes its one launch: ``{"targets_loss":
        #: bool, "adam": bool}`` (:meth:`one_launch_forms`; False: the launches without the barrier, the same bits)
        self.one_launch = self.one_launch_forms()
        self.agent_ops, self.nn_ops = family("agent", xp), family("nn", xp)
        #: branches as the single agent's: the target net's forward, the online net's at s', small kernels
        #: (schedules, importance weights, the unfused publish), the statistics' reduction, the priorities
        self.side, self.side_next, self.side_small = SideStream(xp), SideStream(xp), SideStream(xp)
        self.side_stats, self.side_priorities = SideStream(xp), SideStream(xp)
        #: one branch per layer for its weight gradients (every member's), beside the dx chain, as alone
        self.grad_sides = [SideStream(xp) for _ in self.online.linears]
        self.online.set_side_stream(self.grad_sides)
        self.idx = self.weights = None  # the replay's [P, B] buffers, set by the sample phase
        self.va = self.va_online_next = self.va_target_next = None  # the forward's outputs (workspace rows)
        self._popart_live = set(range(P)) if self.popart is not None else set()  # members whose PopArt moves
        #: the collect step's device scalars, each ``[P]`` (as :class:`cudarl.agent.Agent`'s one each; checkpointed
        #: with the member)
        self.scalars = MemberScalars(
            {"gamma": f32, "epsilon": f32, "collect_steps": np.int64}, P, xp,
            initial={"gamma": [m.gamma for m in per], "epsilon": [m.eps_start for m in per]},
        )  # fmt: skip
        self.ws_act = self.q_act = None  # the acting forward's workspace and expected Q (collect_phases)

    def one_launch_forms(self, limit: int | None = None) -> dict:
        """Which form each operation with a grid barrier takes: ``{"targets_loss": bool, "adam": bool}``,
        True for its one launch (``c51.targets_loss_popart`` phase 0; ``optim.clip_adam_soft``'s barrier
        launch), False for its launches without the barrier (the PopArt loss's two; the optimiser's two,
        ``optim.grad_norm_publish`` and ``optim.adam_update_soft``), the same bits either way.

        The launchers decide (``c51.targets_loss_popart_one_launch``, ``optim.clip_adam_soft_one_launch``,
        given ``run.grid_barrier``, P, and the batch or a member's parameters): the one launch where
        ``run.grid_barrier`` permits it and every member gets the blocks the single agent gets alone
        (:func:`cudarl.kernels.barrier_grid_fits` over ``limit`` resident blocks, default
        :func:`cudarl.kernels.resident_grid_limit`); this asks them, for the reports. One member always
        fits; ``False`` everywhere with ``run.grid_barrier`` off. The loss without PopArt is one launch with
        no grid barrier whatever this says. NumPy, ``limit`` not given: one launch (the twins have no
        residency). :attr:`force_forms`, when set, is what the launchers are told (:meth:`force`)."""
        c51 = family("c51", self.xp)
        return {
            "targets_loss": c51.targets_loss_popart_one_launch(
                self.members, self.batch_size, self._grid_barrier("targets_loss"), limit
            ),
            "adam": self.adam.one_launch(self._grid_barrier("adam"), limit),
        }

    def force(self, forms: dict | None) -> None:
        """Force each operation's form (:attr:`force_forms`; None: the launchers choose again) and refresh
        :attr:`one_launch`."""
        self.force_forms = None if forms is None else dict(forms)
        self.one_launch = self.one_launch_forms()

    def _grid_barrier(self, op: str) -> bool | str:
        """What ``op``'s launcher is told: ``run.grid_barrier``, or the form :attr:`force_forms` forces."""
        if self.force_forms is None:
            return self.cfg.run.grid_barrier
        return "always" if self.force_forms[op] else False

    def forms(self) -> dict:
        """What :meth:`train_phases` launches for the loss and the optimiser, in words (benchmark rows):
        ``{"targets_loss": str, "adam": str}``."""
        one = self.one_launch
        if self.popart is None:
            loss = "one launch (no grid barrier)"
        else:
            loss = "one launch (grid barrier)" if one["targets_loss"] else "two launches (no grid barrier)"
        adam = "one launch (grid barrier)" if one["adam"] else "two launches (norm and publish; update)"
        return {"targets_loss": loss, "adam": adam}

    # --- collect -------------------------------------------------------------------------------
    def collect_phases(self, env, replay, transitions, discount) -> list:
        """The phases of one collection step of every member's environments (the single agent's, module
        docstring): ``env`` a :class:`cudarl.stacked_env.StackedTradingEnv` of P members (member ``i``'s
        draws keyed by its ``env.seed``), ``replay`` a stacked replay of P members (:func:`stacked_replay`),
        ``transitions`` its :meth:`~cudarl.stacked_env.StackedTradingEnv.make_transitions` and ``discount``
        float32 ``[P, rows]``. Allocates the acting workspace (``[P, n_envs]`` rows) and ``q_act [P, N, A]``
        here, before any capture."""
        reference_collect_config(self.cfg)
        P, xp = self.members, self.xp
        for name, obj in (("env", env), ("replay", replay)):
            if getattr(obj, "members", None) != P:
                raise ValueError(f"collect_phases: a stacked {name} of {P} members, got {type(obj).__name__}")
        N = env.n_envs
        self.ws_act = self.online.new_workspace(N)
        self.online.prepare_input(env.obs, self.ws_act)  # the windows' member stride: a plan before capture
        self.q_act = xp.zeros((P, N, env.n_actions), np.float32)
        # the device epsilon, its step counter, the fused act kernel's ticket counters (0 between launches),
        # each member's epsilon schedule ([P] arrays of act_c51_dueling's by-value types)
        per = [c.agent for c in self.configs]
        eps_args = (
            self.scalars.view("epsilon"), self.scalars.view("collect_steps"), xp.zeros(P, np.uint32),
            xp.asarray(np.array([m.eps_start for m in per], np.float64)),
            xp.asarray(np.array([m.eps_end for m in per], np.float64)),
            xp.asarray(np.array([m.eps_steps for m in per], np.int64)),
        )  # fmt: skip

        def act():
            va = self.online.forward(env.obs, self.ws_act, raw_head=True)
            self.agent_ops.act_c51_dueling_members(
                env.actions, self.q_act, va, self.support, env.state.count, env.seed, *eps_args
            )

        def env_step():
            env.record_step(transitions, discount, self.scalars.view("gamma"))

        def replay_insert():
            t = transitions
            if replay.spec.store_next_obs:
                replay.add(t.obs, t.action, t.reward, discount, next_obs=t.next_obs)
            else:
                replay.add(t.obs, t.action, t.reward, discount)

        return [("act", act), ("env_step", env_step), ("replay_insert", replay_insert)]

    # --- train ---------------------------------------------------------------------------------
    def train_phases(self, replay, windows) -> list:
        """The phases of one update of every member from ``replay`` (a
        :class:`cudarl.stacked_replay.StackedPrioritizedReplay` of P members, e.g. :func:`stacked_replay`),
        whose observation windows ``windows`` (:class:`cudarl.window.Windows`, one for all) gathers: the
        single agent's phases in its order, each launch over every member."""
        cfg, B = self.cfg, self.batch_size
        if getattr(replay, "members", None) != self.members:
            raise ValueError(f"train_phases: a stacked replay of {self.members} members, got {type(replay).__name__}")
        replay.reserve(B)  # its index and weight buffers exist before any capture
        head = self.online.head.name

        def schedules():
            with self.side_small.fork():  # joined by targets_loss, the first phase that reads them
                self.adam.schedule_step()
                self.soft.schedule_step()

        def sample():
            self.idx, self.weights = replay.sample(
                B, side=self.side_small, out=self.rows, windows=windows, windows_out=self.pair
            )

        def forward():
            with self.side.fork():
                self.va_target_next = self.target.forward(self.batch.next_obs, self.target.ws, raw_head=True)
            with self.side_next.fork():
                self.va_online_next = self.online.forward(self.batch.next_obs, self.ws_next, raw_head=True)
            self.va = self.online.forward(self.batch.obs, self.ws, raw_head=True)

        def targets_loss():
            self.side_small.join()  # the schedules and the importance weights
            self.side.join()
            self.side_next.join()
            popart = targets_loss_kwargs(self.popart)
            losses.c51_targets_loss(
                self.va,
                self.va_online_next,
                self.va_target_next,
                self.batch.action,
                self.weights,
                self.support,
                self.batch.ret,
                self.batch.discount,
                cfg.agent.priority,
                **popart,
                out=self.out,
                grid_barrier=self._grid_barrier("targets_loss"),  # the launcher picks (self.one_launch reports it)
            )

        def q_stats():
            logits = self.ws.rows(f"{head}.logits", B)
            self.nn_ops.dueling_forward(self.va, logits)
            losses.q_stats_rows(logits, self.support, self.qs)
            with self.side_stats.fork():
                losses.q_stats_reduce(self.qs)

        def priorities():
            with self.side_priorities.fork():  # beside the backward and the optimiser, as alone
                replay.update_priorities(self.idx, self.priority, device_rules=True)

        def backward():
            self.online.backward(self.ws)
            for side in self.grad_sides:  # the weight gradients, before anything reads them
                side.join()

        def adam():  # one launch or two, as the launcher picks (self.one_launch["adam"] reports it)
            self.adam.clip_update_publish(self.soft, self.ring, self.loss, PUBLISH_SLOTS, self._grid_barrier("adam"))

        def publish():
            self.side_stats.join()
            step = self.adam.scalars.view("step")[:1]  # every member's: they advance together
            self.agent_ops.publish_row(self.stats_ring.device, self.stats.reshape(-1), step, PUBLISH_SLOTS)

        return [
            ("schedules", schedules),
            ("sample", sample),
            ("forward", forward),
            ("targets_loss", targets_loss),
            ("q_stats", q_stats),
            ("priorities", priorities),
            ("backward", backward),
            ("adam", adam),
            ("publish", publish),
        ]

    # --- between two updates ------------------------------------------------------------------------
    def between_updates(self, step: int, stream=None) -> None:
        """:meth:`cudarl.agent.Agent.between_updates` for every member, each with its own settings: member
        ``i``'s PopArt statistics freeze once its ``agent.popart_warmup`` updates are done; every
        ``optim.shrink_every`` updates of its own its online network is shrunk and perturbed with its seed
        (a launch per member)."""
        warmups = [c.agent.popart_warmup for c in self.configs]
        due = sorted(i for i in self._popart_live if warmups[i] and step >= warmups[i])
        if due:
            self.popart.freeze_members(due, stream)
            self._popart_live -= set(due)
        with stream if stream is not None else nullcontext():
            for i, (seed, c) in enumerate(zip(self.seeds, self.configs, strict=True)):
                o = c.optim
                if o.shrink_every and step % o.shrink_every == 0:
                    shrink_perturb(self.online.params[i], o.shrink, o.perturb, seed, step // o.shrink_every)

    # --- what the host reads ---------------------------------------------------------------------
    def published(self, step: int) -> dict:
        """What update ``step`` published, per member: ``loss``, ``grad_norm`` float32 ``[P]`` and the Q
        statistics ``stats [P, 2A + 2]``; call :meth:`mark_published` after launching it (host reads, after
        the events)."""
        s = step % PUBLISH_SLOTS
        ring = self.readback.read().reshape(self.members, 2 * PUBLISH_SLOTS)
        stats = self.stats_ring.read(s).reshape(self.members, -1)
        return {"loss": ring[:, 2 * s], "grad_norm": ring[:, 2 * s + 1], "stats": stats}

    def mark_published(self, step: int, stream=None) -> None:
        """Update ``step`` was just launched on ``stream``: its rings are read after this point."""
        self.readback.mark_written(stream)
        self.stats_ring.mark_written(stream, slot=step % PUBLISH_SLOTS)

    # --- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Host copies of every member's networks, optimiser, target update, scalars and PopArt: each entry
        the single agent's (:meth:`cudarl.agent.Agent.state_dict`) with a leading member axis, and ``seeds``
        for the compatibility check. The replay is the caller's (:meth:`StackedPrioritizedReplay.state_dict`
        beside this, as a :class:`cudarl.trainer.Trainer` checkpoint holds ``agent`` and ``replay``)."""
        s = {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "adam": self.adam.state_dict(),
            "soft": self.soft.state_dict(),
            "scalars": self.scalars.state_dict(),
            "seeds": np.array(self.seeds, np.int64),
        }
        if self.popart is not None:
            s["popart"] = self.popart.state_dict()
        return s

    def load_state_dict(self, s: dict) -> None:
        """Restore :meth:`state_dict` into the existing buffers (their addresses stay, so captured graphs stay
        valid); its ``seeds`` must be this learner's (they key shrink-and-perturb's draws)."""
        seeds = np.asarray(s["seeds"])
        if seeds.shape != (self.members,) or seeds.tolist() != self.seeds:
            raise ValueError(f"StackedLearner state: seeds {seeds.tolist()} are not this learner's {self.seeds}")
        self._check_keys(s, {"seeds"})
        self.online.load_state_dict(s["online"])
        self.target.load_state_dict(s["target"])
        self.adam.load_state_dict(s["adam"])
        self.soft.load_state_dict(s["soft"])
        self.scalars.load_state_dict(s["scalars"])
        if self.popart is not None:
            self.popart.load_state_dict(s["popart"])
        self._popart_live = self._live_popart()

    def member_state_dict(self, i: int) -> dict:
        """Member ``i``'s state as the :meth:`cudarl.agent.Agent.state_dict` of the agent it equals (``run.seed
        = seeds[i]``), bit for bit: a checkpoint's ``agent`` that a single agent loads and continues from."""
        i = member_index(i, self.members)
        s = {
            "online": self.online.member_state_dict(i),
            "target": self.target.member_state_dict(i),
            "adam": self.adam.member_state_dict(i),
            "soft": self.soft.member_state_dict(i),
            "scalars": self.scalars.member_state_dict(i),
        }
        if self.popart is not None:
            s["popart"] = self.popart.member_state_dict(i)
        return s

    def load_member_state_dict(self, i: int, s: dict) -> None:
        """Restore an :meth:`cudarl.agent.Agent.state_dict` of this configuration (e.g. a single agent's
        checkpoint's ``agent``) into member ``i``; the other members keep theirs. Member ``i`` continues as
        that agent would if its ``run.seed`` is ``seeds[i]`` (shrink-and-perturb draws with it). PopArt's
        statistics keep moving until :meth:`between_updates` freezes every member's, if any member's move."""
        i = member_index(i, self.members)
        self._check_keys(s, set())
        self.online.load_member_state_dict(i, s["online"])
        self.target.load_member_state_dict(i, s["target"])
        self.adam.load_member_state_dict(i, s["adam"])
        self.soft.load_member_state_dict(i, s["soft"])
        self.scalars.load_member_state_dict(i, s["scalars"])
        if self.popart is not None:
            self.popart.load_member_state_dict(i, s["popart"])
        self._popart_live = self._live_popart()

    def _live_popart(self) -> set:
        """The members whose PopArt statistics still move (beta not 0: a device read, between replays)."""
        if self.popart is None:
            return set()
        return {i for i, frozen in enumerate(self.popart.frozen_members()) if not frozen}

    def _check_keys(self, s: dict, extra: set) -> None:
        """Refuse a state of another configuration: PopArt's presence must match, and nothing the reference
        train step does not hold (a rule's or an auxiliary signal's state)."""
        want = {"online", "target", "adam", "soft", "scalars", *extra}
        if self.popart is not None:
            want.add("popart")
        if set(s) != want:
            raise ValueError(
                f"StackedLearner state: entries {sorted(s)}, expected {sorted(want)} (another configuration?)"
            )
