"""``risk``: an auxiliary head predicting realised volatility and drawdown over the next k bars, with
its own optimiser step.

The head (a linear layer ``aux.risk`` on ``psi``, 2 outputs) is trained on the squared error against
the realised volatility and drawdown of the ``agent.aux_risk_bars`` bars after each batch decision
(:mod:`cudarl.reference.risk`: equations, the mask at the split end). Published method: auxiliary
prediction tasks on a shared encoder (Jaderberg et al. 2017, UNREAL).

Its own optimiser step (the seed's "risk SGD"; what we chose): the head's parameters are stepped by
plain SGD (:mod:`cudarl.reference.auxsgd`, rate ``agent.aux_risk_lr``) in the agent's phase ``aux_sgd``
(one span of it, :meth:`sgd_spans`) between the backward and the shared Adam, which clears their
gradient, so Adam (its moments zero there) leaves the head alone and the gradient-norm clip does not
see it. The encoder gets the risk loss's ``dL/dpsi`` scaled by ``agent.aux_risk_weight`` through the
shared Adam. (The alternative, a loss weight alone with the head under Adam, is ``horizons``'s design; a
separate optimiser keeps a probe head's scale from moving Adam's statistics and makes its rate a knob of
its own.)

Train graph: ``aux_risk`` (the loss, on a branch of its own forked from the extra heads' branch at s,
``buffers.after_extras``, joined by the backward through ``buffers.side_aux``), then its span of ``aux_sgd``
after the backward.
Observables: ``aux.risk.loss`` and ``aux.risk.valid`` (the share of the batch whose k bars fit).
"""

from __future__ import annotations

from .base import SgdSpan
from .future import FutureHead, param_span


class Risk(FutureHead):
    name = "risk"
    n_out = 2  # realised volatility, drawdown

    def __init__(self, cfg):
        super().__init__(cfg)
        a = cfg.agent
        self.k, self.weight, self.lr = int(a.aux_risk_bars), float(a.aux_risk_weight), float(a.aux_risk_lr)

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        lo, hi = param_span(buffers.online, f"{self.head_name}.")
        self.params, self.grads = buffers.online.params[lo:hi], buffers.online.grads[lo:hi]

    def sgd_spans(self) -> list:
        # the head's own step from the gradient the backward just wrote (dout carried the weight: divided
        # out, so the head's rate is aux_risk_lr); clearing it leaves Adam nothing there
        return [SgdSpan(self.params, self.grads, self.lr / self.weight)]

    def launch(self, pred, grad) -> None:
        fut = self.future
        self.ops.loss(
            pred, self.buf.rows, fut.up, fut.down, self.k, fut.t_end, fut.inv_sigma, self.weight,
            self.loss_per, self.valid_per, grad, self.out, self.done,
        )  # fmt: skip
