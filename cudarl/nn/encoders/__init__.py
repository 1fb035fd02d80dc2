"""Encoders: the observation ``x [B, n_in]`` to the state embedding ``psi [B, D]`` every head reads.

``net.encoder`` names one in :data:`ENCODERS` (a registry: adding an encoder is its module, its kernel
family's four faces if it has kernels, and one line here). Today only ``"mlp"``
(:class:`cudarl.nn.MLP`); the temporal encoders (``ssm``, ``attention``) come next.
"""

from __future__ import annotations

from typing import Protocol

from ..layers import MLP
from ..params import ParamLayout, Workspace


class Encoder(Protocol):
    """What :class:`cudarl.nn.QNetwork` asks of an encoder (the conventions of :mod:`cudarl.nn.layers`).

    Input: ``x`` float32 ``[B, n_in]``, one row per sample. A windowed encoder reads the row as
    ``[window, features]`` (time-major, oldest bar first: ``n_in = window * features``), so the
    replay, the environment and the network exchange flat rows whatever the encoder.

    Output: ``psi`` float32 ``[B, n_out]``, written to the workspace buffer ``<out_name>.out``; the
    heads write dL/dpsi into ``<out_name>.dout`` (the first head overwrites it, the others add), and
    :meth:`backward` reads it from there.

    Parameters live in the network's one flat buffer: :meth:`declare` adds them to the layout (and
    the encoder's activations to the workspace spec), :meth:`bind` hands over the views. Children
    that are :class:`cudarl.nn.Linear` are found by walking ``children`` (side streams for their
    weight gradients, cuBLASLt plans, spectral norm).

    Acting state: the acting forward runs over the acting workspace (one row per environment), so an
    encoder that carries state from bar to bar while acting (a recurrent SSM step instead of the whole
    window) declares that state as workspace rows in :meth:`declare`; the acting workspace then holds
    each environment's state and nothing outside the encoder needs to know.
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

    def bind(self, P: dict, G: dict, xp) -> None:
        """Take the parameter and gradient views ``P``, ``G`` of the flat buffers and the backend ``xp``."""

    def forward(self, x, ws: Workspace):
        """``psi [B, n_out]`` from ``x [B, n_in]``, into the workspace (no allocation)."""

    def backward(self, x, ws: Workspace, dx=None) -> None:
        """Overwrite the encoder's parameter gradients from ``ws[<out_name>.dout]``; write ``dx`` if given."""


def _mlp(name: str, n_in: int, net) -> MLP:
    return MLP(name, n_in, net.hidden, layernorm=net.layernorm, tf32=net.tf32, gemm=net.gemm)


#: Encoders by ``net.encoder``: ``factory(name, n_in, net: NetConfig) -> Encoder``.
ENCODERS = {"mlp": _mlp}
