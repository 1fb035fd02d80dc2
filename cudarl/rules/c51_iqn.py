"""``c51+iqn``: the dueling C51 head and an IQN head trained together on one encoder, IQN on its own branch.

The seed system's model: both distributional losses shape the shared encoder; the agent acts with C51's
expected Q. The train step (the C51 rule's forward: online s on the chain, online s' and target s' on
branches; then)::

    iqn           join the s' branches; (PopArt: rewards normalised with the statistics before this step's
                  update, on the chain); fork the IQN branch: draw taus (Philox: online s 0x1A0, s' 0x1A1,
                  target s' 0x1A2), the IQN head at s, s' and at s' of the target net, from each workspace's
                  psi; quantile targets; the quantile Huber loss writing dL/dtheta; the tau counter
    targets_loss  C51's fused launch on the chain, beside the IQN branch (its loss into a buffer of its own)
    loss_sum      join the IQN branch; loss = C51's + IQN's (what the host reads and the guard watches)

With PopArt the forward phase first rescales the IQN head's last layer (online and target) from the
statistics before the last update to the ones C51's launch moved them to, so its unnormalised outputs
at fixed weights are preserved (C51's own head has no such layer: its statistics freeze instead).

The priorities are C51's (``agent.priority``); with PopArt both heads live in C51's normalised support
coordinates (frozen after ``agent.popart_warmup``). The backward adds both heads' dL/dpsi
(:class:`cudarl.nn.c51_iqn_head.C51IQNHead`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import losses
from ..backend import family
from ..graph import SideStream
from ..nn.c51_iqn_head import C51IQNHead
from ..pinned import DeviceScalars
from .base import LearnerBuffers, Phase
from .c51 import C51Rule

#: Philox stream ids of the IQN taus: online s, online s', target s'.
TAU_STREAMS = (0x1A0, 0x1A1, 0x1A2)


class C51IQNRule(C51Rule):
    """C51 and IQN on one encoder (module docstring); acting, evaluation and PopArt's scale are C51's."""

    @classmethod
    def make_head(cls, name: str, d: int, n_actions: int, net) -> C51IQNHead:
        return C51IQNHead(name, d, n_actions, net)

    def __init__(self, buf: LearnerBuffers):
        super().__init__(buf)
        xp, B, N, A = buf.xp, buf.batch_size, buf.cfg.net.n_quantiles, buf.n_actions
        self.c51_loss = xp.zeros(1, np.float32)
        self.out = replace(self.out, loss=self.c51_loss)  # buffers.loss becomes the sum (loss_sum)
        #: the IQN heads' branch, beside C51's targets and loss
        self.iqn_side = SideStream(xp)
        self.counters = DeviceScalars({"tau": np.int64}, xp)  # Philox counter of the taus, one step each
        self.util = family("util", xp)
        iqn = buf.online.head.iqn
        self.targets_out = losses.QuantileTargets.empty(xp, B, N)
        self.loss_out = losses.QuantileLoss.empty(
            xp, B, N, A, grad=buf.ws.rows(iqn.grad_name, B).reshape(B, N, A)
        )  # dL/dtheta where the two-head backward reads it
        self.r_norm = xp.zeros(B, np.float32)

    def learn_phases(self) -> list[Phase]:
        return [("iqn", self._iqn), ("targets_loss", self._targets_loss), ("loss_sum", self._loss_sum)]

    def _iqn(self) -> None:
        buf, batch, cfg, B = self.buf, self.buf.batch, self.buf.cfg, self.buf.batch_size
        weights = buf.importance_weights()
        buf.side.join()  # the target net's forward at s'
        buf.side_next.join()  # the online net's at s'
        ret = batch.ret
        if buf.popart is not None:  # read before C51's launch moves the statistics (no race with it)
            ret = buf.popart.normalize_rewards(batch.ret, batch.discount, out=self.r_norm)
        counter, seed = self.counters.view("tau").view(np.uint64), cfg.run.seed
        online, target = buf.online, buf.target
        with self.iqn_side.fork():
            thetas = []
            for net, ws, stream_id in (
                (online, buf.ws, TAU_STREAMS[0]),
                (online, self.ws_next, TAU_STREAMS[1]),
                (target, target.ws, TAU_STREAMS[2]),
            ):
                head = net.head.iqn
                head.sample_tau(ws, B, counter, seed, stream_id)
                thetas.append(head.forward(ws.rows(f"{net.encoder.out_name}.out", B), ws))
            theta, theta_next, theta_target = thetas
            losses.quantile_targets(theta_next, theta_target, ret, batch.discount, out=self.targets_out)
            taus = buf.ws.rows(f"{online.head.iqn.name}.tau", B)
            losses.quantile_huber_loss(
                theta, batch.action, self.targets_out.target, taus, weights, cfg.agent.kappa, out=self.loss_out
            )
            self.util.add_i64(self.counters.view("tau"), 1)

    def forward(self, batch) -> None:
        buf = self.buf
        if buf.popart is not None:  # the last update's move of the statistics, into the IQN head's last layer
            for net in (buf.online, buf.target):
                out = net.head.iqn.out.name
                buf.popart.rescale(net.P[f"{out}.weight"], net.P[f"{out}.bias"])
        super().forward(batch)

    def _loss_sum(self) -> None:
        self.iqn_side.join()
        self.util.add_f32(self.buf.loss, self.c51_loss, self.loss_out.loss)

    def state_dict(self) -> dict:
        return self.counters.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.counters.load_state_dict(state)
