"""What the quantile heads (IQN, QR-DQN) share: quantile values ``[B, N, A]``, double-DQN quantile
targets, the quantile Huber loss, and acting on the quantile mean."""

from __future__ import annotations

import numpy as np

from .. import losses
from ..backend import family, to_numpy
from .base import LearnerBuffers, Phase, RuleBase, acting_risk


class QuantileValues:
    """What a quantile network acts and evaluates by, into ``out [n, A]``: ``values(out, obs, ws)``.
    ``draw_taus(ws, n)`` first writes the quantile fractions of the forward (IQN's acting taus), or is
    None (fixed fractions). ``agent.act_by``: ``mean``, the mean over the quantiles (``quantile_mean``);
    ``cvar`` with drawn fractions (IQN), the mean over quantiles at fractions mapped into ``[0, alpha)``
    (``cvar_taus``: Dabney et al. 2018's distortion), with fixed ones (QR-DQN) ``quantile_risk``'s CVaR
    over them; ``mean_std``, ``quantile_risk``'s mean - lambda std of the N values."""

    def __init__(self, net, cfg, draw_taus=None):
        self.net, self.draw_taus = net, draw_taus
        self.agent_ops = family("agent", net.xp)
        mode, alpha, lam = self.risk = acting_risk(cfg)
        #: IQN's CVaR distorts its fractions and then takes the mean (mode 0 on the quantiles)
        self.distort = alpha if mode == 1 and draw_taus is not None else None
        self.head_risk = (0, alpha, lam) if self.distort is not None else self.risk

    def __call__(self, out, obs, ws) -> None:
        self.draw(ws, obs.shape[0])
        self.of_quantiles(self.net.forward(obs, ws, heads=self.net.acting_heads)["q"], out)

    def draw(self, ws, n: int) -> None:
        """The acting forward's fractions into ``ws`` (IQN; with CVaR mapped into ``[0, alpha)``)."""
        if self.draw_taus is not None:
            tau = self.draw_taus(ws, n)
            if self.distort is not None:
                self.agent_ops.cvar_taus(tau, self.distort)

    def of_quantiles(self, theta, out) -> None:
        """The values of quantiles ``theta [n, N, A]`` (after :meth:`draw`) into ``out [n, A]``."""
        if self.head_risk[0] == 0:
            self.agent_ops.quantile_mean(out, theta)
        else:
            self.agent_ops.quantile_risk(out, theta, *self.head_risk)


class QuantileRule(RuleBase):
    """A rule over quantile values ``theta [B, N, A]`` (:class:`IQNRule`, :class:`QRDQNRule`).

    Train step: with PopArt the forward phase first moves the statistics with the batch's n-step
    returns and rescales the last layer (``head.out``) of the online and the target net so their
    unnormalised outputs ``s theta + mu`` are what they were (van Hasselt et al. 2016: the
    output-preserving half; :meth:`popart_step`). Then the online net sees s and s' in one forward
    pass of 2B rows (the batch's ``obs`` and ``next_obs`` are the halves of ``buffers.pair``; the
    backward covers the s half; the extra heads run over both halves, as one pass), the target net s'
    on a branch (no extra heads). Learn phases: ``targets``
    (double-DQN quantile targets, with PopArt on rewards normalised by the new statistics,
    (r - (1 - d) mu) / s, and both nets' quantiles in the same new coordinates) and ``loss`` (the
    quantile Huber loss, whose per-sample values are the priorities). Subclasses say where the
    quantile fractions come from (:meth:`draw_taus`, :meth:`loss_taus`).
    """

    @classmethod
    def popart_scale(cls, net) -> float:
        return 1.0  # quantiles of unit scale

    @classmethod
    def acting_taus(cls, net, cfg, counters):
        """``draw(ws, n)`` writing the acting forward's quantile fractions, or None (fixed fractions)."""
        return None

    @classmethod
    def greedy_values(cls, net, cfg, counters=None) -> QuantileValues:
        return QuantileValues(net, cfg, cls.acting_taus(net, cfg, counters))

    def __init__(self, buf: LearnerBuffers):
        xp, B, N, A = buf.xp, buf.batch_size, buf.cfg.net.n_quantiles, buf.n_actions
        self.buf = buf
        # s and s' in one pass of 2B rows; the backward runs over the s half
        buf.ws = buf.step_workspace(buf.online, 2 * B)
        self.targets_out = losses.QuantileTargets.empty(xp, B, N)
        # the per-sample loss is the priority signal: written straight into buffers.priority (one launch)
        self.loss_out = losses.QuantileLoss.empty(
            xp, B, N, A, loss_per=buf.priority, loss=buf.loss, grad=buf.train_grad()
        )
        self.r_norm = xp.zeros(B, np.float32)
        self.cql_out = None  # agent.cql_alpha: its gradient added into the loss's dL/dtheta
        if buf.cfg.agent.cql_alpha > 0:
            grad = buf.train_grad()
            self.cql_out = losses.CQL.empty(xp, grad.shape, grad=grad, loss=buf.stats.view("cql"))
        self.theta = self.online_next = self.target_next = None  # the forward's outputs (workspace views)
        self.agent_ops = family("agent", xp)
        self.values = None  # greedy_values: made by the subclass, once its counters exist

    # --- what IQN and QR-DQN do differently ------------------------------------------------------
    def draw_taus(self, net, ws, rows: int, stream_id: int) -> None:
        """Write the quantile fractions of a forward of ``rows`` samples over ``ws`` (none: fixed)."""

    def loss_taus(self):
        """The fractions of the online quantiles at s: float32 ``[B, N]`` or ``[N]``."""
        raise NotImplementedError

    # --- the rule ---------------------------------------------------------------------------------
    def expected_q(self, out, obs) -> None:
        self.values(out, obs, self.buf.ws_act)

    def act(self, env, eps_args: tuple) -> None:
        """The online forward over ``env.obs``, then one kernel (``act_iqn``): the quantile mean into
        ``buffers.q_act``, the device epsilon and the epsilon-greedy ``env.actions``. With
        ``agent.act_by``: :class:`QuantileValues`' fractions and measure (``act_quantile_risk``)."""
        buf, values = self.buf, self.values
        values.draw(buf.ws_act, env.obs.shape[0])
        # the plan head's gate (net.plan) reads this forward: the acting heads, no others
        theta = buf.online.forward(env.obs, buf.ws_act, heads=buf.online.acting_heads)["q"]
        if values.head_risk[0] == 0:
            self.agent_ops.act_iqn(env.actions, buf.q_act, theta, env.state.count, env.seed, *eps_args)
        else:
            args = (env.actions, buf.q_act, theta, env.state.count, env.seed, *values.head_risk)
            self.agent_ops.act_quantile_risk(*args, *eps_args)
        # the quantiles of an undistorted risk act hold the mean (act_mean); IQN's CVaR ones do not
        self.act_out = theta if values.risk[0] != 0 and values.distort is None else None

    def act_mean(self):
        """The mean over the risk act's quantiles (``quantile_mean`` in float64), or None (``agent.act_by =
        "mean"``; IQN's CVaR: its acting fractions lie in ``[0, alpha)``)."""
        return None if self.act_out is None else to_numpy(self.act_out).astype(np.float64).mean(axis=1)

    def popart_step(self) -> None:
        """PopArt's two halves before the forward: the statistics follow the batch's n-step returns
        (``r_norm`` = (r - (1 - d) mu) / s with the new ones, one launch), then each net's last layer
        is rescaled so its unnormalised output at fixed weights does not move (a no-op once the
        statistics are frozen, ``agent.popart_warmup``). A departure from van Hasselt et al. (2016), whose
        statistics track the targets ``Y = R + gamma^n (s theta' + mu)``: both halves must precede the
        forward (the loss's gradient flows through the rescaled weights) and ``Y`` needs the target net's
        forward, so they track ``R`` (docs/guide.md, PopArt). C51 tracks ``Y``."""
        buf, batch = self.buf, self.buf.batch
        buf.popart.update_normalize_rewards(batch.ret, batch.ret, batch.discount, out=self.r_norm)
        for net in (buf.online, buf.target):
            out = net.head.out.name
            buf.popart.rescale(net.P[f"{out}.weight"], net.P[f"{out}.bias"])

    def forward(self, batch) -> None:
        buf, B = self.buf, self.buf.batch_size
        if buf.popart is not None:
            self.popart_step()
        with buf.side.fork():  # the target net runs beside the online net (its own taus and workspace)
            self.draw_taus(buf.target, buf.target.ws, B, 0x1A2)
            self.target_next = buf.target.forward(batch.next_obs, buf.target.ws, heads="none")["q"]
        self.draw_taus(buf.online, buf.ws, 2 * B, 0x1A0)  # s and s' in one pass
        # every extra head: the losses and the backward read their s half (one pass: their s' half is
        # computed too, at the same GEMM shapes as always)
        both = buf.online.forward(buf.pair, buf.ws, heads="all")["q"]  # [2B, N, A]
        self.theta, self.online_next = both[:B], both[B:]

    def learn_phases(self) -> list[Phase]:
        return [("targets", self._targets), ("loss", self._loss)]

    def cql(self) -> None:
        buf = self.buf
        losses.cql_quantile(self.theta, buf.batch.action, buf.cfg.agent.cql_alpha, out=self.cql_out, accumulate=True)

    def q_stats(self) -> None:
        buf = self.buf
        self.agent_ops.quantile_mean(buf.q_s, self.theta)
        with buf.side_stats.fork():  # the reduction (A + 2 blocks): beside the backward and the optimiser
            losses.q_moments(buf.q_s, buf.stats.view("q"))

    def _targets(self) -> None:
        buf, batch = self.buf, self.buf.batch
        buf.side.join()  # the target net's forward
        # with PopArt the quantiles live in normalised units: T = (r - (1 - d) mu) / s + d theta'
        ret = batch.ret if buf.popart is None else self.r_norm
        losses.quantile_targets(self.online_next, self.target_next, ret, batch.discount, out=self.targets_out)

    def _loss(self) -> None:
        buf, batch = self.buf, self.buf.batch
        weights = buf.importance_weights()
        kappa = buf.cfg.agent.kappa
        target = self.targets_out.target
        losses.quantile_huber_loss(
            self.theta, batch.action, target, self.loss_taus(), weights, kappa, out=self.loss_out
        )


#: Philox stream id of the acting forward's taus (IQN).
ACT_STREAM = 0x1A3
