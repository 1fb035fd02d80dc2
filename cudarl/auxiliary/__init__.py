"""Auxiliary signals: extra learning signals beside the head's loss, behind one declared interface.

An :class:`AuxSignal` may put a head of its own on the encoder's output (its parameters join the
network's flat buffer, so Adam trains them and the encoder learns from its gradient), runs its loss
phase inside the train graph (after the head rule's, before the backward) and reports an
observable that the trainer writes into ``metrics.jsonl``. ``agent.aux`` names the signals a run
builds from :data:`AUX_SIGNALS`; adding one is its module (and a kernel family's four faces if it
has kernels) plus one line in that registry; :class:`cudarl.auxiliary.base.AuxBase` gives every
method of :class:`AuxSignal` a default, and every built-in signal subclasses it. Built in:

* heads and their own optimiser steps: ``horizons`` (multi-horizon returns,
  :mod:`cudarl.auxiliary.horizons`), ``risk`` (realised volatility and drawdown, its head on its own SGD
  step, :mod:`cudarl.auxiliary.risk`), ``denoise`` (a denoising autoencoder's reconstruction on its own
  SGD step, :mod:`cudarl.auxiliary.denoise`);
* regularisers: ``homeostatic`` (atom utilisation held at a set point), ``causal`` (interventions on
  feature groups that should not matter), ``vaccine`` (Gradient Vaccine between the auxiliary heads'
  gradient and the main loss's on the encoder), ``selectivity`` (a learned, sparse gate on the input
  features or bars).

Where each kind of phase sits in the train graph (:meth:`cudarl.agent.Agent.phases`; docs/architecture.md):
the early phases (:meth:`AuxSignal.early_phases`, right after ``sample``: branches beside the step's
forward) - the loss phases (:meth:`AuxSignal.phases`, most forked onto ``buffers.side_aux`` or a branch of their
own) - the backward (joins those branches) - the grad phases (:meth:`AuxSignal.grad_phases`, in ``agent.aux``
order: causal, vaccine; causal's added inside vaccine's where it comes right before it,
:meth:`AuxSignal.grad_addend`) - ``aux_sgd`` (every signal's own plain-SGD spans, :meth:`AuxSignal.sgd_spans`:
risk's head, denoise's encoder and decoder, in one launch, :class:`cudarl.auxiliary.base.AuxSgd`) - Adam. The
grad phases come first so that they see the whole gradient the backward wrote, the auxiliary heads' included
(the SGD step clears a span's gradient once it has stepped on it), and the SGD step steps on the gradient as
the grad phases left it; only the last grad phases that declare the span of the flat gradient they touch
(:meth:`AuxSignal.grad_span`: vaccine's), where no SGD span lies, run beside the steps instead, which then
see the same values. A grad phase that rewrote a head's gradient would be lost if that head had already
stepped.
"""

from __future__ import annotations

from typing import Protocol

from ..rules.base import LearnerBuffers, Phase
from .base import AdamApply, GradAddend, SgdSpan


class AuxSignal(Protocol):
    """What the agent asks of an auxiliary signal. Construction takes the run's config; nothing is
    allocated after :meth:`allocate` (graph capture, DESIGN.md rule 9)."""

    name: str
    #: Whether a phase of it before the backward reads what the ``q_stats`` phase writes (``buffers.q_s``,
    #: the Q head's logits at ``s``): then the main stream joins ``q_stats``' branch (beside the rule's learn
    #: phases) before it; when no phase reads them before the step's end, that branch runs beside the
    #: backward too (:meth:`cudarl.agent.Agent.q_stats`, :meth:`cudarl.agent.Agent.q_stats_join`).
    reads_q_stats: bool

    def make_head(self, d: int):
        """Its head on ``psi [B, d]`` (a :class:`cudarl.nn.Module` named ``aux.<name>``, with a
        ``grad_name``), or None for a signal without parameters. Its output is
        ``online.forward(...)[name]`` of a forward that runs it (``heads``: the train step's forward at s
        runs every extra head, its forwards at s' and acting none but the plan head) and the gradient
        the loss phase writes is ``online.grad_outputs(ws)[name]``; the backward adds its dL/dpsi to the
        head's. In the train step the extra heads run on a branch beside the Q head's forward, which the
        agent's ``q_stats_join`` phase joins (:meth:`cudarl.nn.QNetwork.branch_extras`): a loss phase reads the
        output as it is."""

    def make_input_gate(self, n_in: int):
        """A module on the network's input before the encoder (``input_gate`` of
        :class:`cudarl.nn.QNetwork`), or None (every signal but ``selectivity``). At most one signal of a
        run has one."""

    def allocate(self, buffers: LearnerBuffers) -> None:
        """Make every buffer the loss phase and the observable use (before any capture)."""

    def early_phases(self) -> list[Phase]:
        """Its phase(s) right after the ``sample`` phase, before the step's forward: work that reads only
        the batch (``buffers.batch``, as sample wrote it) and the online parameters (nothing moves them
        before Adam), forked onto a branch of the signal's own so that it runs beside the forward, the
        rule's learn phases and ``q_stats``; a later phase of the signal forks that branch again
        (:meth:`cudarl.graph.SideStream.fork`: the branch then also waits for what the main stream has
        done by then) before it reads the step's forward. Most signals have none
        (:class:`cudarl.auxiliary.base.AuxBase`'s default); causal intervention's intervened forward is
        one (C51)."""

    def phases(self) -> list[Phase]:
        """Its loss phase(s) in the train graph, after the head rule's learn phases: they read this step's
        forward (``buffers.ws``, the batch) and write its head's gradient over the first B rows."""

    def grad_phases(self) -> list[Phase]:
        """Its phase(s) after the backward and before the optimiser: they may read and rewrite the
        step's flat gradient (``buffers.online.grads``); most signals have none
        (:class:`cudarl.auxiliary.base.AuxBase`'s default). Gradient Vaccine corrects it with the backward
        of its own it ran beside the step's (:meth:`beside_backward`); causal intervention adds the
        gradient of the backward it ran on its loss branch, into a buffer of its own
        (:class:`cudarl.auxiliary.base.OwnBackward`), beside the step's."""

    def grad_span(self) -> tuple[int, int] | None:
        """The range ``[a, b)`` of the flat gradient its grad phases read and write, where they touch nothing
        else of it and read no parameter: the signals' own SGD steps (``aux_sgd``), whose spans lie outside
        it, may then run beside them, on a branch Adam joins, after :meth:`grad_branches`
        (:meth:`cudarl.agent.Agent._sgd_beside`: Gradient Vaccine's, the encoder's slice). None (the
        default): anything."""

    def grad_branches(self) -> list:
        """The branches (:class:`cudarl.graph.SideStream`) its grad phases join, which may read parameters
        (Gradient Vaccine's own backward): the own SGD steps beside those phases wait for them."""

    def first_after_backward(self, first: bool) -> None:
        """Told, before any capture, whether its grad phases come first after the step's backward (``first``:
        nothing writes the flat gradient between the backward and them; the agent tells every signal with a
        grad phase, in their order). Gradient Vaccine then forks its sums from the branch that writes the
        last layer's gradients (:attr:`cudarl.nn.encoders.Encoder.last_layer_branch`), beside the rest of the
        backward. The default ignores it."""

    def adam_apply(self) -> AdamApply | None:
        """An elementwise correction of the flat gradient its grad phase leaves to the optimiser's one launch, which
        applies it on the fly as it reads the gradient (:class:`cudarl.auxiliary.base.AdamApply`,
        ``optim.clip_adam_soft_vaccine``: Gradient Vaccine's apply, where its sums forked early and
        ``run.grid_barrier`` is on: one node fewer on the step's tail), or None (the default). At most one signal
        gives one."""

    def grad_addend(self) -> GradAddend | None:
        """Where its one grad phase only adds a gradient of its own onto the flat gradient (causal
        intervention's :class:`cudarl.auxiliary.base.OwnBackward`), that gradient
        (:class:`cudarl.auxiliary.base.GradAddend`), which the signal whose grad phase comes right after may
        add inside its own kernels instead (:meth:`takes_addend`); None (the default) otherwise."""

    def takes_addend(self, addend: GradAddend) -> bool:
        """Offered the :meth:`grad_addend` of the signal whose grad phase comes right before its own: True, its
        grad phase joins ``addend.side`` and adds ``addend.grads`` to the flat gradient in its own kernels
        (the same float32 sums), and the agent does not run that signal's grad phase (one pass over the flat
        gradient fewer: Gradient Vaccine takes causal's). The default declines."""

    def beside_extras_backward(self) -> None:
        """Work enqueued on the auxiliary branch right after the extra heads' backward (the agent's
        ``extras_backward`` phase, where it has one: C51 with a head signal), which has written their sum of
        dL/dpsi (into :meth:`extras_dpsi`, or ``buffers.ws``), before the step's backward (which joins that
        branch) adds the Q head's part to it: Gradient Vaccine forks the encoder's part of its backward from
        that sum; most signals have none (:class:`cudarl.auxiliary.base.AuxBase`'s default)."""

    def extras_dpsi(self):
        """A float32 ``[batch, d]`` buffer of its own where the agent's ``extras_backward`` phase writes the extra
        heads' sum of dL/dpsi instead of ``buffers.ws``'s (:meth:`cudarl.nn.QNetwork.backward_extras`' ``dpsi``),
        and which the step's backward then reads as its Q head's dx GEMM's addend, leaving it as it was
        (:meth:`cudarl.nn.QNetwork.backward`'s ``extras_dpsi``): Gradient Vaccine's backward reads that sum
        with no copy on the step's chain. At most one signal may ask; None (the default) asks nothing."""

    def beside_backward(self) -> None:
        """Work forked beside the step's backward, enqueued by the agent's ``backward`` phase once the loss
        branches are joined and before the step's backward (a backward over the forward at s of its own,
        into its own buffers: Gradient Vaccine's), and joined by its grad phase; most signals have none
        (:class:`cudarl.auxiliary.base.AuxBase`'s default)."""

    def sgd_spans(self) -> list[SgdSpan]:
        """The spans of parameters its own optimiser step moves by plain SGD
        (:class:`cudarl.auxiliary.base.SgdSpan`: parameters, gradient, rate, clear, the branch to join
        first). The agent's ``aux_sgd`` phase, after every grad phase and before the shared Adam, steps
        every signal's spans in one launch (:class:`cudarl.auxiliary.base.AuxSgd`): it reads the gradient
        the backward (and the grad phases, or the signal's own branch) left, steps the parameters and
        clears it so Adam leaves them alone. Most signals have none
        (:class:`cudarl.auxiliary.base.AuxBase`'s default)."""

    def observable(self) -> dict[str, float]:
        """Host values for ``metrics.jsonl`` (keys ``aux.<name>.<what>``), read when a row is logged,
        outside any capture (a synchronising read is allowed there)."""

    def state_dict(self) -> dict:
        """Its own state for a checkpoint (``{}`` when it has none)."""

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""


from .causal import Causal  # noqa: E402 (the protocol above is what they implement)
from .denoise import Denoise  # noqa: E402
from .homeostatic import Homeostatic  # noqa: E402
from .horizons import Horizons  # noqa: E402
from .risk import Risk  # noqa: E402
from .selectivity import Selectivity  # noqa: E402
from .vaccine import Vaccine  # noqa: E402

#: Auxiliary signals by name (``agent.aux``): ``factory(cfg) -> AuxSignal``.
AUX_SIGNALS: dict[str, type] = {
    "horizons": Horizons,
    "risk": Risk,
    "denoise": Denoise,
    "homeostatic": Homeostatic,
    "causal": Causal,
    "vaccine": Vaccine,
    "selectivity": Selectivity,
}


def input_gate(signals):
    """``make(n_in)`` for :class:`cudarl.nn.QNetwork`'s ``input_gate``: the one signal's gate that has one
    (``selectivity``), else None."""

    def make(n_in: int):
        gates = [g for s in signals if (g := s.make_input_gate(n_in)) is not None]
        if len(gates) > 1:
            raise ValueError(f"agent.aux: {len(gates)} signals put a gate on the input; at most one may")
        return gates[0] if gates else None

    return make


__all__ = [
    "AUX_SIGNALS",
    "AuxSignal",
    "Causal",
    "Denoise",
    "Homeostatic",
    "Horizons",
    "Risk",
    "Selectivity",
    "Vaccine",
    "input_gate",
]
