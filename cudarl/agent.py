"""The learner: online and target Q-networks, the optimiser, and the two steps as graph phases.

``Agent.collect_phases(env, replay)`` and ``Agent.train_phases(replay)`` return the named phases
that :class:`cudarl.graph.StepGraph` captures (GPU) or runs in order (NumPy)::

    collect: act (expected Q of the online net, device epsilon, epsilon-greedy)
             - env_step (record the transition, step, reset ended episodes) - replay_insert
    train:   schedules (lr and tau: a parallel branch, joined by loss) - sample (the search and
             the gather in one launch; the importance weights on that branch) -
             forward (C51: online s | online s' | target s', in parallel; IQN: online s and s' in
             one pass | target s') - C51: targets_loss (double DQN,
             projection, loss and dL/d(head output) in one launch); IQN: targets (quantile
             targets) - loss (+ gradient wrt the outputs) - priorities (a parallel
             branch to the end) - backward (dx chain | weight gradients, in parallel) - adam
             (one launch: the gradient norm and clip, the update with the target net's soft
             update and the publish of loss and gradient norm to the host ring; three launches
             with run.grid_barrier = false | IQN's counter)

On the GPU "in parallel" means a :class:`cudarl.graph.SideStream`: a branch of the captured graph
that runs beside the main chain (same kernels and inputs, so the same bits as one stream).

Every buffer is allocated here, before any capture. The math is in :mod:`cudarl.losses`; the
distributional rule of each head is a small object in :data:`HEAD_RULES` (a registry, not an
if/elif chain). On the NumPy backend the loss functions return new arrays, which
:func:`_into` copies into the same buffers the GPU path writes in place, so both backends run
one program.
"""

from __future__ import annotations

import numpy as np

from . import losses
from .backend import family, is_numpy
from .config import Config
from .nn import QNetwork
from .optim import Adam, Schedule, SoftUpdate
from .pinned import DeviceScalars, PinnedReadback

#: Pinned ring slots of (loss, grad_norm): the graph writes step t while the host reads t - 1.
PUBLISH_SLOTS = 2


def _into(dst, src) -> None:
    """Copy ``src`` into ``dst`` unless the op already wrote ``dst`` in place (the GPU path)."""
    if src is not dst:
        dst[...] = src


def _grad_out(agent, raw: bool):
    agent.ws.set_batch(agent.batch_size)
    return agent.online.grad_outputs(agent.ws, raw_head=raw)["q"]


class C51Rule:
    """Categorical DQN (Bellemare et al. 2017) with double-DQN action selection."""

    def __init__(self, agent: Agent):
        a, xp, B, K = agent, agent.xp, agent.batch_size, agent.cfg.net.atoms
        self.support = xp.asarray(np.linspace(a.cfg.net.v_min, a.cfg.net.v_max, K, dtype=np.float32))
        # the targets-and-loss launch's buffers; the loss, priorities and dL/dva are the agent's
        self.out = losses.C51TargetsLoss.empty(
            xp,
            B,
            agent.online.head.n_actions,
            K,
            popart=a.cfg.agent.popart,
            loss_per=agent.loss_per,
            loss=agent.loss,
            priority=agent.priority,
            dva=_grad_out(agent, raw=True),
        )
        self.target = self.out.target
        n = a.n_envs
        self.act_ent = xp.zeros(n, np.float32)
        self.act_mass = xp.zeros((n, K), np.float32)

    def expected_q(self, agent: Agent, out, obs) -> None:
        logits = agent.online.forward(obs, agent.ws_act)["q"]
        qstats = family("qstats", agent.xp)
        if is_numpy(agent.xp):
            _into(out, qstats.per_sample(logits, self.support)[0])
        else:
            n = obs.shape[0]
            qstats.per_sample(logits, self.support, out, self.act_ent[:n], self.act_mass[:n])

    def act(self, agent: Agent, env, eps_args) -> None:
        """The collect step's act: the online forward over ``env.obs``, then one kernel for the
        expected Q (``agent.q_act``), the device epsilon and the epsilon-greedy ``env.actions``."""
        logits = agent.online.forward(env.obs, agent.ws_act)["q"]
        agent.ops.act_c51(env.actions, agent.q_act, logits, self.support, env.state.count, env.params, *eps_args)

    #: The network's backward starts from dL/dva, the head's output before the dueling combine.
    raw_head = True
    #: The online net sees s and s' as two B-row passes on parallel branches (see forward).
    pair_forward = False

    def forward(self, agent: Agent, batch) -> None:
        # the head's raw outputs va [B, (1 + A) K]: targets_loss combines them itself. Three forwards
        # of B rows side by side: the target net at s' and the online net at s' on branches, the
        # online net at s (the backward's) on the chain; one 2B-row pass of the online net was a
        # longer chain (8.4 against 7.1 us a 256-wide layer, tools/bench_gemm.py on an H200)
        with agent.side.fork():  # its own weights and workspace
            self.va_target_next = agent.target.forward(batch.next_obs, agent.target.ws, raw_head=True)["q"]
        with agent.side_next.fork():  # its own workspace; reads the same weights
            self.va_online_next = agent.online.forward(batch.next_obs, agent.ws_next, raw_head=True)["q"]
        self.va = agent.online.forward(batch.obs, agent.ws, raw_head=True)["q"]

    def targets_loss(self, agent: Agent, batch, weights) -> None:
        """The target distribution and the loss in one launch (losses.c51_targets_loss), writing
        dL/dva for the backward. With PopArt: y = r + d (s E[z] + mu) in return space; the
        statistics move with y, then the rewards are mapped into the support's coordinates with
        them, (r - (1 - d) mu) / s (see cudarl.popart)."""
        agent.side.join()  # the target net's forward
        agent.side_next.join()  # the online net's at s'
        pa = agent.popart
        popart = (
            {}
            if pa is None
            else dict(popart_state=pa.state, popart_beta=pa.scalars.view("beta"), sigma_min=pa.sigma_min)
        )
        losses.c51_targets_loss(
            self.va,
            self.va_online_next,
            self.va_target_next,
            batch.action,
            weights,
            self.support,
            batch.ret,
            batch.discount,
            agent.cfg.agent.priority,
            **popart,
            out=self.out,
            grid_barrier=agent.cfg.run.grid_barrier,
        )


class IQNRule:
    """Implicit quantile networks (Dabney et al. 2018): quantile Huber loss, double-DQN targets."""

    raw_head = False
    #: The online net sees s and s' in one 2B-row pass (their taus drawn together).
    pair_forward = True

    def __init__(self, agent: Agent):
        xp, B, N = agent.xp, agent.batch_size, agent.cfg.net.n_quantiles
        self.targets_out = losses.QuantileTargets.empty(xp, B, N)
        self.target = self.targets_out.target
        self.loss_out = losses.QuantileLoss.empty(
            xp,
            B,
            N,
            agent.online.head.n_actions,
            loss_per=agent.priority,
            loss=agent.loss,
            grad=_grad_out(agent, raw=False),
        )
        self.r_norm = xp.zeros(B, np.float32)
        self.support = None
        # Philox counters of the taus (online s, online s', target s', acting), advanced per step.
        self.counters = DeviceScalars({"tau": np.int64}, xp)

    def _taus(self, agent, net, ws, B, stream_id):
        return net.head.sample_tau(ws, B, self.counters.view("tau").view(np.uint64), agent.cfg.run.seed, stream_id)

    def expected_q(self, agent: Agent, out, obs) -> None:
        self._taus(agent, agent.online, agent.ws_act, obs.shape[0], 0x1A3)
        theta = agent.online.forward(obs, agent.ws_act)["q"]
        family("agent", agent.xp).quantile_mean(out, theta)

    def act(self, agent: Agent, env, eps_args) -> None:
        """:meth:`C51Rule.act` for quantiles: taus, the forward, then one kernel (``act_iqn``)."""
        self._taus(agent, agent.online, agent.ws_act, env.obs.shape[0], 0x1A3)
        theta = agent.online.forward(env.obs, agent.ws_act)["q"]
        agent.ops.act_iqn(env.actions, agent.q_act, theta, env.state.count, env.params, *eps_args)

    def forward(self, agent: Agent, batch) -> None:
        B = agent.batch_size
        with agent.side.fork():  # the target net runs beside the online net (its own taus and workspace)
            self._taus(agent, agent.target, agent.target.ws, B, 0x1A2)
            self.target_next = agent.target.forward(batch.next_obs, agent.target.ws)["q"]
        taus = self._taus(agent, agent.online, agent.ws, 2 * B, 0x1A0)  # s and s' in one pass
        self.taus = taus[:B]
        both = agent.online.forward(agent.pair, agent.ws)["q"]  # [2B, N, A]
        self.theta, self.online_next = both[:B], both[B:]

    def targets(self, agent: Agent, batch) -> None:
        agent.side.join()  # the target net's forward
        ret = batch.ret
        if agent.popart is not None:
            # The statistics follow the n-step returns (the scale of the rewards); quantiles then
            # live in normalised units: T = (r - (1 - d) mu) / s + d theta'.
            _into(
                self.r_norm,
                agent.popart.update_normalize_rewards(batch.ret, batch.ret, batch.discount, out=self.r_norm),
            )
            ret = self.r_norm
        losses.quantile_targets(self.online_next, self.target_next, ret, batch.discount, out=self.targets_out)

    def loss(self, agent: Agent, batch, weights) -> None:
        # the per-sample loss is the priority signal: written straight into agent.priority (one launch)
        losses.quantile_huber_loss(
            self.theta, batch.action, self.target, self.taus, weights, agent.cfg.agent.kappa, out=self.loss_out
        )

    def advance(self, agent: Agent) -> None:
        family("util", agent.xp).add_i64(self.counters.view("tau"), 1)


#: Distributional rules by ``net.head``.
HEAD_RULES = {"c51": C51Rule, "iqn": IQNRule}


class Agent:
    """Networks, optimiser, target update and the step buffers of one run.

    Args:
        cfg: the run's :class:`cudarl.config.Config`.
        obs_dim: observation width (features + the env's position features).
        n_actions: actions of the env.
        n_envs: environments acting together (rows of the acting forward pass).
        xp: ``numpy`` or ``cupy``.
    """

    def __init__(self, cfg: Config, obs_dim: int, n_actions: int, n_envs: int, xp):
        self.cfg, self.xp, self.n_envs = cfg, xp, int(n_envs)
        self.batch_size = B = cfg.agent.batch_size
        net_kw = dict(
            hidden=cfg.net.hidden,
            head=cfg.net.head,
            layernorm=cfg.net.layernorm,
            atoms=cfg.net.atoms,
            n_quantiles=cfg.net.n_quantiles,
            n_cos=cfg.net.n_cos,
            xp=xp,
            seed=cfg.run.seed,
            tf32=cfg.net.tf32,
            gemm=cfg.net.gemm,
        )
        # IQN's online net sees s and s' of a batch in one forward pass of 2B rows; C51's runs s and
        # s' as two B-row passes side by side (C51Rule.forward). The backward runs over the s rows.
        pair = HEAD_RULES[cfg.net.head].pair_forward
        self.online = QNetwork(obs_dim, n_actions, max_batch=2 * B if pair else B, **net_kw)
        self.online.prepare_backward(B)  # the backward runs over the s half
        self.target = QNetwork(obs_dim, n_actions, max_batch=B, **net_kw)
        self.target.params[...] = self.online.params
        self.ws = self.online.ws
        # the online net at s' on a branch beside ws's forward (C51; IQN's pass covers both in ws)
        self.ws_next = None if pair else self.online.new_workspace(B)
        self.ws_act = self.online.new_workspace(self.n_envs)
        from .replay import Batch

        self.pair = xp.zeros((2 * B, obs_dim), np.float32)
        #: The fixed batch buffers the replay gathers into: obs and next_obs are halves of ``pair``.
        self.batch = Batch(
            self.pair[:B], self.pair[B:], xp.zeros(B, np.int32), xp.zeros(B, np.float32), xp.zeros(B, np.float32)
        )
        o = cfg.optim
        self.readback = PinnedReadback(2, np.float32, xp, slots=PUBLISH_SLOTS)
        self.loss = xp.zeros(1, np.float32)
        self.loss_per = xp.zeros(B, np.float32)
        self.priority = xp.zeros(B, np.float32)
        self.grad_norm = xp.zeros(1, np.float32)
        self.adam = Adam(
            self.online.params,
            self.online.grads,
            schedule=Schedule.from_config(o),
            betas=(o.beta1, o.beta2),
            eps=o.eps,
            weight_decay=o.weight_decay,
            decay_mask=self.online.layout.decay_mask(),
            max_grad_norm=o.max_grad_norm,
            grad_norm_out=self.grad_norm,
            xp=xp,
        )
        a = cfg.agent
        self.soft = SoftUpdate(self.target.params, self.online.params, a.tau_start, a.tau_end, a.tau_period, xp=xp)
        self.scalars = DeviceScalars(
            {"gamma": np.float32, "epsilon": np.float32, "collect_steps": np.int64},
            xp,
            initial={"gamma": a.gamma, "epsilon": a.eps_start},
        )
        self.q_act = xp.zeros((self.n_envs, n_actions), np.float32)
        self.popart = None
        self.rule = HEAD_RULES[cfg.net.head](self)
        if a.popart:
            from .popart import PopArt

            # C51: n_sigma standard deviations of return span half the support; IQN: unit scale
            self.popart = (
                PopArt.for_support(self.rule.support, beta=a.popart_beta, xp=xp)
                if self.rule.support is not None
                else PopArt(beta=a.popart_beta, xp=xp)
            )
        self.ops = family("agent", xp)
        # Parallel branches of the train graph (cudarl.graph.SideStream; no-ops on NumPy): the target
        # net's forward on one, the priority update on another, the online net's forward at s' (C51)
        # on a third, and the ones below.
        from .graph import SideStream

        self.side, self.side_priorities, self.side_next = SideStream(xp), SideStream(xp), SideStream(xp)
        #: one branch per layer for its weight gradients: the layers' dW GEMMs (each with its bias
        #: column sums) run beside each other and beside the dx chain, not one after another
        self.grad_sides = [SideStream(xp) for _ in self.online.linears]
        #: small kernels nothing on the chain waits for at once: the schedules (lr, tau), the replay's
        #: importance weights (joined by the loss) and IQN's counter (beside Adam's update); each is a
        #: graph node of ~1 us or more on the chain otherwise (tools/profile_step.py)
        self.side_small = SideStream(xp)
        self.online.set_side_stream(self.grad_sides)

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
            self.rule.act(self, env, eps_args)

        def env_step():
            env.record(transitions)
            env.step()
            self.ops.discount(discount, transitions.done, self.scalars.view("gamma"))

        def replay_insert():
            if replay.spec.store_next_obs:
                replay.add(
                    transitions.obs, transitions.action, transitions.reward, discount, next_obs=transitions.next_obs
                )
            else:
                replay.add(transitions.obs, transitions.action, transitions.reward, discount)

        return [("act", act), ("env_step", env_step), ("replay_insert", replay_insert)]

    # --- train ---------------------------------------------------------------------------------
    def grad_q(self):
        """The buffer the loss writes dL/d(output of the s half) into: C51 dL/dva ``[B, (1 + A) K]``
        (the head's raw output, see :meth:`C51Rule.targets_loss`), IQN ``[B, N, A]``."""
        self.ws.set_batch(self.batch_size)
        return self.online.grad_outputs(self.ws, raw_head=self.rule.raw_head)["q"]

    def backward(self) -> None:
        """Gradients of the online net from the s half of the last forward pass."""
        self.ws.set_batch(self.batch_size)
        self.online.backward(self.batch.obs, self.ws, raw_head=self.rule.raw_head)
        for side in self.grad_sides:  # the weight gradients, before anything reads them
            side.join()

    def train_phases(self, replay) -> list:
        """Phases of one learner update from ``replay`` into the fixed :attr:`batch` buffers."""
        B, batch = self.batch_size, self.batch
        state = {}

        def schedules():
            # nothing reads lr, the bias corrections or tau before the loss phase joins this branch
            with self.side_small.fork():
                self.adam.schedule_step()
                self.soft.schedule_step()

        def sample():
            # the rows gathered into the batch by the search's launch; the importance weights beside
            # the forward (the loss joins them)
            state["idx"], state["w"] = replay.sample(B, side=self.side_small, out=batch)

        def forward():
            self.rule.forward(self, batch)

        def targets():
            self.rule.targets(self, batch)

        def loss():
            self.side_small.join()  # the importance weights (and the schedules, forked first)
            self.rule.loss(self, batch, state["w"])

        def targets_loss():
            self.side_small.join()  # the importance weights (and the schedules, forked first)
            self.rule.targets_loss(self, batch, state["w"])

        # C51: one launch for both (cudarl_c51_targets_loss); IQN: a targets and a loss phase
        learn = (
            [("targets_loss", targets_loss)]
            if hasattr(self.rule, "targets_loss")
            else [("targets", targets), ("loss", loss)]
        )

        def backward():
            self.backward()

        def adam():
            # the head's counter beside the update (it reads nothing of it)
            if hasattr(self.rule, "advance"):
                with self.side_small.fork():
                    self.rule.advance(self)
            # one launch: the gradient norm and clip, the update with the target's (lr, the bias
            # corrections and tau: the schedules, joined by the loss phase) and the publish of the
            # loss and gradient norm (self.grad_norm, Adam's grad_norm_out) to the host ring
            if self.cfg.run.grid_barrier:
                self.adam.clip_update_publish(self.soft, self.readback.device, self.loss, PUBLISH_SLOTS)
                return
            # the same bits in three launches, none waiting for all its blocks (run.grid_barrier)
            self.adam.clip_step()
            with self.side_small.fork():  # the publish beside the update
                self.ops.publish(
                    self.readback.device, self.loss, self.grad_norm, self.adam.scalars.view("step"), PUBLISH_SLOTS
                )
            self.adam.update_step(soft=self.soft)

        def priorities():
            # beside the backward pass and the optimiser: it reads the loss phase's priorities and
            # writes only the replay's tree, which nothing else in this step touches
            with self.side_priorities.fork():
                replay.update_priorities(state["idx"], self.priority, device_rules=True)

        return [
            ("schedules", schedules),
            ("sample", sample),
            ("forward", forward),
            *learn,
            ("priorities", priorities),
            ("backward", backward),
            ("adam", adam),
        ]

    # --- greedy action values for evaluation -----------------------------------------------------
    def q_values(self, obs, out) -> None:
        """Expected Q of the online network for ``obs [n, obs_dim]`` (n <= n_envs) into ``out [n, A]``."""
        self.rule.expected_q(self, out, obs)

    # --- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        s = {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "adam": self.adam.state_dict(),
            "soft": self.soft.state_dict(),
            "scalars": self.scalars.state_dict(),
        }
        if self.popart is not None:
            s["popart"] = self.popart.state_dict()
        if isinstance(self.rule, IQNRule):
            s["iqn"] = self.rule.counters.state_dict()
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
        if isinstance(self.rule, IQNRule):
            self.rule.counters.load_state_dict(s["iqn"])
