"""``c51``: categorical DQN (Bellemare et al. 2017) with double-DQN selection and the dueling head."""

from __future__ import annotations

import numpy as np

from .. import losses
from ..backend import family, to_numpy
from ..nn.heads import C51Head
from ..popart import targets_loss_kwargs
from .base import LearnerBuffers, Phase, RuleBase, acting_risk


def support(net) -> np.ndarray:
    """The fixed atoms ``z`` float32 ``[atoms]`` from ``v_min`` to ``v_max`` (``net``: a NetConfig)."""
    return np.linspace(net.v_min, net.v_max, net.atoms, dtype=np.float32)


class C51Values:
    """What a C51 network acts and evaluates by, into ``out [n, A]``: ``values(out, obs, ws)``. With
    ``agent.act_by = "mean"`` the expected Q ``Q[i, a] = sum_k softmax(logits[i, a])_k z_k``
    (``qstats.expected_q``: the act kernel's bits, and nothing else computed); otherwise the risk measure
    of ``agent.act_by`` (``agent.c51_risk``: CVaR or mean - lambda std, ``act_c51_risk``'s bits)."""

    def __init__(self, net, cfg):
        self.net = net
        self.support = net.xp.asarray(support(cfg.net))
        self.risk = acting_risk(cfg)
        self.agent_ops = family("agent", net.xp)

    def __call__(self, out, obs, ws) -> None:
        self.of_logits(self.net.forward(obs, ws, heads=self.net.acting_heads)["q"], out)

    def of_logits(self, logits, out) -> None:
        """The values of the head's ``logits [n, A, K]`` into ``out [n, A]``."""
        if self.risk[0] == 0:
            losses.expected_q(logits, self.support, out)
        else:
            self.agent_ops.c51_risk(out, logits, self.support, *self.risk)


class C51Rule(RuleBase):
    """Categorical DQN over the dueling head's logits ``[B, A, atoms]``.

    Train step: the forward runs the online net at s (on the chain) and at s' and the target net at
    s' (two branches; only the forward at s runs the extra heads), keeping the head's raw output
    ``va [B, (1 + A) K]``; its one learn phase,
    ``targets_loss``, is one launch (:func:`cudarl.losses.c51_targets_loss`): the double-DQN target
    (with PopArt: return-space targets, statistics update, normalised rewards), the projection, the
    loss, the priorities and dL/dva, which the backward starts from.
    """

    @classmethod
    def make_head(cls, name: str, d: int, n_actions: int, net) -> C51Head:
        return C51Head(name, d, n_actions, net.atoms, tf32=net.tf32, gemm=net.gemm)

    @classmethod
    def popart_scale(cls, net, n_sigma: float = 3.0) -> float:
        """``n_sigma`` standard deviations of return span half the support (as ``PopArt.for_support``)."""
        z = support(net).astype(np.float64)
        return float(z[-1] - z[0]) / 2 / n_sigma

    @classmethod
    def greedy_values(cls, net, cfg, counters=None) -> C51Values:
        return C51Values(net, cfg)

    def __init__(self, buf: LearnerBuffers):
        xp, B, K = buf.xp, buf.batch_size, buf.cfg.net.atoms
        self.buf = buf
        self.support = xp.asarray(support(buf.cfg.net))
        # the online net at s' runs on a branch beside its forward at s: a workspace of its own (its
        # forward runs no extra heads, so none are branched)
        self.ws_next = buf.online.new_workspace(B)
        # the targets-and-loss launch's buffers; the loss, priorities and dL/dva are the buffers'
        self.out = losses.C51TargetsLoss.empty(
            xp,
            B,
            buf.n_actions,
            K,
            popart=buf.popart is not None,
            loss_per=buf.loss_per,
            loss=buf.loss,
            priority=buf.priority,
            dva=buf.train_grad(raw=True),
        )
        self.values = self.greedy_values(buf.online, buf.cfg)
        self.va = self.va_online_next = self.va_target_next = None  # the forward's outputs (workspace views)
        # the logits at s (the dueling combine of va) and the Q statistics' rows: q_stats writes them
        self.logits_s = None
        self.qs = losses.QStats.empty(xp, B, buf.n_actions, K, stats=buf.stats.view("q"), q=buf.q_s)
        # CQL (agent.cql_alpha): its dL/dlogits in the head's logits-gradient buffer, which the raw
        # backward does not use, then added into dL/dva through the dueling backward
        self.cql_out = None
        if buf.cfg.agent.cql_alpha > 0:
            head = buf.online.head
            dlogits = buf.ws.rows(head.grad_name, B)
            self.cql_out = losses.CQL.empty(xp, dlogits.shape, grad=dlogits, loss=buf.stats.view("cql"))
        self.agent_ops = family("agent", xp)
        self.nn_ops = family("nn", xp)

    def expected_q(self, out, obs) -> None:
        self.values(out, obs, self.buf.ws_act)

    def act(self, env, eps_args: tuple) -> None:
        """The online forward over ``env.obs`` up to the head's raw output, then one kernel: the dueling
        combine, expected Q (``buffers.q_act``), the device epsilon and the epsilon-greedy ``env.actions``
        (``act_c51_dueling``; the dueling kernel then ``act_c51`` is its oracle). With ``agent.act_by``
        the forward's logits and ``act_c51_risk``: its risk measure in place of the expected Q."""
        buf, risk = self.buf, self.values.risk
        heads = buf.online.acting_heads  # the plan head's gate (net.plan) reads this forward
        if risk[0] == 0:
            va = buf.online.forward(env.obs, buf.ws_act, raw_head=True, heads=heads)["q"]
            args = (env.actions, buf.q_act, va, self.support, env.state.count, env.seed)
            self.agent_ops.act_c51_dueling(*args, *eps_args)
        else:
            logits = self.act_out = buf.online.forward(env.obs, buf.ws_act, heads=heads)["q"]
            args = (env.actions, buf.q_act, logits, self.support, env.state.count, env.seed, *risk)
            self.agent_ops.act_c51_risk(*args, *eps_args)

    def act_mean(self):
        """The expected Q ``sum_k softmax(logits)_k z_k`` of the risk act's logits, in float64 (None with
        ``agent.act_by = "mean"``: its act keeps only ``va`` and ``buffers.q_act`` is the mean)."""
        if self.act_out is None:
            return None
        x = to_numpy(self.act_out).astype(np.float64)
        p = np.exp(x - x.max(axis=-1, keepdims=True))
        return (p / p.sum(axis=-1, keepdims=True)) @ to_numpy(self.support).astype(np.float64)

    def forward(self, batch) -> None:
        # the head's raw outputs va [B, (1 + A) K]: targets_loss combines them itself. Three forwards
        # of B rows side by side: the target net at s' and the online net at s' on branches, the
        # online net at s (the backward's) on the chain; one 2B-row pass of the online net was a
        # longer chain (8.4 against 7.1 us a 256-wide layer, tools/bench_gemm.py on an H200). Only the
        # forward at s runs the extra heads: the losses and the backward read them there, nothing at s'
        buf = self.buf
        with buf.side.fork():  # its own weights and workspace
            self.va_target_next = buf.target.forward(batch.next_obs, buf.target.ws, raw_head=True, heads="none")["q"]
        with buf.side_next.fork():  # its own workspace; reads the same weights
            self.va_online_next = buf.online.forward(batch.next_obs, self.ws_next, raw_head=True, heads="none")["q"]
        self.va = buf.online.forward(batch.obs, buf.ws, raw_head=True, heads="all")["q"]

    def learn_phases(self) -> list[Phase]:
        return [("targets_loss", self._targets_loss)]

    def cql(self) -> None:
        buf = self.buf
        losses.cql_c51(self.logits_s, buf.batch.action, self.support, buf.cfg.agent.cql_alpha, out=self.cql_out)
        self.nn_ops.dueling_backward(self.cql_out.grad, buf.train_grad(raw=True), accumulate=True)

    def q_stats(self) -> None:
        buf = self.buf
        self.logits_s = buf.online.head.logits_of(self.va, buf.ws)
        losses.q_stats_rows(self.logits_s, self.support, self.qs)
        with buf.side_stats.fork():  # the reduction (A + 2 blocks): beside the backward and the optimiser
            losses.q_stats_reduce(self.qs)

    def _targets_loss(self) -> None:
        """The target distribution and the loss in one launch, writing dL/dva for the backward. With
        PopArt: y = r + d (s E[z] + mu) in return space; the statistics move with y, then the rewards
        are mapped into the support's coordinates with them, (r - (1 - d) mu) / s (see cudarl.popart)."""
        buf, batch, cfg = self.buf, self.buf.batch, self.buf.cfg
        weights = buf.importance_weights()
        buf.side.join()  # the target net's forward
        buf.side_next.join()  # the online net's at s'
        popart = targets_loss_kwargs(buf.popart)
        losses.c51_targets_loss(
            self.va,
            self.va_online_next,
            self.va_target_next,
            batch.action,
            weights,
            self.support,
            batch.ret,
            batch.discount,
            cfg.agent.priority,
            **popart,
            out=self.out,
            grid_barrier=cfg.run.grid_barrier,
        )
