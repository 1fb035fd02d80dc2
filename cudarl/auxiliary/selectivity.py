"""``selectivity``: a learned gate over the input features (or the window's bars) with an L1 penalty.

Equations, choices and references: :mod:`cudarl.reference.selectivity`. The gate is a module of the
network in front of the encoder (:class:`InputGate`, parameters ``sel.logit`` in the flat buffer: Adam
trains them, the target net and every checkpoint and policy file carry them, acting and evaluation go
through them), so it changes what the agent sees everywhere, not only in the train step. Its gradient is
the encoder's input gradient (the encoder's backward writes ``dx`` into the workspace's ``sel.dx``)
times the input, summed over each gate's columns, plus the penalty's.

On the MLP encoder the gate is always folded into the first layer's weight (no setting: ``x' W1 = x (diag(s)
W1)``, :mod:`cudarl.reference.selectivity`; the bits differ from the gate in front of the encoder by rounding),
unless that layer is spectrally normalised (``net.spectral`` naming ``enc.0``); the windowed encoders (``ssm``,
``attention``) keep the gate in front (:attr:`cudarl.nn.QNetwork.folded`). The folded weight
``diag(s) W1`` is a buffer of each network (online, target, and each :meth:`cudarl.nn.QNetwork.twin`'s own),
written from the parameters alone: in the train step by its ``fold`` phase, first, on a branch beside
``sample`` that joins before any forward, for both nets; every forward of the step reads it (the step's
parameters are moved only by Adam, the soft update and the own SGD steps, after its last forward); every other
forward (the collect step's act, evaluation, a policy file, after a checkpoint load, the averaged-weights swap or
shrink-and-perturb) folds first (:meth:`cudarl.nn.QNetwork.prefolded_forwards`), so none reads a fold of
parameters that have moved since. The backward needs no input gradient: the first layer's dW GEMM over the
ungated input, then :meth:`InputGate.fold_backward` on that layer's weight-gradient branch.

``agent.selectivity_over`` picks features or bars, ``agent.selectivity_l1`` the penalty's weight.
Observables: ``aux.selectivity.gate.<feature>`` (or ``.gate.t-<k>``, the bar ``k`` before the
decision) in ``[0, 1]``, ``aux.selectivity.mean`` and ``aux.selectivity.penalty``. An evaluation's
``summary.json`` lists the gates as ``features_used``, largest first (:func:`features_used`): the
trainer's and that of a policy file (:meth:`cudarl.policy.Policy.evaluate`, from its weights alone:
:func:`features_used_of`).
"""

from __future__ import annotations

import numpy as np

from ..backend import family
from ..reference import selectivity as ref
from ..reference.window import N_POSITION_FEATURES
from .base import AuxBase, read

PREFIX = "aux.selectivity.gate."


class InputGate:
    """The gate module ``sel`` on the network's input ``x [B, W * C]`` (``C = F + 2``): ``forward(x, ws)``
    writes and returns ``ws[sel.x]``; ``backward(x, ws)`` reads ``ws[sel.dx]`` (dL/dx', which the encoder's
    backward wrote) and writes ``G[sel.logit]``.

    Folded (:meth:`fold_into` a Linear that reads the whole row ``x``: the MLP's first layer), it is no module
    in front of the encoder: :meth:`fold` writes :attr:`weight` ``= diag(s_ext) W1`` from the parameters alone,
    which that layer's GEMMs read over the ungated ``x``, and :meth:`fold_backward`, right after the layer's dW
    GEMM (``dL/d weight``, on its branch), writes dL/dW1 in place and ``G[sel.logit]``
    (:func:`cudarl.reference.selectivity.fold_backward`): no ``sel.x`` or ``sel.dx``, no input gradient."""

    name = "sel"

    def __init__(self, n_in: int, window: int, over: str, l1: float):
        self.n_in, self.W = int(n_in), int(window)
        self.C = self.n_in // self.W
        self.F = self.C - N_POSITION_FEATURES
        if self.W * self.C != self.n_in or self.F < 1:
            raise ValueError(f"selectivity: input width {n_in} is not window {window} times (features + 2)")
        self.over, self.l1 = over, float(l1)
        self.J = ref.n_gates(self.W, self.F, over)

    def declare(self, layout, ws_spec: list) -> None:
        layout.add("sel.logit", (self.J,), init=("const", ref.INIT))
        ws_spec += [("sel.x", (self.n_in,), False), ("sel.dx", (self.n_in,), False)]

    def bind(self, P, G, xp) -> None:
        self.logit, self.dlogit, self.xp = P["sel.logit"], G["sel.logit"], xp
        self.numpy = xp.__name__ == "numpy"
        self.ops = family("selectivity", xp)

    def fold_into(self, lin, xp) -> None:
        """Fold the gate into ``lin`` (a bound :class:`cudarl.nn.Linear` over the whole input row, no spectral
        norm): allocate :attr:`weight` (the network's buffer, not a parameter) and set ``lin.fold``."""
        if lin.n_in != self.n_in or lin.rows != 1 or lin.spectral or lin.residual_rows is not None:
            raise ValueError(
                f"selectivity: the gate cannot fold into {lin.name} (n_in {lin.n_in}, spectral {lin.spectral})"
            )
        self.w1, self.dw1 = lin.P[f"{lin.name}.weight"], lin.G[f"{lin.name}.weight"]
        #: ``diag(s_ext) W1 [n_in, H]``: what :meth:`fold` last wrote (the layer's GEMMs read it)
        self.weight = xp.zeros_like(self.w1)
        lin.fold = self

    def fold(self) -> None:
        """:attr:`weight` = ``diag(s_ext) W1`` of the current parameters (one launch)."""
        self.ops.fold(self.w1, self.logit, self.weight, self.W, self.C, self.F, self.over)

    def fold_backward(self) -> None:
        """From ``G[W1]`` = dL/d(:attr:`weight`) (the layer's dW GEMM over the ungated input): dL/dW1 in place
        and ``G[sel.logit]``, the penalty's gradient included (one launch, a block per gate)."""
        self.ops.fold_backward(self.w1, self.logit, self.dw1, self.dlogit, self.W, self.C, self.F, self.over, self.l1)

    def forward(self, x, ws):
        out = ws.rows("sel.x", x.shape[0])
        shape = (self.W, self.C, self.F, self.over)
        if self.numpy:
            out[...] = ref.forward(x, self.logit, *shape, compute_dtype=out.dtype.type)
        else:
            self.ops.forward(x, self.logit, out, *shape)
        return out

    def backward(self, x, ws) -> None:
        dxg = ws.rows("sel.dx", x.shape[0])
        shape = (self.W, self.C, self.F, self.over, self.l1)
        if self.numpy:
            self.dlogit[...] = ref.backward(x, dxg, self.logit, *shape, compute_dtype=self.dlogit.dtype.type)
        else:
            self.ops.backward(x, dxg, self.logit, self.dlogit, *shape)


class Selectivity(AuxBase):
    name = "selectivity"

    def __init__(self, cfg):
        super().__init__(cfg)
        a = cfg.agent
        self.over, self.l1, self.W = a.selectivity_over, a.selectivity_l1, cfg.net.window

    def make_input_gate(self, n_in: int) -> InputGate:
        return InputGate(n_in, self.W, self.over, self.l1)

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        gate = buffers.online.gate
        names = tuple(buffers.feature_names) or tuple(f"f{j}" for j in range(gate.F))
        self.need(len(names) == gate.F, f"{len(names)} feature names for {gate.F} feature columns")
        self.labels = gate_labels(names, self.over, self.W)
        self.logit = gate.logit

    def observable(self) -> dict:
        return gate_observables(self.logit, self.labels, self.l1)


def gate_labels(names, over: str, window: int) -> list:
    """The gates' labels: the feature names (``over = "features"``), else ``t-<k>`` for each bar of the
    window, ``k`` bars before the decision (oldest first)."""
    return list(names) if over == "features" else [f"t-{window - 1 - w}" for w in range(window)]


def gate_observables(logit, labels, l1: float) -> dict:
    """The observables of the gate logits ``logit`` (``sel.logit``: a device or host array), on the host in
    float64: ``aux.selectivity.gate.<label>`` (``sigmoid(logit)``), ``aux.selectivity.mean`` and
    ``aux.selectivity.penalty``. The trainer's metrics and the evaluations of the trainer and of a policy
    file all read the gates through this."""
    s = 1.0 / (1.0 + np.exp(-read(logit)))
    out = {f"{PREFIX}{k}": v for k, v in zip(labels, s, strict=True)}
    out.update({"aux.selectivity.mean": float(s.mean()), "aux.selectivity.penalty": l1 * float(s.mean())})
    return out


def features_used(observables: dict) -> list:
    """``[[name, gate], ...]``, largest gate first, from a metrics row's selectivity gates (empty without)."""
    gates = [(k[len(PREFIX) :], float(v)) for k, v in observables.items() if k.startswith(PREFIX)]
    return [[k, v] for k, v in sorted(gates, key=lambda kv: -kv[1])]


def features_used_of(weights: dict, cfg, names) -> list:
    """:func:`features_used` of a network's weights (``{parameter name: array}``, as a policy file holds
    them) under ``cfg``, whose features are ``names``: the list the trainer's evaluation writes for the same
    weights, computed on the host; empty when ``cfg.agent.aux`` has no ``selectivity``."""
    if "selectivity" not in cfg.agent.aux:
        return []
    a = cfg.agent
    labels = gate_labels(names, a.selectivity_over, cfg.net.window)
    return features_used(gate_observables(weights["sel.logit"], labels, a.selectivity_l1))
