"""``StepStats``: the observables a train step computes on the device, published for the host.

Every update the train graph writes named float32 blocks into one device vector (the head's Q
statistics, the plan head's gate, the offline regularisers' losses) and, as its last phase,
copies the vector into slot ``step % slots`` of a pinned ring (``agent.publish_row``), as the
loss and gradient norm are published. The host reads a slot one step late, after the event the
monitor records with the update's launch (:class:`cudarl.pinned.PinnedReadback`): no host sync
inside a step, and nothing read before the device wrote it (DESIGN.md rules 4 and 8).

Blocks are declared before anything is allocated (``StepStats({"q": 2 * A + 2, "plan": 2})``);
a producer writes into :meth:`view` inside its phase. :meth:`decode` turns a slot read by the host
into the metrics row's keys (``metrics.jsonl``, docs/metrics.md).
"""

from __future__ import annotations

import math

import numpy as np

from .backend import family
from .pinned import PinnedReadback
from .reference import qstats as _qstats


class StepStats:
    """Named float32 blocks of one device vector, published each update to a pinned ring.

    Args:
        blocks: ``{name: length}`` in the order they are laid out.
        n_actions: A (decodes the ``q`` block, :func:`cudarl.reference.qstats.layout`).
        xp: ``numpy`` or ``cupy``; slots: ring slots (the train step's ``PUBLISH_SLOTS``).

    Attributes: ``values`` (float32 ``[n]`` on the device, NaN until written), ``ring``
    (:class:`cudarl.pinned.PinnedReadback` of ``n`` floats a slot).
    """

    def __init__(self, blocks: dict, n_actions: int, xp, slots: int):
        self.offsets: dict[str, tuple[int, int]] = {}
        n = 0
        for name, length in blocks.items():
            self.offsets[name] = (n, n + int(length))
            n += int(length)
        self.n, self.n_actions, self.slots, self.xp = n, int(n_actions), int(slots), xp
        self.values = xp.full(n, np.nan, np.float32)
        self.ring = PinnedReadback(n, np.float32, xp, slots=self.slots)
        self.ops = family("agent", xp)

    def view(self, name: str):
        """The device block ``name`` (float32 ``[length]``) a producer writes."""
        lo, hi = self.offsets[name]
        return self.values[lo:hi]

    def publish(self, step) -> None:
        """Copy :attr:`values` into ring slot ``step[0] % slots`` (``step``: the optimiser's int64 counter)."""
        self.ops.publish_row(self.ring.device, self.values, step, self.slots)

    def read(self, step: int) -> dict:
        """The metrics of update ``step`` (waits on its slot's event; see :meth:`decode`)."""
        return self.decode(self.ring.read(step % self.slots))

    def decode(self, raw) -> dict:
        """Metric keys from one slot: ``atom_entropy``, ``atom_utilisation`` (None for a head without
        atoms), ``q_var`` (the batch variance of each action's expected Q, averaged over actions) and
        ``q_var_by_action``; the plan head's ``plan_ready`` (share of the batch whose readiness opens
        the gate) and ``plan_scale`` (the batch's mean position scale); ``cql_loss``, ``iql_loss``."""
        out = {}
        for name, (lo, hi) in self.offsets.items():
            out.update(DECODERS[name](np.asarray(raw[lo:hi], np.float64), self.n_actions))
        return out


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _q(v, A):
    L = _qstats.layout(A)
    var = [_num(x) for x in v[L["var_q"]]]
    finite = [x for x in var if x is not None]
    return {
        "atom_entropy": _num(v[L["entropy"]]),
        "atom_utilisation": _num(v[L["utilisation"]]),
        "q_var": sum(finite) / len(finite) if finite else None,
        "q_var_by_action": var,
    }


#: How each block becomes metric keys.
DECODERS = {
    "q": _q,
    "plan": lambda v, A: {"plan_ready": _num(v[0]), "plan_scale": _num(v[1])},
    "cql": lambda v, A: {"cql_loss": _num(v[0])},
    "iql": lambda v, A: {"iql_loss": _num(v[0])},
}
