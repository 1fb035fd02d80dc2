"""Auxiliary signals: extra learning signals beside the head's loss, behind one declared interface.

An :class:`AuxSignal` may put a head of its own on the encoder's output (its parameters join the
network's flat buffer, so Adam trains them and the encoder learns from its gradient), runs its loss
phase inside the train graph (after the head rule's, before the backward) and reports an
observable that the trainer writes into ``metrics.jsonl``. ``agent.aux`` names the signals a run
builds from :data:`AUX_SIGNALS`; adding one is its module (and a kernel family's four faces if it
has kernels) plus one line in that registry. Built in: ``horizons`` (multi-horizon returns,
:mod:`cudarl.auxiliary.horizons`), ``risk`` (realised volatility and drawdown, its head on its own SGD
step, :mod:`cudarl.auxiliary.risk`), ``denoise`` (a denoising autoencoder's reconstruction on its own SGD
step, :mod:`cudarl.auxiliary.denoise`).

A signal's loss phase usually forks onto ``buffers.side_aux`` (a branch beside the main chain that the
backward joins before it reads the heads' gradients); a signal with its own optimiser step also has
``update_phases()``, placed after the backward and before the shared Adam.
"""

from __future__ import annotations

from typing import Protocol

from ..rules.base import LearnerBuffers, Phase


class AuxSignal(Protocol):
    """What the agent asks of an auxiliary signal. Construction takes the run's config; nothing is
    allocated after :meth:`allocate` (graph capture, DESIGN.md rule 9)."""

    name: str

    def make_head(self, d: int):
        """Its head on ``psi [B, d]`` (a :class:`cudarl.nn.Module` named ``aux.<name>``, with a
        ``grad_name``), or None for a signal without parameters. Its output is
        ``online.forward(...)[name]`` and the gradient the loss phase writes is
        ``online.grad_outputs(ws)[name]``; the backward adds its dL/dpsi to the head's."""

    def allocate(self, buffers: LearnerBuffers) -> None:
        """Make every buffer the loss phase and the observable use (before any capture)."""

    def phases(self) -> list[Phase]:
        """Its loss phase(s) in the train graph, after the head rule's learn phases: they read this step's
        forward (``buffers.ws``, the batch) and write its head's gradient over the first B rows."""

    def update_phases(self) -> list[Phase]:
        """Optional: phases after the backward and before the shared Adam (an optimiser step of its own
        on the gradients the backward wrote). The agent calls it only where the signal defines it."""

    def observable(self) -> dict[str, float]:
        """Host values for ``metrics.jsonl`` (keys ``aux.<name>.<what>``), read when a row is logged,
        outside any capture (a synchronising read is allowed there)."""

    def state_dict(self) -> dict:
        """Its own state for a checkpoint (``{}`` when it has none)."""

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""


from .denoise import Denoise  # noqa: E402 (after the protocol they implement)
from .horizons import Horizons  # noqa: E402
from .risk import Risk  # noqa: E402


def update_phases(signal) -> list[Phase]:
    """A signal's :meth:`AuxSignal.update_phases`, or none where it defines no optimiser step of its own
    (the method is optional, so a signal with only a loss phase need not write it)."""
    own = getattr(signal, "update_phases", None)
    return list(own()) if own is not None else []


#: Auxiliary signals by name (``agent.aux``): ``factory(cfg) -> AuxSignal``.
AUX_SIGNALS: dict[str, type] = {"horizons": Horizons, "risk": Risk, "denoise": Denoise}

__all__ = ["AUX_SIGNALS", "AuxSignal", "update_phases"]
