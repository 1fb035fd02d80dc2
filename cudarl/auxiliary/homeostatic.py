"""``homeostatic``: hold C51's atom utilisation near a set point (a loss on the head's logits at ``s``).

The seed system had a "homeostatic regulariser" on atom utilisation; issue 18's Q statistics measure
utilisation as a count (:mod:`cudarl.reference.qstats`), which has no gradient. This signal regulates
its smooth twin, the effective share of atoms ``u = exp(H(m)) / K`` of the batch-mean atom distribution
``m`` (equations, choices and references: :mod:`cudarl.reference.homeostatic`), with the loss
``agent.homeostatic_weight * (u - agent.homeostatic_target)^2``. Its gradient on the logits goes
through the dueling combine into the head's raw gradient, beside the C51 loss's (as CQL's does).

Phase ``aux_homeostatic`` (after ``q_stats``, whose logits at ``s`` it reads), on a branch of its own
that the backward joins through ``buffers.side_aux``
(:meth:`cudarl.rules.base.LearnerBuffers.aux_branch`): probs - mass - control - grad - dueling backward
(added into the head's raw gradient, after the rule's loss and CQL, which wrote it on the main stream
before the fork; nothing on the main stream touches it again before the backward, which reads it after
the join). Off the main stream, the phases after it (causal's penalty) need not wait for its five
kernels; the backward still does, as it reads what they add. Observables:
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

    def __init__(self, cfg):
        super().__init__(cfg)
        self.need(cfg.net.head == "c51", f"needs net.head = c51 (atoms to regulate), got {cfg.net.head!r}")
        a = cfg.agent
        self.target, self.weight = a.homeostatic_target, a.homeostatic_weight

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        xp, B, A, K = self.xp, buffers.batch_size, buffers.n_actions, self.cfg.net.atoms
        self.p = xp.zeros((B * A, K), np.float32)
        self.m, self.g = xp.zeros(K, np.float32), xp.zeros(K, np.float32)
        self.state = xp.zeros(3, np.float32)
        self.dlogits = xp.zeros((B, A, K), np.float32)
        self.ops, self.nn_ops = family("homeostatic", xp), family("nn", xp)
        self.side = SideStream(xp, gemms=False)  # no GEMM on its branch: no cuBLAS workspace

    def phases(self) -> list:
        return [("aux_homeostatic", self._phase)]

    def _phase(self) -> None:
        buf = self.buf
        B, K = buf.batch_size, self.cfg.net.atoms
        head = buf.online.head
        # the logits at s the q_stats phase combined from the head's raw output (same workspace rows)
        logits = buf.ws.rows(f"{head.name}.logits", B).reshape(-1, K)
        grad2d = self.dlogits.reshape(-1, K)
        with buf.aux_branch(self.side):
            if self.numpy:
                self.p[...] = ref.probs(logits)
                self.m[...] = ref.mass(self.p)
                self.g[...], self.state[...] = ref.control(self.m, self.target, self.weight)
                grad2d[...] = ref.grad(self.p, self.g)
            else:
                self.ops.probs(logits, self.p)
                self.ops.mass(self.p, self.m)
                self.ops.control(self.m, self.g, self.state, self.target, self.weight)
                self.ops.grad(self.p, self.g, grad2d)
            self.nn_ops.dueling_backward(self.dlogits, buf.train_grad(raw=True), accumulate=True)

    def observable(self) -> dict:
        loss, u, h = read(self.state)
        return {"aux.homeostatic.loss": loss, "aux.homeostatic.utilisation": u, "aux.homeostatic.entropy": h}
