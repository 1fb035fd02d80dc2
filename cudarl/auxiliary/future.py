"""What the return-based auxiliary signals share: the market's bar log returns on the device, the
split end that masks their horizons, and a host read of an observable.

Targets come only from bars after a decision and are never fed as inputs: the kernels read these
series at a replay row's bar index (:mod:`cudarl.reference.horizons`), the window gather reads the
feature matrix up to that bar only.
"""

from __future__ import annotations

import numpy as np

from ..backend import family, to_numpy
from ..graph import SideStream
from ..nn.layers import Linear
from ..reference.horizons import future_log_returns
from .base import AuxBase


class FutureReturns:
    """Per-bar log returns of the env's market, ``up`` and (mirror rows) ``down`` float32 ``[T]`` on
    the device, with the training split's end ``t_end`` and ``inv_sigma`` (1 / the standard deviation of
    the split's per-bar log returns, float64 on the host: the targets' unit).

    ``env``: the :class:`cudarl.env.TradingEnv` the replay's rows come from (its ``data.ret``,
    ``t_begin``, ``t_end``)."""

    def __init__(self, env, xp):
        ret = to_numpy(env.data.ret)
        up, down = future_log_returns(ret)
        self.t_begin, self.t_end = int(env.t_begin), int(env.t_end)
        # the bar returns the split's transitions earn: ret[t] reads the price at t + 2 < t_end
        sigma = float(np.std(up[self.t_begin : self.t_end - 2].astype(np.float64)))
        self.inv_sigma = 1.0 / sigma if sigma > 0 else 1.0
        self.up, self.down = xp.asarray(up), xp.asarray(down)


def future_returns(buffers) -> FutureReturns:
    """The run's :class:`FutureReturns` (one per :class:`cudarl.rules.LearnerBuffers`, shared by the
    signals that read it); a clear error when the agent was built without its market."""
    fut = getattr(buffers, "future", None)
    if fut is None:
        if buffers.market is None:
            raise ValueError(
                "agent.aux: the horizons and risk signals read the market's future bars; build the Agent "
                "with market=<the TradingEnv its replay rows come from> (the Trainer does)"
            )
        fut = buffers.future = FutureReturns(buffers.market, buffers.xp)
    return fut


def host_values(values) -> np.ndarray:
    """A host copy of a small device vector an observable reports, after the device finished every
    stream (the train graph's is non-blocking): call only outside a capture, when a row is logged."""
    if not isinstance(values, np.ndarray):
        import cupy

        cupy.cuda.Device().synchronize()
    return np.asarray(to_numpy(values), np.float64).copy()


def param_span(net, prefix: str) -> tuple[int, int]:
    """``(lo, hi)``: the smallest range of ``net``'s flat buffer holding every parameter named
    ``prefix*`` (a head's), checked to hold no other parameter."""
    mine = [e for e in net.layout.entries if e.name.startswith(prefix)]
    if not mine:
        raise ValueError(f"no parameter named {prefix}* in the network")
    lo, hi = min(e.offset for e in mine), max(e.offset + e.size for e in mine)
    other = [
        e.name for e in net.layout.entries if not e.name.startswith(prefix) and e.offset < hi and e.offset + e.size > lo
    ]
    if other:
        raise ValueError(f"parameters {other} lie inside the span of {prefix}*")
    return lo, hi


class FutureHead(AuxBase):
    """What the heads trained against future bars share (``horizons``, ``risk``): a linear head
    ``aux.<name>`` of :attr:`n_out` outputs on ``psi``, the loss phase ``aux_<name>`` on a branch of its
    own (:attr:`side`, beside the other signals' losses; the backward waits for it through
    ``buffers.side_aux``) launching the kernel family ``<name>``'s ``loss`` (:meth:`launch`: the loss, its
    gradient and the two totals in one launch), and the observables ``aux.<name>.loss`` and
    ``aux.<name>.valid`` (the share of targets inside the split)."""

    name: str
    n_out: int

    def __init__(self, cfg):
        super().__init__(cfg)
        self.net = cfg.net

    @property
    def head_name(self) -> str:
        return f"aux.{self.name}"

    def make_head(self, d: int):
        return Linear(self.head_name, d, self.n_out, act="identity", tf32=self.net.tf32, gemm=self.net.gemm)

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        xp, B = buffers.xp, buffers.batch_size
        self.future = future_returns(buffers)
        self.loss_per, self.valid_per = xp.zeros(B, np.float32), xp.zeros(B, np.float32)
        self.out = xp.zeros(2, np.float32)  # the loss and the valid share
        self.done = xp.zeros(1, np.uint32)  # the loss launch's ticket counter (0 between launches)
        self.side = SideStream(xp)
        self.ops = family(self.name, xp)

    def phases(self) -> list:
        return [(f"aux_{self.name}", self._loss)]

    def _loss(self) -> None:
        buf, B = self.buf, self.buf.batch_size
        # its own branch, forked from the extra heads' (after_extras): it reads the head's outputs at s, the
        # batch's rows and the series, so it waits for that forward, not for the rule's loss on the main
        # stream; it writes only its head's gradient rows and its own buffers; the backward joins it through
        # side_aux
        with buf.after_extras(), buf.aux_branch(self.side):
            self.launch(buf.ws.rows(f"{self.head_name}.out", B), buf.ws.rows(f"{self.head_name}.dout", B))

    def launch(self, pred, grad) -> None:
        """The family's loss from the head's outputs ``pred`` into its gradient rows ``grad`` (and
        :attr:`out`, with the ticket :attr:`done`)."""
        raise NotImplementedError

    def observable(self) -> dict:
        loss, valid = host_values(self.out)
        return {f"aux.{self.name}.loss": float(loss), f"aux.{self.name}.valid": float(valid)}
