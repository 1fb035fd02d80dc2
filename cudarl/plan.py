"""The plan head's learning and its gate in the agent's two steps (``net.plan``).

The head (:class:`cudarl.nn.heads.PlanHead`) reads the encoder's output ``psi`` and gives
``plan [B, 2]`` = (conviction, readiness), both sigmoids::

    collect: act (the rule's forward also runs the plan head) - gate: env.scale = conviction where
             readiness >= 1/2, else exactly 1 - env_step (positions levels[a] * scale)
    train:   ... q_stats (the expected Q at s) - plan: dL/dplan of the batch (cudarl.reference.nn.plan_loss:
             conviction and readiness trained on the n-step returns of the greedy trade, readiness
             against a hurdle) - ... - backward (the plan head's gradient joins the head's at psi)

So readiness has a loss that targets it (the seed's had none and got no gradient through the gate),
the gate opens only where the greedy trade's expected return clears ``agent.plan_hurdle`` times the
batch's mean absolute return, and until then conviction cannot touch a position (the seed's
gradient-killing conviction at init). The statistics ``plan_ready`` (share of the batch with the gate
open) and ``plan_scale`` (mean scale) reach ``metrics.jsonl`` through :class:`cudarl.stats.StepStats`.
"""

from __future__ import annotations

import numpy as np

from .backend import family
from .nn.heads import PlanHead


class PlanLoss:
    """The plan head's loss phase over the train batch (``buffers``: :class:`cudarl.rules.LearnerBuffers`;
    ``levels``: the env's target positions, float32 ``[A]``). Reads the forward at ``s`` (``buffers.ws``),
    ``buffers.q_s``, the batch's actions and n-step returns; writes the plan head's gradient rows and the
    ``plan`` block of ``buffers.stats``."""

    def __init__(self, buffers, levels):
        self.buf = buffers
        self.levels = buffers.xp.asarray(np.asarray(levels, np.float32))
        self.hurdle = buffers.cfg.agent.plan_hurdle
        self.head = buffers.online.plan
        self.ops = family("nn", buffers.xp)

    def phase(self) -> None:
        buf, B = self.buf, self.buf.batch_size
        self.ops.plan_loss(
            buf.ws.rows(f"{self.head.lin.name}.out", B),
            buf.q_s,
            buf.batch.action,
            buf.batch.ret,
            self.levels,
            buf.ws.rows(self.head.grad_name, B),
            buf.stats.view("plan"),
            self.hurdle,
            PlanHead.THRESHOLD,
        )


def gate(net, ws, n: int, out) -> None:
    """The plan head's gate of the last forward of ``net`` over ``ws`` (``n`` rows) into ``out`` float32
    ``[n]`` (an env's ``scale``): conviction where readiness >= 1/2, else exactly 1."""
    net.plan.scale(ws, n, out=out)
