"""``horizons``: an auxiliary head predicting the cumulative log return over several horizons.

The head (a linear layer ``aux.horizons`` on the encoder's output ``psi``, H = len(``agent.aux_horizons``)
outputs) is trained on the squared error against the future log returns after the batch's decision
bars (:mod:`cudarl.reference.horizons`: the equations, the mask at the split end, and the published
methods: UNREAL's auxiliary tasks, Jaderberg et al. 2017; several horizons as in Fedus et al. 2019).
Its gradient joins the head's at ``psi``; the shared Adam steps the head and the encoder, weighted by
``agent.aux_horizons_weight``. What we chose: supervised returns (not value heads with their own
discounts) and no blend of n-step targets across horizons into the Q target (the issue's optional
part: not built).

Train graph: the loss phase ``aux_horizons`` runs on the auxiliary branch (``buffers.side_aux``,
beside the main chain; the backward joins it). Observables: ``aux.horizons.loss`` and
``aux.horizons.valid`` (the share of (sample, horizon) pairs whose horizon fits in the split).
"""

from __future__ import annotations

import numpy as np

from ..backend import family
from ..nn.layers import Linear
from .future import future_returns, host_values


class Horizons:
    name = "horizons"
    head_name = "aux.horizons"

    def __init__(self, cfg):
        self.net = cfg.net
        self.horizons = tuple(int(k) for k in cfg.agent.aux_horizons)
        self.weight = float(cfg.agent.aux_horizons_weight)
        self.buf = None

    def make_head(self, d: int):
        return Linear(self.head_name, d, len(self.horizons), act="identity", tf32=self.net.tf32, gemm=self.net.gemm)

    def allocate(self, buffers) -> None:
        xp, B = buffers.xp, buffers.batch_size
        self.buf, self.future = buffers, future_returns(buffers)
        self.k = xp.asarray(np.asarray(self.horizons, np.int32))
        self.hscale = xp.asarray(
            (self.future.inv_sigma / np.sqrt(np.asarray(self.horizons, np.float64))).astype(np.float32)
        )
        self.loss_per, self.valid_per = xp.zeros(B, np.float32), xp.zeros(B, np.float32)
        self.out = xp.zeros(2, np.float32)
        self.ops = family("horizons", xp)

    def phases(self) -> list:
        return [("aux_horizons", self._loss)]

    def _loss(self) -> None:
        buf, fut, B = self.buf, self.future, self.buf.batch_size
        with buf.side_aux.fork():
            self.ops.loss(
                buf.ws.rows(f"{self.head_name}.out", B),
                buf.rows,
                fut.up,
                fut.down,
                self.k,
                self.hscale,
                fut.t_end,
                self.weight,
                self.loss_per,
                self.valid_per,
                buf.ws.rows(f"{self.head_name}.dout", B),
                self.out,
            )

    def observable(self) -> dict:
        loss, valid = host_values(self.out)
        return {"aux.horizons.loss": float(loss), "aux.horizons.valid": float(valid)}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"aux.horizons has no state to load, got {sorted(state)}")
