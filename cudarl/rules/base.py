"""The interface between the agent and a head's rule: :class:`HeadRule`, the :class:`LearnerBuffers` a
rule is given instead of the agent, and :class:`RuleBase`, what every rule shares."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Protocol

import numpy as np

from ..graph import SideStream

#: A graph phase: a name and a function of no arguments that launches on the current stream.
Phase = tuple[str, Callable[[], None]]


class LearnerBuffers:
    """What a head rule or an auxiliary signal may use: the networks, the fixed batch, the step's
    outputs and the side streams. Everything exists before any capture; the rule may replace
    :attr:`ws` (the workspace of the online forward at ``s`` the backward runs over) in ``allocate``.

    Attributes:
        cfg: the run's :class:`cudarl.config.Config`; xp: ``numpy`` or ``cupy``.
        batch_size, n_envs, n_actions: B, the acting rows, A.
        online, target: the :class:`cudarl.nn.QNetwork` pair; ws: see above (default ``online.ws``);
            ws_act: the acting workspace (``n_envs`` rows).
        pair, batch: float32 ``[2B, obs_dim]`` and the :class:`cudarl.replay.Batch` the replay gathers
            into, whose ``obs`` and ``next_obs`` are the two halves of ``pair``.
        loss: float32 ``[1]``, the step's loss (published to the host); loss_per, priority: float32
            ``[B]``, per-sample loss and the replay priority signal the rule writes.
        q_act: float32 ``[n_envs, A]``, the acting forward's expected Q.
        q_s: float32 ``[B, A]``, the expected Q of the online net at the batch's ``s`` (the rule's
            ``q_stats`` phase writes it; the plan head and the offline regularisers read it).
        stats: the :class:`cudarl.stats.StepStats` the step publishes (the rule writes its ``q``
            block: :func:`cudarl.reference.qstats.layout`).
        popart: the :class:`cudarl.popart.PopArt` when ``agent.popart``, else None.
        side, side_next, side_small, side_stats: :class:`cudarl.graph.SideStream` branches (the target
            net's forward; the online net's at ``s'``; small kernels nothing waits for at once; the
            statistics' reduction, joined by the step's last phase).
        feature_names: the feature matrix's column names (one bar of the window), or () when unknown.
        idx, weights: the sampled rows and their importance weights, set by the sample phase (fixed
            buffers of the replay); read the weights with :meth:`importance_weights`.
        rows: float32 ``[B, STATE_DIM]``, the state rows of the batch's ``s`` (their bar indices), or
            None; market: the :class:`cudarl.env.TradingEnv` the replay's rows come from, or None (the
            auxiliary signals that read future bars need both); side_aux: the auxiliary heads' loss
            branch, joined by the backward before it reads their heads' gradients (a signal's own loss
            branch joins into it: :meth:`aux_branch`; the agent's ``extras_backward`` runs on it);
            side_qgrad: the branch of the signals that add into the Q head's gradient (homeostatic's),
            joined by the backward; side_qstats: the ``q_stats`` phase's branch, beside the
            learn phases (:meth:`cudarl.agent.Agent.q_stats`).
    """

    def __init__(
        self, cfg, xp, online, target, batch, pair, n_envs: int, stats, popart=None, rows=None, market=None,
        feature_names=(),
    ):  # fmt: skip
        self.cfg, self.xp = cfg, xp
        self.feature_names = tuple(feature_names)
        self.batch_size, self.n_envs, self.n_actions = cfg.agent.batch_size, int(n_envs), online.n_actions
        self.online, self.target = online, target
        self.ws = online.ws
        self.ws_act = online.new_workspace(self.n_envs)
        self.pair, self.batch = pair, batch
        B = self.batch_size
        self.loss = xp.zeros(1, np.float32)
        self.loss_per = xp.zeros(B, np.float32)
        self.priority = xp.zeros(B, np.float32)
        self.q_act = xp.zeros((self.n_envs, self.n_actions), np.float32)
        self.q_s = xp.zeros((B, self.n_actions), np.float32)
        self.stats = stats
        self.popart = popart
        self.side, self.side_next, self.side_small = SideStream(xp), SideStream(xp), SideStream(xp)
        self.side_stats = SideStream(xp)
        self.side_aux = SideStream(xp)
        self.side_qgrad = SideStream(xp, gemms=False)
        self.side_qstats = SideStream(xp, gemms=False)  # the q_stats kernels launch no GEMM
        self.rows, self.market = rows, market
        self.idx = None
        self.weights = None

    def step_workspace(self, net, rows: int):
        """A workspace of ``rows`` for a forward of the train step (``net.new_workspace``) that runs extra
        heads, on a branch of their own (:meth:`cudarl.nn.QNetwork.branch_extras`): nothing in the step
        reads them before that branch is joined (the agent's ``q_stats_join`` phase for :attr:`ws`, the
        backward over the workspace for the others). A forward that runs none (``heads="none"``: the
        forwards at s') needs only ``net.new_workspace``."""
        ws = net.new_workspace(rows)
        net.branch_extras(ws)
        return ws

    @contextmanager
    def after_q_stats(self):
        """``with buffers.after_q_stats():`` the body enqueued on :attr:`side_qstats` (the agent's ``q_stats``
        branch, right after the forward at s), so that what it forks waits for ``q_s`` and what came before
        it, not for the rule's learn phases on the main stream since (causal's penalty, which reads ``q_s``
        and its own forward only; docs/perf-notes.md, thirty-second session; :meth:`SideStream.resume`)."""
        with self.side_qstats.resume():
            yield

    @contextmanager
    def after_extras(self):
        """``with buffers.after_extras():`` the body enqueued on the extra heads' branch of the forward at s
        (:attr:`ws`'s ``extras_side``, where it has one; else on the current stream), so that what it forks
        waits for those heads' outputs and what came before them, not for the rule's phases on the main
        stream since: the auxiliary heads' losses and the extra heads' backward read only those outputs,
        the batch and the parameters (docs/perf-notes.md, thirty-second session; :meth:`SideStream.resume`)."""
        side = self.ws.extras_side
        if side is None:
            yield
            return
        with side.resume():
            yield

    @contextmanager
    def aux_branch(self, side, q_grad: bool = False):
        """``with buffers.aux_branch(side):`` the body on ``side`` (a :class:`cudarl.graph.SideStream` of an
        auxiliary signal's own, forked from the current stream), which is then joined into
        :attr:`side_aux` (a loss that writes its extra head's output gradient, which the extra heads'
        backward reads there: the agent's ``extras_backward`` phase) or, with ``q_grad``, into
        :attr:`side_qgrad` (one that adds into the Q head's gradient, which only the step's backward
        reads). The backward joins both, and the signals' loss branches run beside each other."""
        with side.fork():
            yield
        with (self.side_qgrad if q_grad else self.side_aux).fork():
            side.join()

    def importance_weights(self):
        """The batch's importance weights, once the branch computing them (and the schedules, forked
        before it) is joined: call it in the first phase that reads them."""
        self.side_small.join()
        return self.weights

    def train_grad(self, raw: bool = False):
        """The buffer the loss writes dL/d(head output at s) into: ``online.grad_outputs(ws)["q"]`` over
        the first B rows of :attr:`ws` (``raw``: C51's dL/dva)."""
        self.ws.set_batch(self.batch_size)
        return self.online.grad_outputs(self.ws, raw_head=raw)["q"]


class HeadRule(Protocol):
    """The interface of a distributional head's rule (``net.head``). Every method launches on the
    current stream and allocates nothing after :meth:`allocate` (graph capture, DESIGN.md rule 9).

    Class-level (before the networks exist, or without an agent):
        make_head(name, d, n_actions, net) -> the :class:`cudarl.nn.heads.Head` on ``psi [B, d]``.
        popart_scale(net) -> support units per standard deviation of return for PopArt.
        greedy_values(net, cfg, counters) -> the values acting and evaluation choose by: the expected Q,
            or the risk measure of ``agent.act_by`` (:func:`acting_risk`).
    """

    @classmethod
    def make_head(cls, name: str, d: int, n_actions: int, net): ...

    @classmethod
    def popart_scale(cls, net) -> float: ...

    @classmethod
    def greedy_values(cls, net, cfg, counters=None):
        """``values(out, obs, ws)``: the expected Q (or ``agent.act_by``'s risk measure) of ``net``'s
        forward of ``obs [n, obs_dim]`` over the workspace ``ws`` into ``out [n, A]``. What
        :meth:`expected_q` runs, and what a policy file acts with (:class:`cudarl.policy.Policy`), so
        both give the same bits; of the extra heads the forward runs ``net.acting_heads`` (the plan
        head, whose gate is read after it). ``counters``: the rule's own
        device counters where acting draws from them (IQN's taus), else None."""

    @classmethod
    def allocate(cls, buffers: LearnerBuffers) -> HeadRule:
        """The rule with every buffer and workspace it uses, made from ``buffers`` (before any capture)."""

    def act(self, env, eps_args: tuple) -> None:
        """The collect step's act: the online forward over ``env.obs`` (``buffers.ws_act``; of the extra
        heads only ``online.acting_heads``, the plan head whose gate the agent reads next), then the
        expected Q (or ``agent.act_by``'s risk measure: :meth:`greedy_values`' bits) into
        ``buffers.q_act``, the device epsilon and the epsilon-greedy ``env.actions`` (``eps_args``:
        ``cudarl.ops.agent.act_*``'s schedule arguments)."""

    def act_mean(self):
        """Host float64 ``[n_envs, A]``: the mean of each action's return distribution as the latest
        :meth:`act` forward left it in ``buffers.ws_act``, or None where that forward does not hold it
        (``agent.act_by = "mean"``, where ``buffers.q_act`` is the mean; IQN's CVaR, whose acting
        fractions lie in ``[0, alpha)``). A host read, outside any capture: the acting observables
        (:meth:`cudarl.agent.Agent.acting_observables`)."""

    def expected_q(self, out, obs) -> None:
        """Expected Q of the online network for ``obs [n, obs_dim]`` (n <= n_envs) into ``out [n, A]``."""

    def forward(self, batch) -> None:
        """The train step's forward phase over ``batch`` (online at s and s', target at s'). The forward
        at s runs every extra head (``heads="all"``: the losses and the backward read them), those at
        s' none (``heads="none"``)."""

    def learn_phases(self) -> list[Phase]:
        """The rule's own phases after :meth:`forward`: they write ``buffers.loss``, ``loss_per``,
        ``priority`` and dL/d(head output) in ``buffers.ws`` (:meth:`LearnerBuffers.train_grad`)."""

    def q_stats(self) -> None:
        """The train step's ``q_stats`` phase, right after :meth:`forward` (on a branch beside the learn
        phases, which must neither read nor write what it does): ``buffers.q_s`` (the online net's
        expected Q at the batch's ``s``, from this step's forward) on the current stream, then the
        ``q`` block of ``buffers.stats`` on ``buffers.side_stats`` (the step's last phase joins it)."""

    def cql(self) -> None:
        """The ``cql`` phase (``agent.cql_alpha`` > 0), after ``q_stats``: discrete CQL on the expected Q
        at ``s`` (:func:`cudarl.losses.cql_c51`, :func:`cudarl.losses.cql_quantile`), its gradient added
        to the head's (:meth:`LearnerBuffers.train_grad`), its loss into the ``cql`` block of
        ``buffers.stats``."""

    def state_dict(self) -> dict:
        """The rule's own state for a checkpoint (counters; ``{}`` when it has none)."""

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` into the existing buffers."""


def acting_risk(cfg) -> tuple[int, float, float]:
    """``(mode, alpha, lam)`` of ``agent.act_by`` for the act and value kernels: mode 0 (the mean), 1
    (CVaR at ``agent.act_alpha``) or 2 (mean minus ``agent.act_lambda`` standard deviations)."""
    from ..config import ACT_BY

    a = cfg.agent
    return ACT_BY[a.act_by], float(a.act_alpha), float(a.act_lambda)


class RuleBase:
    """What every rule shares: :meth:`allocate` is the constructor, and no state of its own."""

    #: the head output of the latest act forward the rule keeps for :meth:`act_mean` (a view of
    #: ``buffers.ws_act``), or None
    act_out = None

    @classmethod
    def allocate(cls, buffers: LearnerBuffers):
        return cls(buffers)

    def act_mean(self):
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} has no state to load, got {sorted(state)}")
