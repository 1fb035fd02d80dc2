"""``iqn``: implicit quantile networks (Dabney, Ostrovski, Silver & Munos 2018)."""

from __future__ import annotations

import numpy as np

from ..backend import family
from ..nn.heads import IQNHead
from ..pinned import DeviceScalars
from .base import LearnerBuffers
from .quantile import ACT_STREAM, QuantileRule


class IQNRule(QuantileRule):
    """IQN: the quantile fractions ``tau`` are drawn per sample from Philox (stream ids: online s and s'
    0x1A0, target s' 0x1A2, acting 0x1A3) with a device counter the loss phase advances, beside the
    rest of the step; the quantile Huber loss uses the online fractions at s."""

    @classmethod
    def make_head(cls, name: str, d: int, n_actions: int, net) -> IQNHead:
        return IQNHead(name, d, n_actions, net.n_quantiles, net.n_cos, tf32=net.tf32, gemm=net.gemm)

    def __init__(self, buf: LearnerBuffers):
        super().__init__(buf)
        # Philox counter of the taus (online s, online s', target s', acting), advanced per step
        self.counters = DeviceScalars({"tau": np.int64}, buf.xp)
        self.util = family("util", buf.xp)
        # the online fractions at s: the first B rows of the pair forward's taus
        self.taus = buf.ws.rows(f"{buf.online.head.name}.tau", buf.batch_size)
        self.values = self.greedy_values(buf.online, buf.cfg, self.counters)

    @classmethod
    def acting_taus(cls, net, cfg, counters):
        """The acting taus from Philox ``(seed, counters["tau"], 0x1A3)``: the trainer's counter, or the
        one a policy file saved (``counters`` is required)."""
        if counters is None:
            raise ValueError("IQN acts with the taus of its tau counter; give greedy_values its counters")
        counter = counters.view("tau").view(np.uint64)
        return lambda ws, n: net.head.sample_tau(ws, n, counter, cfg.run.seed, ACT_STREAM)

    def draw_taus(self, net, ws, rows: int, stream_id: int) -> None:
        net.head.sample_tau(ws, rows, self.counters.view("tau").view(np.uint64), self.buf.cfg.run.seed, stream_id)

    def loss_taus(self):
        return self.taus

    def _loss(self) -> None:
        super()._loss()
        with self.buf.side_small.fork():  # the counter beside the rest of the step (nothing here reads it)
            self.util.add_i64(self.counters.view("tau"), 1)

    def state_dict(self) -> dict:
        return self.counters.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.counters.load_state_dict(state)
