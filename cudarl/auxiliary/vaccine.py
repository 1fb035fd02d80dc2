"""``vaccine``: Gradient Vaccine (Wang, Tsvetkov, Firat & Cao, ICLR 2021) between the auxiliary heads'
gradient and the main loss's gradient on the shared encoder.

Equations and our choices: :mod:`cudarl.reference.vaccine`. "Auxiliary" is every signal of
``agent.aux`` that puts a head on the encoder (its name in ``online.extras``); "main" is everything else
that reached the flat gradient before this phase (the head rule's loss, CQL, the plan head, the
homeostatic regulariser, a causal penalty listed before ``vaccine``). With no auxiliary head configured
there is nothing to align, and the configuration is refused. Any head signal is picked up by name, so
the multi-horizon, risk and denoise heads join once registered (list ``vaccine`` after them or not:
the grad phase runs after every loss phase either way).

Phase ``vaccine`` after the backward, before the optimiser (:meth:`grad_phases`): save the full gradient
- zero the main outputs' gradients in the workspace - a backward with only the auxiliary heads'
(``aux``) - dots - control - apply (the encoder's slice becomes ``full + c (full - aux)``, the rest
``full``). The target cosine ``phi_hat`` is an EMA in device memory (``state[0]``), read and moved by
the control kernel inside the graph; it is checkpointed. Observables: ``aux.vaccine.cos`` (phi),
``aux.vaccine.target`` (phi_hat after the step), ``aux.vaccine.coef`` (c), ``aux.vaccine.norm_main``,
``aux.vaccine.norm_aux``.
"""

from __future__ import annotations

import numpy as np

from ..backend import family
from ..reference import vaccine as ref
from .base import AuxBase, ExtraBackward, read

KEYS = ("target", "cos", "coef", "norm_main", "norm_aux")


def encoder_slice(layout, prefix: str = "enc.") -> tuple[int, int]:
    """``[lo, hi)`` of the flat parameters that are the encoder's (entries named ``enc.*``); no other
    entry may lie inside it."""
    mine = [e for e in layout.entries if e.name.startswith(prefix)]
    lo = min(e.offset for e in mine)
    hi = max(e.offset + int(np.prod(e.shape)) for e in mine)
    inside = [e.name for e in layout.entries if not e.name.startswith(prefix) and lo <= e.offset < hi]
    if inside:
        raise ValueError(f"vaccine: the encoder's parameters are not contiguous ({inside} lie inside)")
    return lo, hi


class Vaccine(AuxBase):
    name = "vaccine"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.need(cfg.net.head != "c51+iqn", "the two-head c51+iqn rule is not supported yet")
        self.beta = cfg.agent.vaccine_beta

    def allocate(self, buffers) -> None:
        super().allocate(buffers)
        xp, online = self.xp, buffers.online
        self.aux_heads = [n for n in self.cfg.agent.aux if n in online.extras]
        self.need(bool(self.aux_heads), "no auxiliary signal with a head in agent.aux: nothing to align")
        self.main_extras = [n for n in online.extras if n not in self.aux_heads]
        self.lo, self.hi = encoder_slice(online.layout)
        self.extra = ExtraBackward(online, xp)
        self.partial = xp.zeros((ref.blocks(self.hi - self.lo), 3), np.float32)
        self.state = xp.zeros(ref.STATE, np.float32)  # phi_hat_0 = 0 (the paper's initial target)
        self.ops, self.util = family("vaccine", xp), family("util", xp)

    def grad_phases(self) -> list:
        return [("vaccine", self._phase)]

    def _phase(self) -> None:
        buf, online = self.buf, self.buf.online
        B, ws = buf.batch_size, buf.ws
        self.extra.save()
        ws.set_batch(B)
        outs = online.grad_outputs(ws, raw_head=ws.raw_head)
        for name in ("q", *self.main_extras):  # only the auxiliary heads' gradients stay
            self.util.fill_u32(outs[name].view(np.uint32), 0)
        self.extra.run(buf.batch.obs, ws, B)
        full, aux = self.extra.saved, online.grads
        if self.numpy:
            self.partial[...] = ref.dots(full, aux, self.lo, self.hi)
            self.state[...] = ref.control(self.partial, self.state, self.beta)
            aux[...] = ref.apply(full, aux, self.state, self.lo, self.hi)
        else:
            self.ops.dots(full, aux, self.partial, self.lo, self.hi)
            self.ops.control(self.partial, self.state, self.beta)
            self.ops.apply(full, aux, aux, self.state, self.lo, self.hi)

    def observable(self) -> dict:
        return {f"aux.vaccine.{k}": v for k, v in zip(KEYS, read(self.state), strict=True)}

    def state_dict(self) -> dict:
        return {"state": read(self.state).astype(np.float32)}

    def load_state_dict(self, state: dict) -> None:
        self.state[...] = self.xp.asarray(np.asarray(state.get("state", np.zeros(ref.STATE)), np.float32))
