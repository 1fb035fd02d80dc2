"""``vaccine``: Gradient Vaccine (Wang, Tsvetkov, Firat & Cao, ICLR 2021) between the auxiliary heads'
gradient and the main loss's gradient on the shared encoder.

Equations and our choices: :mod:`cudarl.reference.vaccine`. "Auxiliary" is every signal of
``agent.aux`` that puts a head on the encoder (its name in ``online.extras``); "main" is everything else
that reached the flat gradient before this phase (the head rule's loss, CQL, the plan head, the
homeostatic regulariser, a causal penalty listed before ``vaccine``). With no auxiliary head configured
there is nothing to align, and the configuration is refused. Any head signal is picked up by name, so
the multi-horizon, risk and denoise heads join once registered (list ``vaccine`` after them or not:
the grad phase runs after every loss phase either way).

Which shared parameters (``agent.vaccine_scope``; Wang et al. apply the method at a chosen granularity:
the whole model, per module, per layer): ``encoder``, every ``enc.*`` parameter (:func:`encoder_slice`),
or ``last``, the encoder's last layer (``online.encoder.last_layer``: the MLP's last Linear and its
LayerNorm, the temporal encoders' last output projection and final RMSNorm), one layer as the paper's
per-layer granularity, the one psi comes out of. With ``last`` the auxiliary-only backward stops after
that layer's parameter gradients (:meth:`cudarl.nn.QNetwork.backward`'s ``last_layer``): the heads'
backward and one layer's, not the whole encoder's.

Where it runs (issue 19, the MLP's critical path): its backward with only the auxiliary heads' gradients
(``aux``; through the scope's parameters) runs on a branch of its own beside the step's backward, into a
gradient buffer of its own (:class:`cudarl.auxiliary.base.OwnBackward`) over a workspace that shares the step's
forward at s and has its own copy of every buffer that backward writes
(:meth:`cudarl.nn.params.Workspace.shadow` of :meth:`cudarl.nn.QNetwork.backward_writes`); the Q head's backward
is not run there (its part of dL/dpsi is zero). Where the agent runs the extra heads' backward first (its
``extras_backward`` phase: C51 with a head signal), that backward writes its sum of dL/dpsi into a buffer of
this signal's (:meth:`extras_dpsi`), which the step's backward reads as its Q head's dx GEMM's addend and
nothing writes again in the step, and the branch (:meth:`beside_extras_backward`, forked on the auxiliary
branch) copies it into this workspace (its backward applies the activation's derivative there in place) and runs
the encoder's part alone from there: the copy is on this branch, not the step's chain; else
(:meth:`beside_backward`, forked once the loss branches are joined) it runs the extra heads' backward itself,
the main extra heads' rows zeroed. Either way the same kernels over the same inputs. Phase ``vaccine`` after the
backward, before the optimiser (:meth:`grad_phases`): join that branch - dots_control (the partial dots, then
its last block the control step) - apply (the flat gradient, in place: the scope's slice ``[lo, hi)`` becomes
``full + c (full - aux)``, the rest stays ``full``), in ONE launch with ``run.grid_barrier``
(``dots_control_apply``: its blocks wait for one another at a grid barrier after the partials, then each takes
the control step's sums itself and applies; one node fewer on the step's tail, issue 19) and in those two
without it, the same bits; where the scope's gradients are all written on one branch of the step's backward
(``vaccine_scope = "last"`` on an MLP of two or more layers:
:attr:`cudarl.nn.encoders.Encoder.last_layer_branch`) and this phase comes first after the backward, the two,
with dots_control forked from that branch (after this signal's and causal's branches) beside the rest of the
step's backward, and only the apply after it (:attr:`Vaccine.early`; the same bits), which Adam's one launch
takes with ``run.grid_barrier`` (:meth:`adam_apply`, ``optim.clip_adam_soft_vaccine``; the same bits). Where
causal intervention's grad phase comes right before this one, this phase takes its gradient
(:meth:`takes_addend`): it joins causal's branch too, and its kernels read ``full`` plus causal's over ``[0,
stop)``, every entry where causal's may be nonzero (``dots_control_apply_plus``, or ``dots_control_plus`` and
``apply_plus``: the sums causal's own phase made, one pass over the flat gradient fewer). ``full`` is the flat
gradient as the backward and the grad phases before this one left it, as before; ``aux`` is the same kernels
over the same inputs as the backward this phase once ran on the flat gradient after saving it, so every bit is
as it was. The target cosine ``phi_hat`` is an EMA in device memory (``state[0]``), read and moved by the
control step inside the graph; it is checkpointed.
Observables: ``aux.vaccine.cos`` (phi), ``aux.vaccine.target`` (phi_hat after the step),
``aux.vaccine.coef`` (c), ``aux.vaccine.norm_main``, ``aux.vaccine.norm_aux``.

What is kept in device memory between steps: the target cosine ``phi_hat`` (``state[0]``), and nothing
else. No gradient of a previous step is kept. Issue 19 (item 5) says "keep the previous step's gradient
in a device buffer, inside the graph"; that wording follows the seed system, whose vaccine read a
snapshot of the previous update's gradient (``prev_grad_buf``, taken after Adam) instead of running a
pass of its own. Wang et al. compare the tasks' gradients of the same parameters at the same step, and
what they carry across steps is the EMA of the cosine (their eq. 5): that is the state this phase keeps.
A previous step's gradient is the sum of both losses' gradients at the previous weights, neither
task's gradient now, so its cosine with this step's auxiliary gradient would not be the paper's ``phi``.
We pay for the same-step gradients with the second backward (with ``vaccine_scope = "last"`` it stops
after one layer). The other buffers of the phase (``OwnBackward.grads`` on ``[lo, hi)``: this step's
auxiliary gradient; ``partial``; ``state[1:]``: this step's phi, c and norms) are rewritten every step
before they are read.
"""

from __future__ import annotations

import numpy as np

from ..backend import family
from ..graph import SideStream
from ..reference import vaccine as ref
from .base import AdamApply, AuxBase, OwnBackward, read

KEYS = ("target", "cos", "coef", "norm_main", "norm_aux")


def encoder_slice(layout, prefix: str = "enc.", names=None) -> tuple[int, int]:
    """``[lo, hi)`` of the flat parameters that are the encoder's (entries named ``enc.*``), or with
    ``names`` of those parameters only (the last layer's); no other entry may lie inside it (the kernels
    work on one slice: a scope whose parameters are not contiguous in the layout is refused)."""
    ours = (lambda n: n.startswith(prefix)) if names is None else set(names).__contains__
    mine = [e for e in layout.entries if ours(e.name)]
    if names is not None and len(mine) != len(set(names)):
        raise ValueError(f"vaccine: no parameter named {sorted(set(names) - {e.name for e in mine})}")
    lo = min(e.offset for e in mine)
    hi = max(e.offset + int(np.prod(e.shape)) for e in mine)
    inside = [e.name for e in layout.entries if not ours(e.name) and lo <= e.offset < hi]
    if inside:
        raise ValueError(f"vaccine: the scope's parameters are not contiguous ({inside} lie inside)")
    return lo, hi


class Vaccine(AuxBase):
    name = "vaccine"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.need(cfg.net.head != "c51+iqn", "the two-head c51+iqn rule is not supported yet")
        self.beta, self.scope = cfg.agent.vaccine_beta, cfg.agent.vaccine_scope

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        xp, online = self.xp, buffers.online
        self.aux_heads = [n for n in self.cfg.agent.aux if n in online.extras]
        self.need(bool(self.aux_heads), "no auxiliary signal with a head in agent.aux: nothing to align")
        self.main_extras = [n for n in online.extras if n not in self.aux_heads]
        self.last_layer = self.scope == "last"
        scope = online.encoder.last_layer if self.last_layer else None
        self.lo, self.hi = encoder_slice(online.layout, names=scope)
        B, ws = buffers.batch_size, buffers.ws
        # its own backward beside the step's: a gradient buffer of its own, a workspace sharing the forward
        # at s with its own gradient rows (those it zeroes, those the backward writes); the auxiliary
        # heads' gradient rows are the step's, which neither backward writes (checked here)
        # (the step's backward writes what the full one writes; this one, what its scope's writes)
        head = online.head
        zeroed = {head.grad_name, *(online.extras[n].grad_name for n in self.main_extras)}
        try:  # C51's raw output too (dL/dva: what the rule's loss writes)
            zeroed.add(head.raw_grad_name())
        except ValueError:
            pass
        written = online.backward_writes() | online.backward_writes(last_layer=True)
        aux_rows = {online.extras[n].grad_name for n in self.aux_heads}
        self.need(not aux_rows & written, f"a backward writes the heads' gradient rows {sorted(aux_rows & written)}")
        self.ws = ws.shadow(zeroed | written)
        # the Q head's backward does not run in this pass (heads="extras"): only the other extra heads' rows
        # need zeros, so that the auxiliary heads' gradients alone reach psi
        self.zeroed = sorted(online.extras[n].grad_name for n in self.main_extras)
        #: Where the agent runs the extra heads' backward first (its extras_backward phase: C51 with a head
        #: signal) and no other extra head writes dL/dpsi, that backward's sum of dL/dpsi is this pass's: it
        #: writes it into extras_sum (extras_dpsi) and this pass copies it and runs the encoder's part alone
        #: (beside_extras_backward); else its own backward of the extra heads, forked with the step's backward
        #: (beside_backward)
        self.after_extras = online.extras_first and not any(online.extras[n].writes_dpsi for n in self.main_extras)
        self.dpsi = f"{online.encoder.out_name}.dout"
        self.extras_sum = xp.zeros(self.ws.rows(self.dpsi, B).shape, np.float32) if self.after_extras else None
        self.extra = OwnBackward(online, xp, B, branches="one")
        self.side = SideStream(xp)
        self.partial = xp.zeros((ref.blocks(self.hi - self.lo), 3), np.float32)
        self.state = xp.zeros(ref.STATE, np.float32)  # phi_hat_0 = 0 (the paper's initial target)
        self.done = xp.zeros(1, np.uint32)  # dots_control's ticket: 0, and left 0 by every launch
        self.barrier = xp.zeros(1, np.uint32)  # dots_control_apply's grid barrier: 0, and left 0 likewise
        self.ops, self.util = family("vaccine", xp), family("util", xp)
        self.addend = None  # causal's gradient, where this phase adds it (takes_addend)
        #: the sums' branch where they fork beside the rest of the step's backward (early)
        self.dots_side = SideStream(xp, gemms=False) if self.last_layer else None
        self.first = False

    @property
    def last_branch(self):
        """The branch of the step's backward that writes every gradient of the scope (the last layer's, on the
        MLP: :attr:`cudarl.nn.encoders.Encoder.last_layer_branch`, given once the agent has set the layers'
        branches), or None."""
        return self.buf.online.encoder.last_layer_branch if self.last_layer else None

    @property
    def early(self) -> bool:
        """Whether the sums (``dots_control``) fork from :attr:`last_branch`, beside the rest of the step's
        backward, and only the apply runs after it: the scope is one branch's gradients and nothing writes the
        flat gradient between the backward and this phase (:meth:`first_after_backward`)."""
        return self.first and self.last_branch is not None

    def first_after_backward(self, first: bool) -> None:
        self.first = bool(first)

    @property
    def folded(self) -> bool:
        """Whether the apply is left to Adam's one launch (:meth:`adam_apply`): the sums forked early, and the
        optimiser's one launch (``run.grid_barrier``, and its grid fits one member's parameters)."""
        n = self.buf.online.params.size
        return self.early and self.cfg.run.grid_barrier and family("optim", self.xp).clip_adam_soft_one_launch(1, n)

    def adam_apply(self):
        # causal's gradient over [0, stop) where folded in (aux, never read, stands for it otherwise), this signal's
        # own over the scope [lo, hi), the coefficient in state[2]: the apply's arguments on the whole flat layout
        if not self.folded:
            return None
        a = self.addend
        plus, stop = (self.extra.grads, 0) if a is None else (a.grads, a.stop)
        return AdamApply(plus, self.extra.grads, self.state, self.lo, self.hi, stop)

    def grad_phases(self) -> list:
        return [("vaccine", self._phase)]

    def takes_addend(self, addend) -> bool:
        # the addend covers the scope's slice: [0, stop) holds [lo, hi) (the extra heads come last)
        self.addend = addend if addend.stop >= self.hi else None
        return self.addend is not None

    def grad_span(self) -> tuple[int, int]:
        # its kernels read and write the scope's slice, or with an addend every entry it may be nonzero at; no
        # parameter (its own backward, which reads them, is its branch: grad_branches)
        return (self.lo, self.hi) if self.addend is None else (0, self.addend.stop)

    def grad_branches(self) -> list:
        return [self.side] + ([] if self.addend is None else [self.addend.side])

    def extras_dpsi(self):
        return self.extras_sum

    def beside_extras_backward(self) -> None:
        # on the auxiliary branch right after the extra heads' backward (the agent's extras_backward phase),
        # which wrote their sum of dL/dpsi into extras_sum (the step's backward reads it as its addend, and
        # nothing writes it again this step); forked: copied into this pass's row (its backward's activation
        # derivative goes there in place), then the encoder's part alone: no dx GEMM of the heads again, and
        # it starts before the step's backward (docs/perf-notes.md, thirty-second session); the same bits as
        # the heads' own backward here
        if not self.after_extras:
            return
        buf, B, mine = self.buf, self.buf.batch_size, self._share_forward()
        with self.side.fork():
            self.util.copy_u32(mine.rows(self.dpsi, B).view(np.uint32), self.extras_sum.view(np.uint32))
            self.extra.run(buf.batch.obs, mine, B, last_layer=self.last_layer, heads="none")

    def beside_backward(self) -> None:
        # forked when the step's backward begins (the loss branches joined): it reads the forward at s and
        # the auxiliary heads' gradient rows, which the step's backward only reads, and the parameters
        # (nothing moves them before the grad phase joins it); it writes its own rows and gradient only
        if self.after_extras:
            return
        buf, B, mine = self.buf, self.buf.batch_size, self._share_forward()
        with self.side.fork():
            for name in self.zeroed:  # only the auxiliary heads' gradients reach psi
                self.util.fill_u32(mine.rows(name, B).view(np.uint32), 0)
            # the Q head's part is zero here: its backward (a dueling backward and a dx GEMM over zero rows,
            # on this branch's chain) is not run (docs/perf-notes.md, thirty-second session)
            self.extra.run(buf.batch.obs, mine, B, last_layer=self.last_layer, heads="extras")

    def _share_forward(self):
        """This pass's workspace over the step's forward at s (its own gradient rows), at the batch's rows."""
        ws, mine = self.buf.ws, self.ws
        mine.x, mine.raw_head, mine.heads = ws.x, ws.raw_head, ws.heads
        mine.set_batch(self.buf.batch_size)
        return mine

    def _phase(self) -> None:
        # the scope's slice of both gradients, nothing outside it (the own SGD steps may run beside this
        # phase on the rest of the flat gradient: grad_span); the kernels index from the view's start, so the
        # bits are those of the whole arrays with [lo, hi). With causal's gradient (takes_addend): the view
        # [0, stop), every entry where it may be nonzero, added on the fly by both kernels
        a = self.addend
        lo, hi = (0, self.hi - self.lo) if a is None else (self.lo, self.hi)
        at = slice(self.lo, self.hi) if a is None else slice(0, a.stop)
        full, aux = self.buf.online.grads[at], self.extra.grads[at]
        fulls = (full,) if a is None else (full, a.grads[at])
        o = self.ops  # the launchers, or on NumPy their twins (which return what they write)
        one, dots_control, apply = (
            (o.dots_control_apply, o.dots_control, o.apply)
            if a is None
            else (o.dots_control_apply_plus, o.dots_control_plus, o.apply_plus)
        )
        mine = [self.side] + ([] if a is None else [a.side])  # the branches that write aux (and causal's)
        if self.early:
            # the sums as soon as the scope's gradients are written (the last layer's branch of the step's
            # backward), its own backward and causal's: beside the rest of the step's backward, where the one
            # launch held the tail after it (issue 19); only the apply after it. The two launches' bits.
            with self.last_branch.resume(), self.dots_side.fork():
                for side in mine:
                    side.wait()
                self._dots_control(dots_control, fulls, aux, lo, hi)
            self.dots_side.join()
        for side in mine:
            side.join()
        if self.folded:
            return  # Adam's one launch applies it (adam_apply)
        if self.early:
            self._apply(apply, fulls, aux, full, lo, hi)
        elif self.cfg.run.grid_barrier:  # one launch: the partials, a grid barrier, the control step, the apply
            if self.numpy:
                self.partial[...], self.state[...], full[...] = one(*fulls, aux, self.state, lo, hi, self.beta)
            else:
                one(*fulls, aux, full, self.partial, self.state, self.barrier, self.done, lo, hi, self.beta)
        else:  # the same bits in two launches, none waiting for all its blocks
            self._dots_control(dots_control, fulls, aux, lo, hi)
            self._apply(apply, fulls, aux, full, lo, hi)

    def _dots_control(self, dots_control, fulls, aux, lo, hi) -> None:
        """The partial sums, then (its last block) the control step: ``partial`` and ``state``. Over views of the
        scope's slice alone (the chunks start at its first entry either way: the same bits), so that the branch
        reads no entry the rest of the step's backward writes beside it."""
        fulls, aux = tuple(f[lo:hi] for f in fulls), aux[lo:hi]
        lo, hi = 0, hi - lo
        if self.numpy:
            self.partial[...], self.state[...] = dots_control(*fulls, aux, self.state, lo, hi, self.beta)
        else:
            dots_control(*fulls, aux, self.partial, self.state, self.done, lo, hi, self.beta)

    def _apply(self, apply, fulls, aux, full, lo, hi) -> None:
        """The flat gradient corrected in place from ``state``'s coefficient."""
        if self.numpy:
            full[...] = apply(*fulls, aux, self.state, lo, hi)
        else:
            apply(*fulls, aux, full, self.state, lo, hi)

    def observable(self) -> dict:
        return {f"aux.vaccine.{k}": v for k, v in zip(KEYS, read(self.state), strict=True)}

    def state_dict(self) -> dict:
        return {"state": read(self.state).astype(np.float32)}

    def load_state_dict(self, state: dict) -> None:
        self.state[...] = self.xp.asarray(np.asarray(state.get("state", np.zeros(ref.STATE)), np.float32))
