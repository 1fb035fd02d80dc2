"""``qrdqn``: QR-DQN (Dabney, Rowland, Bellemare & Munos 2018), quantile regression at fixed fractions."""

from __future__ import annotations

from .. import losses
from ..nn.heads import QRHead
from .base import LearnerBuffers
from .quantile import QuantileRule


class QRDQNRule(QuantileRule):
    """QR-DQN: ``N = net.n_quantiles`` quantiles per action at the fixed midpoints
    ``tau_i = (2 i + 1) / (2 N)`` (:func:`cudarl.losses.qr_taus`), one linear layer on psi
    (:class:`cudarl.nn.QRHead`); targets, loss and acting are :class:`QuantileRule`'s, so the same
    kernels as IQN's (the quantile Huber loss takes ``taus [N]``)."""

    @classmethod
    def make_head(cls, name: str, d: int, n_actions: int, net) -> QRHead:
        return QRHead(name, d, n_actions, net.n_quantiles, tf32=net.tf32, gemm=net.gemm)

    def __init__(self, buf: LearnerBuffers):
        super().__init__(buf)
        self.taus = buf.xp.asarray(losses.qr_taus(buf.cfg.net.n_quantiles))
        self.values = self.greedy_values(buf.online, buf.cfg)

    def loss_taus(self):
        return self.taus
