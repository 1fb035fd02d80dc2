"""The learner: online and target Q-networks, the optimiser, and the two steps as graph phases.

``Agent.collect_phases(env, replay)`` and ``Agent.train_phases(replay)`` return the named phases
that :class:`cudarl.graph.StepGraph` captures (GPU) or runs in order (NumPy)::

    collect: act (the head rule's: the online forward, then one kernel for expected Q, the device
             epsilon and epsilon-greedy; C51 combines the dueling head in that kernel; with net.plan
             the plan head's gate into env.scale) - env_step (one launch, env.record_step: record the
             transitions, their discounts, step, reset ended episodes, the next windows) - replay_insert
    train:   schedules (lr and tau: a parallel branch, joined by the first learn phase) - fold (agent.aux "selectivity"
             over the MLP: both nets' gates folded into their first layers' weights, a branch joined at the end of
             sample; every forward of the step reads it, QNetwork.prefolded_forwards) - sample (the search, the gather
             of the state rows and the observation windows of s and s' from the feature matrix in one launch; the
             importance weights on that branch) - input_noise (agent.input_noise: joins that branch, then noise into the
             windows of s, one launch) - forward (the rule's; the extra heads run at s only, on a branch of their own) -
             q_stats (the expected Q at s and the statistics, on a branch beside the learn phases) - the rule's learn
             phases (C51: targets_loss, one launch; IQN, QR-DQN: targets - loss) - q_stats_join (joins q_stats' branch
             where a later phase reads it, CQL, the plan head or homeostatic, else publish joins it; joins the extra
             heads at s) - cql (agent.cql_alpha) - plan (net.plan: cudarl.plan) - the auxiliary signals' loss phases (on
             their branch, joined by the backward) - extras_backward (C51 with an auxiliary head: the extra heads'
             backward on the auxiliary branch, beside homeostatic's, joined by the backward, which adds the Q head's
             dL/dpsi) - priorities (a parallel branch to the end) - backward (dx chain | weight gradients, in parallel;
             joins the auxiliary branches) - the auxiliary signals' grad phases (Gradient Vaccine's correction, from the
             auxiliary heads' backward on its branch beside this one; the causal penalty's gradient, from a backward on
             its branch beside this one, added: they read and rewrite the flat gradient, the auxiliary heads' included;
             in agent.aux order, causal's added inside vaccine's kernels where it comes right before it) - aux_sgd (the
             auxiliary signals' own SGD steps, agent.aux "risk": its head; "denoise": the encoder and its decoder,
             joining its branch; every span in one launch, after the grad phases so that those see the heads' gradients
             before a step clears them, or beside the last of them where those touch no span's gradient, vaccine's) -
             adam (one launch: the gradient norm and clip, the update with the
             target net's soft update and the publish of loss and gradient norm to the host ring; three launches with
             run.grid_barrier = false) - spectral (net.spectral: a power iteration and W_sn of both nets) - publish (the
             step's observables, :class:`cudarl.stats.StepStats`, to their host ring)

On the GPU "in parallel" means a :class:`cudarl.graph.SideStream`: a branch of the captured graph
that runs beside the main chain (same kernels and inputs, so the same bits as one stream).

The agent never asks which head it runs: the head's rule (``net.head`` in
:data:`cudarl.rules.HEAD_RULES`, a :class:`cudarl.rules.HeadRule`) gets a
:class:`cudarl.rules.LearnerBuffers` and hands back its phases; auxiliary signals
(``agent.aux`` in :data:`cudarl.auxiliary.AUX_SIGNALS`) likewise. Every buffer is allocated here or
there, before any capture. The math is in :mod:`cudarl.losses`.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from .auxiliary import AUX_SIGNALS, input_gate
from .auxiliary.base import AuxSgd
from .backend import address, family, to_numpy
from .config import Config
from .graph import SideStream
from .nn import QNetwork
from .optim import Adam, SoftUpdate, shrink_perturb
from .pinned import DeviceScalars, PinnedReadback
from .plan import PlanLoss, gate
from .popart import PopArt
from .reference.window import STATE_DIM, noise_scale
from .replay import Batch
from .rules import HEAD_RULES, LearnerBuffers
from .stats import StepStats

#: Pinned ring slots of (loss, grad_norm): the graph writes step t while the host reads t - 1.
PUBLISH_SLOTS = 2


class Agent:
    """Networks, optimiser, target update and the step buffers of one run.

    Args:
        cfg: the run's :class:`cudarl.config.Config`.
        obs_dim: observation width, the network's input (``net.window`` bars of features and the
            env's position features: :attr:`cudarl.window.Windows.width`).
        n_actions: actions of the env.
        n_envs: environments acting together (rows of the acting forward pass).
        xp: ``numpy`` or ``cupy``.
        market: the :class:`cudarl.env.TradingEnv` whose bars the replay's rows index (the auxiliary
            signals that predict future bars read its returns; the Trainer passes its env), or None.
        feature_names: the feature matrix's column names (``LearnerBuffers.feature_names``: what an
            auxiliary signal that intervenes on feature groups reads), or () when unknown.

    Attributes: :attr:`online`, :attr:`target` (:class:`cudarl.nn.QNetwork`), :attr:`buffers` (what
    the rule and the auxiliary signals share), :attr:`rule`, :attr:`aux`, :attr:`adam`, :attr:`soft`,
    :attr:`popart` (or None), and :attr:`batch`, :attr:`loss`, :attr:`loss_per`, :attr:`priority`
    (the buffers').
    """

    def __init__(
        self, cfg: Config, obs_dim: int, n_actions: int, n_envs: int, xp, market=None, feature_names: tuple = ()
    ):
        self.cfg, self.xp, self.n_envs = cfg, xp, int(n_envs)
        self._eval_rows = None  # (eval_rows(),) once made: row_exact_q may be None
        self._eval_ws = None  # eval_q_into's workspace where there is no block Q (grown to the most rows asked)
        # acting_observables: a collect step has acted (collected); no forward of q_values has written the
        # acting workspace since the last one
        self._acted = self._act_ws_fresh = False
        self.batch_size = B = cfg.agent.batch_size
        a, o = cfg.agent, cfg.optim
        rule_cls = HEAD_RULES[cfg.net.head]
        self.aux = [AUX_SIGNALS[name](cfg) for name in a.aux]
        net_kw = dict(
            extra_heads={s.name: s.make_head for s in self.aux},
            input_gate=input_gate(self.aux),
            xp=xp,
            seed=cfg.run.seed,
        )
        self.online = QNetwork(obs_dim, n_actions, cfg.net, max_batch=B, **net_kw)
        self.online.prepare_backward(B)  # the backward runs over the s rows
        self.target = QNetwork(obs_dim, n_actions, cfg.net, max_batch=B, **net_kw)
        self.target.params[...] = self.online.params
        for net in (self.online, self.target):  # net.spectral: one power iteration a step, in its phase
            net.spectral_in_steps()
        self.target.spectral_step(iterate=False)  # W_sn of the copied weights
        self.pair = xp.zeros((2 * B, obs_dim), np.float32)
        #: The state rows of s and s' the replay gathers into (halves of one buffer), whose windows the
        #: sample phase gathers into ``pair``.
        self.rows_pair = xp.zeros((2 * B, STATE_DIM), np.float32)
        action, ret, discount = xp.zeros(B, np.int32), xp.zeros(B, np.float32), xp.zeros(B, np.float32)
        self.rows_batch = Batch(self.rows_pair[:B], self.rows_pair[B:], action, ret, discount)
        #: The fixed batch the network reads: obs and next_obs are halves of ``pair``.
        self.batch = Batch(self.pair[:B], self.pair[B:], action, ret, discount)
        self.popart = PopArt(beta=a.popart_beta, scale=rule_cls.popart_scale(cfg.net), xp=xp) if a.popart else None
        #: the observables the step computes and publishes to the host (metrics.jsonl, the guard)
        blocks = {
            "q": 2 * n_actions + 2,
            **({"plan": 2} if cfg.net.plan else {}),
            **({"cql": 1} if a.cql_alpha else {}),
        }
        self.stats = StepStats(blocks, n_actions, xp, PUBLISH_SLOTS)
        self.buffers = buf = LearnerBuffers(
            cfg,
            xp,
            self.online,
            self.target,
            self.batch,
            self.pair,
            n_envs,
            self.stats,
            self.popart,
            rows=self.rows_pair[:B],
            market=market,
            feature_names=feature_names,
        )
        self.rule = rule_cls.allocate(buf)
        # the extra heads of the step's forward at s (the backward's) run on a branch of their own (the
        # forwards at s' run none; causal's intervened forward branches through buffers.step_workspace)
        self.online.branch_extras(buf.ws)
        #: the plan head's loss (net.plan), or None
        self.plan = PlanLoss(buf, cfg.env.position_levels()) if cfg.net.plan else None
        for s in self.aux:
            s.allocate(buf)
        self.loss, self.loss_per, self.priority = buf.loss, buf.loss_per, buf.priority
        self.readback = PinnedReadback(2, np.float32, xp, slots=PUBLISH_SLOTS)
        self.grad_norm = xp.zeros(1, np.float32)
        self.adam = Adam.from_config(self.online, o, self.grad_norm, xp)
        self.soft = SoftUpdate(self.target.params, self.online.params, a.tau_start, a.tau_end, a.tau_period, xp=xp)
        self.scalars = DeviceScalars(
            {"gamma": np.float32, "epsilon": np.float32, "collect_steps": np.int64},
            xp,
            initial={"gamma": a.gamma, "epsilon": a.eps_start},
        )
        self.ops = family("agent", xp)
        self._popart_live = self.popart is not None  # host's view of PopArt's statistics still moving
        #: the priority update's branch (beside the backward and the optimiser)
        self.side_priorities = SideStream(xp)
        #: one branch per layer for its weight gradients: the layers' dW GEMMs (each with its bias
        #: column sums) run beside each other and beside the dx chain, not one after another
        self.grad_sides = [SideStream(xp) for _ in self.online.linears]
        self.online.set_side_stream(self.grad_sides)
        #: the fold phase's branch (the selectivity gate folded into the first layers, QNetwork.folded), or None
        self.side_fold = SideStream(xp, gemms=False) if self.online.folded is not None else None
        #: whether the extra heads' backward runs in the extras_backward phase, on the auxiliary branch,
        #: before the step's backward (QNetwork.extras_first: an auxiliary head writes dL/dpsi, and the Q
        #: head's backward adds onto it, not IQN's)
        self.extras_early = self.online.extras_first
        asked = [d for d in (s.extras_dpsi() for s in self.aux) if d is not None]
        if len(asked) > 1 or (asked and not self.extras_early):
            raise ValueError(
                f"agent: {len(asked)} auxiliary signals ask for the extra heads' dL/dpsi (at most one may, and only "
                "where those heads' backward runs before the Q head's)"
            )
        #: where the extras_backward phase writes the extra heads' sum of dL/dpsi, which the step's backward reads
        #: as its addend: the one signal's buffer that asks (AuxSignal.extras_dpsi, Gradient Vaccine's), or None
        #: (buffers.ws's, added to in place)
        self.extras_dpsi = asked[0] if asked else None
        #: whether a phase before the backward reads what q_stats writes (q_s, the logits at s): CQL, the
        #: plan head, a signal that declares it (AuxSignal.reads_q_stats); then q_stats_join waits for its
        #: branch, otherwise publish does (the reference step: its two launches off the critical path)
        self.q_stats_read = a.cql_alpha > 0 or self.plan is not None or any(s.reads_q_stats for s in self.aux)

    # --- collect -------------------------------------------------------------------------------
    def collect_phases(self, env, replay, transitions, discount) -> list:
        """Phases of one collection step of every environment (see the module docstring)."""
        a = self.cfg.agent
        # the device epsilon, its step counter, the fused act kernel's ticket counter (0 between launches)
        eps_args = (
            self.scalars.view("epsilon"),
            self.scalars.view("collect_steps"),
            self.xp.zeros(1, np.uint32),
            a.eps_start,
            a.eps_end,
            a.eps_steps,
        )

        def act():
            self.rule.act(env, eps_args)
            if self.plan is not None:  # the gate of the forward the rule just ran, into the env's scale
                gate(self.online, self.buffers.ws_act, env.n_envs, env.scale)

        def env_step():
            # record, step, the next windows and the rows' discounts in one launch (env.record_step)
            env.record_step(transitions, discount, self.scalars.view("gamma"))

        def replay_insert():
            if replay.spec.store_next_obs:
                replay.add(
                    transitions.obs, transitions.action, transitions.reward, discount, next_obs=transitions.next_obs
                )
            else:
                replay.add(transitions.obs, transitions.action, transitions.reward, discount)

        return [("act", act), ("env_step", env_step), ("replay_insert", replay_insert)]

    # --- train ---------------------------------------------------------------------------------
    def q_stats(self) -> None:
        """The rule's ``q_stats`` phase, right after the forward at s, on ``buffers.side_qstats``: it reads
        only the head's raw output at s and writes only ``q_s``, the logits rows of the workspace and the
        statistics, which the rule's learn phases neither read nor write. So it runs beside them (a
        phase that reads it waits in :meth:`q_stats_join`), and where nothing before the step's end
        reads it (:attr:`q_stats_read`) beside the backward and the optimiser too, joined by ``publish``.
        The same kernels on the same inputs: the same bits; its two launches off the critical path."""
        with self.buffers.side_qstats.fork():
            self.rule.q_stats()

    def q_stats_join(self) -> None:
        """After the rule's learn phases: where a later phase reads what q_stats wrote (CQL, the plan
        head, a signal with ``reads_q_stats``), the main stream waits for its branch here; then the join of
        the extra heads' branch of the forward at s (:meth:`cudarl.nn.QNetwork.branch_extras`), which ran
        beside the head's forward and the learn phases: the phases after this one may read their outputs."""
        if self.q_stats_read:
            self.buffers.side_qstats.join()
        self.online.join_extras(self.buffers.ws)

    def backward(self) -> None:
        """Gradients of the online net from the s half of the rule's forward (``buffers.ws``)."""
        buf = self.buffers
        buf.side_aux.join()  # the auxiliary heads' losses and the extra heads' backward (extras_backward)
        buf.side_qgrad.join()  # the branches that add into the Q head's gradient (homeostatic's)
        for s in self.aux:  # work of theirs beside this backward (Gradient Vaccine's backward)
            s.beside_backward()
        buf.ws.set_batch(self.batch_size)
        self.online.backward(self.batch.obs, buf.ws, extras_done=self.extras_early, extras_dpsi=self.extras_dpsi)
        for side in self.grad_sides:  # the weight gradients, before anything reads them
            side.join()

    def train_phases(self, replay, windows) -> list:
        """Phases of one learner update from ``replay`` (of state rows) into the fixed :attr:`batch`
        buffers, whose observations ``windows`` (:class:`cudarl.window.Windows`) gathers."""
        buf = self.buffers

        def schedules():
            # nothing reads lr, the bias corrections or tau before the first learn phase joins this branch
            with buf.side_small.fork():
                self.adam.schedule_step()
                self.soft.schedule_step()

        def fold():
            # agent.aux "selectivity" over the MLP (QNetwork.folded): each net's folded first-layer weight
            # diag(s) W1, from its parameters as the step finds them, which nothing moves before the last
            # forward of the step (Adam, the soft update and the own SGD steps come after the backward). A
            # branch beside sample, joined at its end, before any forward (the early phases' included) reads
            # it; the step's forwards do not fold again (prefolded_forwards). Forwards outside the step (acting,
            # evaluation) fold first, so none reads a fold older than the parameters
            with self.side_fold.fork():
                self.online.fold_gate()
                self.target.fold_gate()

        def sample():
            # the state rows and the windows of s and s' (from the feature matrix: the replay stores no
            # windows) gathered by the search's launch; the importance weights beside the forward (the
            # first learn phase joins them: buffers.importance_weights)
            buf.idx, buf.weights = replay.sample(
                self.batch_size, side=buf.side_small, out=self.rows_batch, windows=windows, windows_out=self.pair
            )
            if self.side_fold is not None:  # the folded weights, before the first forward
                self.side_fold.join()

        window_ops, noise = family("window", self.xp), noise_scale(self.cfg.agent.input_noise)

        def input_noise():
            # agent.input_noise: into the s half of the windows before anything reads them; keyed by the
            # optimiser's step, which the schedules branch advances: joined first (with the importance
            # weights, which the forward would otherwise overlap)
            buf.side_small.join()
            window_ops.noise(
                self.batch.obs, self.adam.scalars.view("step"), windows.window, windows.n_features, noise,
                self.cfg.run.seed,
            )  # fmt: skip

        def forward():
            self.rule.forward(self.batch)

        def backward():
            self.backward()

        def adam():
            if own_sgd is not None:  # the own SGD steps' branch, where they ran beside a grad phase
                own_sgd.join()
            # one launch: the gradient norm and clip, the update with the target's (lr, the bias
            # corrections and tau: the schedules, joined by the learn phases) and the publish of the
            # loss and gradient norm (self.grad_norm, Adam's grad_norm_out) to the host ring
            if self.cfg.run.grid_barrier:
                self.adam.clip_update_publish(
                    self.soft, self.readback.device, buf.loss, PUBLISH_SLOTS, apply=folded[0] if folded else None
                )
                return
            # the same bits in three launches, none waiting for all its blocks (run.grid_barrier)
            self.adam.clip_step()
            with buf.side_small.fork():  # the publish beside the update
                self.ops.publish(
                    self.readback.device, buf.loss, self.grad_norm, self.adam.scalars.view("step"), PUBLISH_SLOTS
                )
            self.adam.update_step(soft=self.soft)

        def extras_backward():
            # the extra heads' backward (their parameter gradients and their sum of dL/dpsi) on the branch
            # their losses joined (buffers.side_aux), once every loss phase is enqueued: beside the rule's
            # phases after the loss (homeostatic's, on buffers.side_qgrad), off the step's chain; the
            # backward joins it and adds the Q head's dL/dpsi (QNetwork.backward_extras)
            # forked from the extra heads' branch (after_extras), where the heads' losses joined side_aux: it
            # waits for them, not for the rule's phases on the main stream
            with buf.after_extras(), buf.side_aux.fork():
                self.online.backward_extras(buf.ws, self.batch_size, dpsi=self.extras_dpsi)
                for s in self.aux:  # work of theirs from that sum of dL/dpsi (Gradient Vaccine's)
                    s.beside_extras_backward()

        def priorities():
            # beside the backward pass and the optimiser: it reads the learn phases' priorities and
            # writes only the replay's tree, which nothing else in this step touches
            with self.side_priorities.fork():
                replay.update_priorities(buf.idx, buf.priority, device_rules=True)

        def spectral():
            # net.spectral: after the optimiser and the soft update moved the weights, one power
            # iteration and W_sn for each net, read by the next forwards (acting and learning)
            self.online.spectral_step()
            self.target.spectral_step()

        def publish():
            # after the optimiser (whose step counter names the ring slot the host marks) and every
            # producer: the statistics' branches are joined here (q_stats' own, where it ran beside)
            buf.side_qstats.join()
            buf.side_stats.join()
            self.stats.publish(self.adam.scalars.view("step"))

        early = [phase for s in self.aux for phase in s.early_phases()]  # branches beside the forward
        aux = [phase for s in self.aux for phase in s.phases()]
        sgd = [span for s in self.aux for span in s.sgd_spans()]  # their own SGD steps: one launch
        # the grad phases on the flat gradient, in agent.aux order (causal's folded into vaccine's where it
        # comes right before it: _grad_signals); the last of them that touch only a span of it no SGD span
        # lies in (and no parameter) may run beside the own SGD steps (the tail after the backward one node
        # shorter: docs/perf-notes.md, thirty-second session); the others before them
        grad = self._grad_signals()
        for i, sig in enumerate(grad):  # the first's phases see the gradient as the backward left it
            sig.first_after_backward(i == 0)
        folded = [a for a in (s.adam_apply() for s in self.aux) if a is not None]  # read when adam() runs
        if len(folded) > 1:
            raise ValueError("agent.aux: more than one signal folds its gradient correction into Adam's launch")
        beside = self._sgd_beside(sgd, grad)
        aux_grad = [phase for s in grad if s not in beside for phase in s.grad_phases()]
        aux_grad_beside = [phase for s in beside for phase in s.grad_phases()]
        own_sgd = None
        if sgd:  # beside: after the branches those phases join too (vaccine's backward reads parameters)
            after = [b for s in beside for b in s.grad_branches()]
            side = SideStream(self.xp) if beside else None
            own_sgd = AuxSgd(sgd, self.xp, side=side, after=after)
        aux_sgd = [("aux_sgd", own_sgd.step)] if sgd else []
        plan = [] if self.plan is None else [("plan", self.plan.phase)]
        cql = [("cql", self.rule.cql)] if self.cfg.agent.cql_alpha > 0 else []
        phases = [
            ("schedules", schedules),
            *([("fold", fold)] if self.side_fold is not None else []),
            ("sample", sample),
            *([("input_noise", input_noise)] if self.cfg.agent.input_noise > 0 else []),
            *early,
            ("forward", forward),
            ("q_stats", self.q_stats),
            *self.rule.learn_phases(),
            ("q_stats_join", self.q_stats_join),
            *cql,
            *plan,
            *aux,
            *([("extras_backward", extras_backward)] if self.extras_early else []),
            ("priorities", priorities),
            ("backward", backward),
            *aux_grad,
            *aux_sgd,
            *aux_grad_beside,
            ("adam", adam),
            *([("spectral", spectral)] if self.cfg.net.spectral else []),
            ("publish", publish),
        ]
        if self.side_fold is None:
            return phases
        return [(name, self._prefolded(fn)) for name, fn in phases]

    def _prefolded(self, fn):
        """The train phase ``fn`` with both nets' forwards reading the fold phase's folded weights
        (:meth:`cudarl.nn.QNetwork.prefolded_forwards`)."""

        def phase():
            with self.online.prefolded_forwards(), self.target.prefolded_forwards():
                fn()

        return phase

    def _grad_signals(self) -> list:
        """The signals whose grad phases run, in ``agent.aux`` order: a signal whose one grad phase only adds a
        gradient of its own (:meth:`AuxSignal.grad_addend`: causal's) right before one that takes it
        (:meth:`AuxSignal.takes_addend`: vaccine's, which then adds it in its own kernels) runs none."""
        out = []
        for s in (s for s in self.aux if s.grad_phases()):
            addend = out[-1].grad_addend() if out else None
            if addend is not None and s.takes_addend(addend):
                out[-1] = s
            else:
                out.append(s)
        return out

    def _sgd_beside(self, spans, signals) -> list:
        """The grad-phase ``signals`` the own SGD steps (``spans``) may run beside: the last of them, in order,
        that declare the span of the flat gradient they touch (:meth:`AuxSignal.grad_span`), where no SGD span's
        gradient lies in it (so the steps see every grad phase's effect on their spans, as after them: the
        grad phases before these touch no span of theirs either way); none where there is no span."""
        if not spans:
            return []
        grads = self.online.grads
        base, item = address(grads), grads.itemsize
        beside = []
        for s in reversed(signals):
            r = s.grad_span()
            if r is None:
                break
            lo, hi = base + r[0] * item, base + r[1] * item
            if any(address(sp.grads) < hi and lo < address(sp.grads) + sp.grads.size * item for sp in spans):
                break
            beside.insert(0, s)
        return beside

    # --- between two updates ------------------------------------------------------------------------
    def between_updates(self, step: int, stream=None) -> None:
        """Host-driven work after update ``step`` (outside any graph, ordered on ``stream``, no sync):
        PopArt's statistics freeze once ``agent.popart_warmup`` updates are done; every
        ``optim.shrink_every`` updates the online network is shrunk and perturbed."""
        warmup, o = self.cfg.agent.popart_warmup, self.cfg.optim
        if self._popart_live and warmup and step >= warmup:
            self.popart.freeze(stream)
            self._popart_live = False
        if o.shrink_every and step % o.shrink_every == 0:
            with stream if stream is not None else nullcontext():
                shrink_perturb(self.online.params, o.shrink, o.perturb, self.cfg.run.seed, step // o.shrink_every)
                self.online.spectral_step(iterate=False)  # W_sn of the new weights (net.spectral)

    # --- what the host reads ---------------------------------------------------------------------
    def q_values(self, obs, out) -> None:
        """Expected Q of the online network for ``obs [n, obs_dim]`` (n <= n_envs) into ``out [n, A]``."""
        self._act_ws_fresh = False  # its forward runs over the acting workspace
        self.rule.expected_q(out, obs)

    def eval_rows(self):
        """The online network's block Q for evaluation's host walk (:func:`cudarl.policy.row_exact_q`:
        many bar states a forward, each with the bits the walk defines as its Q), or None where there
        is none; made once (on the GPU it owns its buffers and workspace)."""
        if self._eval_rows is None:
            from .policy import row_exact_q

            self._eval_rows = (row_exact_q(self.online, self.rule.values),)
        return self._eval_rows[0]

    def eval_q_into(self, obs, out) -> None:
        """The values the online network acts on (``agent.act_by``'s measure) of ``obs [n, obs_dim]``, any
        ``n``, into ``out [n, A]``: through :meth:`eval_rows` where there is one (each row the bits the
        evaluation walk acts on), else the rule's values over a workspace of its own (made outside any capture
        at the first call of more rows than it has). :meth:`cudarl.policy.Policy.q_values_into` of these weights."""
        block = self.eval_rows()
        if block is not None:
            block.into(obs, out)
            return
        n = obs.shape[0]
        if self._eval_ws is None or self._eval_ws.max_batch < n:
            self._eval_ws = self.online.new_workspace(n)
        self.rule.values(out, obs, self._eval_ws)

    def plan_scale(self, obs, out) -> None:
        """The plan head's gate (``out [n]``) of the forward :meth:`q_values` just ran on ``obs`` (net.plan)."""
        gate(self.online, self.buffers.ws_act, obs.shape[0], out)

    def observables(self) -> dict:
        """The auxiliary signals' values for a metrics row (host reads: outside any capture)."""
        out = {}
        for s in self.aux:
            out.update(s.observable())
        return out

    def collected(self) -> None:
        """A collect step ran (the trainer replayed the collect graph): ``buffers.q_act`` and the acting
        workspace hold its act, which :meth:`acting_observables` reads."""
        self._acted = self._act_ws_fresh = True

    def acting_observables(self) -> dict:
        """The latest collect step's act, for a metrics row (host reads of ``buffers.q_act`` and the rule's
        :meth:`cudarl.rules.HeadRule.act_mean`, outside any capture; nothing is launched):

        * ``act.value``: the mean over the environments of ``max_a q_act``, the value ``agent.act_by``'s
          measure gives its greedy action (the expected Q with ``mean``; CVaR or mean - lambda std);
        * ``act.disagreement``: the share of environments whose greedy action by that measure is not the
          mean's (first maximum, as the act kernels; 0 with ``mean`` by definition); None where the
          mean is not at hand (IQN's CVaR; the acting workspace overwritten by :meth:`q_values` since
          the last collect step).

        Empty before any collect step (:meth:`collected`; an offline run never acts)."""
        if not self._acted:
            return {}
        q = to_numpy(self.buffers.q_act).astype(np.float64)
        out = {"act.value": float(q.max(axis=1).mean()), "act.disagreement": None}
        if self.cfg.agent.act_by == "mean":
            out["act.disagreement"] = 0.0
        elif self._act_ws_fresh and (mean := self.rule.act_mean()) is not None:
            out["act.disagreement"] = float(np.mean(mean.argmax(axis=1) != q.argmax(axis=1)))
        return out

    # --- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Host copies of the networks, optimiser, target update, device scalars, PopArt, the rule's and the
        auxiliary signals' own state (a checkpoint's ``agent``)."""
        s = {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "adam": self.adam.state_dict(),
            "soft": self.soft.state_dict(),
            "scalars": self.scalars.state_dict(),
        }
        if self.popart is not None:
            s["popart"] = self.popart.state_dict()
        rule = self.rule.state_dict()
        if rule:  # under the head's name (IQN's tau counter: "iqn", as checkpoints have always had it)
            s[self.cfg.net.head] = rule
        for sig in self.aux:
            st = sig.state_dict()
            if st:
                s[f"aux.{sig.name}"] = st
        return s

    def load_state_dict(self, s: dict) -> None:
        """Copy into the existing buffers (their addresses stay, so captured graphs stay valid)."""
        self.online.load_state_dict(s["online"])
        self.target.load_state_dict(s["target"])
        self.adam.load_state_dict(s["adam"])
        self.soft.load_state_dict(s["soft"])
        self.scalars.load_state_dict(s["scalars"])
        if self.popart is not None:
            self.popart.load_state_dict(s["popart"])
            self._popart_live = not self.popart.frozen
        self.rule.load_state_dict(s.get(self.cfg.net.head, {}))
        for sig in self.aux:
            sig.load_state_dict(s.get(f"aux.{sig.name}", {}))
