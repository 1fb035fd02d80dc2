"""``horizons``: an auxiliary head predicting the cumulative log return over several horizons.

The head (a linear layer ``aux.horizons`` on the encoder's output ``psi``, H = len(``agent.aux_horizons``)
outputs) is trained on the squared error against the future log returns after the batch's decision
bars (:mod:`cudarl.reference.horizons`: the equations, the mask at the split end, and the published
methods: UNREAL's auxiliary tasks, Jaderberg et al. 2017; several horizons as in Fedus et al. 2019).
Its gradient joins the head's at ``psi``; the shared Adam steps the head and the encoder, weighted by
``agent.aux_horizons_weight``. What we chose: supervised returns (not value heads with their own
discounts) and no blend of n-step targets across horizons into the Q target (the issue's optional
part: not built).

Train graph: the loss phase ``aux_horizons`` runs on a branch of its own forked from the extra heads'
branch at s (``buffers.after_extras``: beside the rule's loss on the main chain and the other signals'
losses; the backward joins it through ``buffers.side_aux``). Observables:
``aux.horizons.loss`` and ``aux.horizons.valid`` (the share of (sample, horizon) pairs whose horizon fits
in the split).
"""

from __future__ import annotations

import numpy as np

from .future import FutureHead


class Horizons(FutureHead):
    name = "horizons"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.horizons = tuple(int(k) for k in cfg.agent.aux_horizons)
        self.n_out = len(self.horizons)
        self.weight = float(cfg.agent.aux_horizons_weight)

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        xp, k = buffers.xp, np.asarray(self.horizons)
        self.k = xp.asarray(k.astype(np.int32))
        self.hscale = xp.asarray((self.future.inv_sigma / np.sqrt(k.astype(np.float64))).astype(np.float32))

    def launch(self, pred, grad) -> None:
        fut = self.future
        self.ops.loss(
            pred, self.buf.rows, fut.up, fut.down, self.k, self.hscale, fut.t_end, self.weight,
            self.loss_per, self.valid_per, grad, self.out, self.done,
        )  # fmt: skip
