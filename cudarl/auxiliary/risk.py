"""``risk``: an auxiliary head predicting realised volatility and drawdown over the next k bars, with
its own optimiser step.

The head (a linear layer ``aux.risk`` on ``psi``, 2 outputs) is trained on the squared error against
the realised volatility and drawdown of the ``agent.aux_risk_bars`` bars after each batch decision
(:mod:`cudarl.reference.risk`: equations, the mask at the split end). Published method: auxiliary
prediction tasks on a shared encoder (Jaderberg et al. 2017, UNREAL).

Its own optimiser step (the seed's "risk SGD"; what we chose): the head's parameters are stepped by
plain SGD (:mod:`cudarl.reference.auxsgd`, rate ``agent.aux_risk_lr``) in the phase ``aux_risk_sgd``
between the backward and the shared Adam, which clears their gradient, so Adam (its moments zero there)
leaves the head alone and the gradient-norm clip does not see it. The encoder gets the risk loss's
``dL/dpsi`` scaled by ``agent.aux_risk_weight`` through the shared Adam. (The alternative, a loss weight
alone with the head under Adam, is ``horizons``'s design; a separate optimiser keeps a probe head's
scale from moving Adam's statistics and makes its rate a knob of its own.)

Train graph: ``aux_risk`` (the loss, on ``buffers.side_aux``), then ``aux_risk_sgd`` after the backward.
Observables: ``aux.risk.loss`` and ``aux.risk.valid`` (the share of the batch whose k bars fit).
"""

from __future__ import annotations

import numpy as np

from ..backend import family
from ..nn.layers import Linear
from .future import future_returns, host_values, param_span


class Risk:
    name = "risk"
    head_name = "aux.risk"

    def __init__(self, cfg):
        self.net = cfg.net
        a = cfg.agent
        self.k, self.weight, self.lr = int(a.aux_risk_bars), float(a.aux_risk_weight), float(a.aux_risk_lr)
        self.buf = None

    def make_head(self, d: int):
        return Linear(self.head_name, d, 2, act="identity", tf32=self.net.tf32, gemm=self.net.gemm)

    def allocate(self, buffers) -> None:
        xp, B = buffers.xp, buffers.batch_size
        self.buf, self.future = buffers, future_returns(buffers)
        self.loss_per, self.valid_per = xp.zeros(B, np.float32), xp.zeros(B, np.float32)
        self.out = xp.zeros(2, np.float32)
        lo, hi = param_span(buffers.online, f"{self.head_name}.")
        self.params, self.grads = buffers.online.params[lo:hi], buffers.online.grads[lo:hi]
        self.ops, self.sgd = family("risk", xp), family("auxsgd", xp)

    def phases(self) -> list:
        return [("aux_risk", self._loss)]

    def update_phases(self) -> list:
        return [("aux_risk_sgd", self._step)]

    def _loss(self) -> None:
        buf, fut, B = self.buf, self.future, self.buf.batch_size
        with buf.side_aux.fork():
            self.ops.loss(
                buf.ws.rows(f"{self.head_name}.out", B),
                buf.rows,
                fut.up,
                fut.down,
                self.k,
                fut.t_end,
                fut.inv_sigma,
                self.weight,
                self.loss_per,
                self.valid_per,
                buf.ws.rows(f"{self.head_name}.dout", B),
                self.out,
            )

    def _step(self) -> None:
        # the head's own step from the gradient the backward just wrote (dout carried the weight: divided
        # out, so the head's rate is aux_risk_lr); clearing it leaves Adam nothing there
        self.sgd.step(self.params, self.grads, self.lr / self.weight, clear=True)

    def observable(self) -> dict:
        loss, valid = host_values(self.out)
        return {"aux.risk.loss": float(loss), "aux.risk.valid": float(valid)}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"aux.risk has no state to load, got {sorted(state)}")
