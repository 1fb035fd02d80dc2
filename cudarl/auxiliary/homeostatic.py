"""``homeostatic``: hold C51's atom utilisation near a set point (a loss on the head's logits at ``s``).

The seed system had a "homeostatic regulariser" on atom utilisation; issue 18's Q statistics measure
utilisation as a count (:mod:`cudarl.reference.qstats`), which has no gradient. This signal regulates
its smooth twin, the effective share of atoms ``u = exp(H(m)) / K`` of the batch-mean atom distribution
``m`` (equations, choices and references: :mod:`cudarl.reference.homeostatic`), with the loss
``agent.homeostatic_weight * (u - agent.homeostatic_target)^2``. Its gradient on the logits goes
through the dueling combine into the head's raw gradient, beside the C51 loss's (as CQL's does).

Phase ``aux_homeostatic`` (after ``q_stats_join``, which joins the branch that wrote the logits at ``s``
it reads), on a branch of its own that the backward joins through ``buffers.side_aux``
(:meth:`cudarl.rules.base.LearnerBuffers.aux_branch`): two launches, ``probs_control`` (the softmax
rows, the batch-mean masses and the control ``g``; the last block to finish takes the batch-wide steps)
and ``grad_dueling`` (the gradient through the dueling combine, added into the head's raw gradient, after
the rule's loss and CQL, which wrote it on the main stream before the fork; nothing on the main stream
touches it again before the backward, which reads it after the join). Off the main stream, the phases
after it (causal's penalty) need not wait for it; the backward still does, as it reads what it adds
(with causal's forward forked early it is on the MLP step's critical path through that join: two
nodes, where five kernels were, issue 19). Observables:
``aux.homeostatic.utilisation`` (u), ``aux.homeostatic.entropy`` (H, nats) and ``aux.homeostatic.loss``.
C51 only: a head without atoms has no utilisation.
"""

from __future__ import annotations

import numpy as np

from ..backend import family
from ..graph import SideStream
from ..reference import homeostatic as ref
from .base import AuxBase, read


class Homeostatic(AuxBase):
    name = "homeostatic"
    reads_q_stats = True  # the logits at s

    def __init__(self, cfg):
        super().__init__(cfg)
        self.need(cfg.net.head == "c51", f"needs net.head = c51 (atoms to regulate), got {cfg.net.head!r}")
        a = cfg.agent
        self.target, self.weight = a.homeostatic_target, a.homeostatic_weight

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        xp, B, A, K = self.xp, buffers.batch_size, buffers.n_actions, self.cfg.net.atoms
        self.p = xp.zeros((B, A, K), np.float32)
        self.part = xp.zeros((ref.partials(B * A), K), np.float32)  # the blocks' column sums of p
        self.m, self.g = xp.zeros(K, np.float32), xp.zeros(K, np.float32)
        self.state = xp.zeros(3, np.float32)
        self.done = xp.zeros(1, np.uint32)  # probs_control's ticket: 0, and left 0 by every launch
        self.ops = family("homeostatic", xp)
        self.side = SideStream(xp, gemms=False)  # no GEMM on its branch: no cuBLAS workspace

    def phases(self) -> list:
        return [("aux_homeostatic", self._phase)]

    def _phase(self) -> None:
        buf = self.buf
        B, K = buf.batch_size, self.cfg.net.atoms
        head = buf.online.head
        # the logits at s the q_stats phase combined from the head's raw output (same workspace rows)
        logits = buf.ws.rows(f"{head.name}.logits", B).reshape(-1, K)
        with buf.aux_branch(self.side, q_grad=True):  # it adds into the Q head's raw gradient
            self.ops.probs_control(
                logits, self.p.reshape(-1, K), self.part, self.m, self.g, self.state, self.done, self.target,
                self.weight,
            )  # fmt: skip
            self.ops.grad_dueling(self.p, self.g, buf.train_grad(raw=True))

    def observable(self) -> dict:
        loss, u, h = read(self.state)
        return {"aux.homeostatic.loss": loss, "aux.homeostatic.utilisation": u, "aux.homeostatic.entropy": h}
