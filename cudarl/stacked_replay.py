"""``StackedPrioritizedReplay``: P members' prioritized replays in stacked buffers (a population's agents).

Every buffer of :class:`cudarl.replay.PrioritizedReplay` gains a leading axis of ``P`` members: the state
rows ``[P, C, D]``, the per-slot arrays ``[P, C]``, the sum trees ``[P, nodes]`` (one layout: ``levels`` is
shared), the flag scratch ``[P, FLAG_WORDS]`` and each device scalar ``[P]`` (added, step, max_q, status,
beta and the Philox key ``seed``: :class:`cudarl.pinned.MemberScalars`). Each method is one launch per
operation for every member (the kernels' ``blockIdx.y`` is the member; docs/perf-notes.md "The agent
axis, in stages", stage 5), and member ``i`` gets the bits of a :class:`PrioritizedReplay` with
``seed=seeds[i]`` fed member ``i``'s rows: its draws are keyed by its own seed and counted by its own
step, so they do not depend on ``P`` or on its index. The feature matrix the windows are gathered from
is one copy for every member.

One spec for every member: capacity, row width, n-step, environments, alpha, eps and the beta schedule
(the kernels take them by value; members that differ in them are not one stacked replay yet).
"""

from __future__ import annotations

import numpy as np

from .pinned import MemberScalars
from .reference import replay as _ref
from .replay import STATUS_NAMES, PrioritizedReplay


class StackedPrioritizedReplay(PrioritizedReplay):
    """:class:`PrioritizedReplay` over ``members`` members in stacked buffers.

    Args:
        members: P (>= 1).
        seeds: P Philox keys, member ``i``'s the ``seed`` of the replay it equals.
        The other arguments are :class:`PrioritizedReplay`'s (one value for every member).

    The methods are :class:`PrioritizedReplay`'s with a leading member axis on every batch array: ``add``
    takes obs ``[P, B, D]`` and action, reward, discount ``[P, B]`` (the same ``B`` for every member);
    ``sample`` returns indices and weights ``[P, B]`` and gathers into a :class:`cudarl.replay.Batch` of
    ``[P, B, ...]`` arrays, the windows into ``windows_out [P, 2B, width]``; ``update_priorities`` takes
    ``[P, B]``. :meth:`added`, :meth:`size` and :meth:`ready` are ``[P]`` arrays, :meth:`status` one list of
    names per member. Checkpoints per member are not built (``state_dict`` refuses).
    """

    def __init__(self, members: int, capacity: int, obs_dim: int, *, seeds, **kw):
        if isinstance(members, bool) or not isinstance(members, (int, np.integer)) or int(members) < 1:
            raise ValueError(f"members: expected an integer >= 1, got {members!r}")
        if "seed" in kw:
            raise ValueError("seed: a stacked replay takes seeds, one per member")
        seeds = np.asarray(seeds)
        if seeds.shape != (int(members),) or seeds.dtype.kind not in "iu" or np.any(seeds < 0):
            raise ValueError(f"seeds: expected {int(members)} non-negative integers, got {seeds!r}")
        self._members = int(members)
        self._seeds = (seeds.astype(np.uint64) & np.uint64(0xFFFFFFFFFFFFFFFF)).astype(np.uint64)
        super().__init__(capacity, obs_dim, **kw)

    @property
    def _lead(self) -> tuple:
        return (self._members,)

    _form = "P, "

    def _new_scalars(self, spec: dict, xp, initial: dict):
        return MemberScalars(spec, self._members, xp, initial={**initial, "seed": self._seeds})

    @property
    def members(self) -> int:
        """P."""
        return self._members

    @property
    def seeds(self) -> np.ndarray:
        """The members' Philox keys, uint64 ``[P]``."""
        return self._seeds.copy()

    def member_spec(self, i: int) -> _ref.ReplaySpec:
        """The :class:`cudarl.reference.replay.ReplaySpec` of the replay member ``i`` equals (its own seed)."""
        from dataclasses import replace

        return replace(self.spec, seed=int(self._seeds[i]))

    def added(self) -> np.ndarray:
        """Rows ever added, int64 ``[P]`` (a device read)."""
        return self._scalars.get("added").astype(np.int64)

    def size(self) -> np.ndarray:
        """Rows held, ``min(added, capacity)``, ``[P]`` (a device read)."""
        return np.minimum(self.added(), self.capacity)

    def ready(self) -> np.ndarray:
        """Rows that can be sampled, ``[P]`` (a device read)."""
        return np.array([_ref.ready_count(self.capacity, self.spec.lag, int(a)) for a in self.added()], np.int64)

    def status(self) -> list[list[str]]:
        """Each member's sticky status bits, as names (a device read)."""
        return [[name for bit, name in STATUS_NAMES.items() if int(s) & bit] for s in self._scalars.get("status")]

    def state_dict(self) -> dict:
        raise NotImplementedError("StackedPrioritizedReplay: checkpoints per member are not built")

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError("StackedPrioritizedReplay: checkpoints per member are not built")
