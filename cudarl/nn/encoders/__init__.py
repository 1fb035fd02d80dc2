"""Encoders: the observation ``x [B, n_in]`` to the state embedding ``psi [B, D]`` every head reads.

``net.encoder`` names one in :data:`ENCODERS` (a registry: adding an encoder is its module, its kernel
family's four faces if it has kernels, and one line here):

* ``mlp``: :class:`cudarl.nn.MLP` over the flat window (widths ``net.hidden``).
* ``ssm``: Mamba2 blocks (:class:`SSMEncoder`; kernels ``cuda_src/ssm.cu`` and ``cuda_src/seq.cu``).
* ``attention``: causal pre-norm transformer blocks with RoPE (:class:`AttentionEncoder`; kernels
  ``cuda_src/attention.cu`` and ``cuda_src/seq.cu``).

The observation is ``net.window`` bars, oldest first, each ``F + 2`` wide: the bar's features and two
position columns, which hold the position and the hold fraction on the newest bar and zeros on the others
(:mod:`cudarl.reference.window`), so ``n_in = window * (F + 2)``.
"""

from __future__ import annotations

from typing import Protocol

from ..layers import MLP
from ..params import ParamLayout, Workspace
from .attention import AttentionEncoder
from .base import ActState, SequenceEncoder, Standalone
from .ssm import SSMEncoder


class Encoder(Protocol):
    """What :class:`cudarl.nn.QNetwork` asks of an encoder (the conventions of :mod:`cudarl.nn.layers`).

    Input: ``x`` float32 ``[B, n_in]``, one row per sample. A windowed encoder reads the row as
    ``[window, bar width]`` (time-major, oldest bar first: ``n_in = window * bar width``), so the
    replay, the environment and the network exchange flat rows whatever the encoder.

    Output: ``psi`` float32 ``[B, n_out]``, written to the workspace buffer ``<out_name>.out``; the
    heads write dL/dpsi into ``<out_name>.dout`` (the first head overwrites it, the others add), and
    :meth:`backward` reads it from there.

    Parameters live in the network's one flat buffer: :meth:`declare` adds them to the layout (and
    the encoder's activations to the workspace spec), :meth:`bind` hands over the views. Children
    that are :class:`cudarl.nn.Linear` are found by walking ``children`` (side streams for their
    weight gradients, cuBLASLt plans, spectral norm).

    Acting: the agent acts by running :meth:`forward` over each environment's window, gathered from the
    feature matrix at its current bar (docs/architecture.md, "The encoder's data flow"), so acting and
    training run the same function and carry no state from bar to bar. (The windowed encoders also
    have a one-bar recurrent path, ``new_state``/``step``, equal to the windowed forward only over the
    first ``window`` bars after a reset; it is measured by ``tools/bench_encoders.py``, not acted with.)
    """

    name: str
    n_in: int
    n_out: int
    children: list

    @property
    def out_name(self) -> str:
        """The prefix of the workspace buffers ``.out`` (psi) and ``.dout`` (dL/dpsi)."""

    def declare(self, layout: ParamLayout, ws_spec: list) -> None:
        """Add the parameters to ``layout`` and the activations to ``ws_spec`` (``(name, row_shape, merge)``)."""

    def chain_linears(self) -> tuple:
        """The Linears from x to psi, each reading the one before (``net.gemm = "chain"`` runs them, and the
        head's :attr:`cudarl.nn.heads.Head.chain_linear`, as one launch), or () where the encoder is not such
        a chain."""

    @property
    def gate_linear(self):
        """The :class:`cudarl.nn.Linear` that reads the whole input row ``x [B, n_in]`` first (its weight's row
        ``r`` for input column ``r``), into which an input gate that scales x's columns can be folded (the
        selectivity gate: :class:`cudarl.nn.QNetwork`), or None where no layer reads x so (the windowed
        encoders embed each bar: the gate stays a module in front of them)."""

    def bind(self, P: dict, G: dict, xp) -> None:
        """Take the parameter and gradient views ``P``, ``G`` of the flat buffers and the backend ``xp``."""

    def forward(self, x, ws: Workspace):
        """``psi [B, n_out]`` from ``x [B, n_in]``, into the workspace (no allocation)."""

    def backward(self, x, ws: Workspace, dx=None) -> None:
        """Overwrite the encoder's parameter gradients from ``ws[<out_name>.dout]``; write ``dx`` if given."""

    @property
    def last_layer(self) -> tuple:
        """The names of the last layer's parameters, the layer psi comes out of (contiguous in the layout,
        the encoder's last): Gradient Vaccine's ``agent.vaccine_scope = "last"``."""

    def backward_last(self, x, ws: Workspace) -> None:
        """:meth:`backward` of :attr:`last_layer` only: overwrite those parameters' gradients from
        ``ws[<out_name>.dout]`` and stop, leaving every other gradient as it is (no dx)."""

    @property
    def last_layer_branch(self):
        """The :class:`cudarl.graph.SideStream` on which :meth:`backward` writes every :attr:`last_layer` gradient,
        none of them written again after that branch's work in the backward, or None where some are written on
        the calling stream: a fork from it follows the last layer's gradients without waiting for the layers
        below (Gradient Vaccine's sums with ``vaccine_scope = "last"``)."""


def bar_width(n_in: int, net) -> int:
    """The width of one bar of the window, ``n_in / net.window`` (a ValueError when it does not divide)."""
    if n_in % net.window:
        raise ValueError(f"encoder: an input of {n_in} columns is not net.window = {net.window} bars")
    return n_in // net.window


def _mlp(name: str, n_in: int, net) -> MLP:
    return MLP(name, n_in, net.hidden, layernorm=net.layernorm, tf32=net.tf32, gemm=net.gemm)


def _temporal(cls, **own):
    """The factory of a windowed encoder ``cls``: the shared fields, and ``own`` (constructor argument ->
    ``NetConfig`` field) for its own."""

    def make(name: str, n_in: int, net):
        mine = {arg: getattr(net, field) for arg, field in own.items()}
        shared = dict(window=net.window, d_model=net.d_model, layers=net.layers, tf32=net.tf32, gemm=net.gemm)
        return cls(name, bar_width(n_in, net), **shared, **mine)

    return make


#: Encoders by ``net.encoder``: ``factory(name, n_in, net: NetConfig) -> Encoder``.
ENCODERS = {
    "mlp": _mlp,
    "ssm": _temporal(SSMEncoder, expand="ssm_expand", d_state="ssm_state", headdim="ssm_headdim",
                     groups="ssm_groups", conv_kernel="ssm_conv", chunk="ssm_chunk"),
    "attention": _temporal(AttentionEncoder, heads="attn_heads", mlp_ratio="attn_mlp_ratio"),
}  # fmt: skip

__all__ = [
    "ENCODERS",
    "ActState",
    "AttentionEncoder",
    "Encoder",
    "SSMEncoder",
    "SequenceEncoder",
    "Standalone",
    "bar_width",
]
