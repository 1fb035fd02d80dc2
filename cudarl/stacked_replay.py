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

One spec for every member: capacity, row width, n-step and environments (they shape the buffers and the
kernels take them by value). Alpha, eps and the beta schedule may be each member's own
(:data:`MEMBER_FIELDS`): ``[P]`` device arrays (:attr:`StackedPrioritizedReplay.member_table`) that
``sample_weights_members`` and ``update_priorities_members`` read at the member.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import backend as _backend
from .pinned import MemberScalars, member_index
from .reference import replay as _ref
from .replay import STATUS_NAMES, PrioritizedReplay, priority_constants

#: The arguments a member may set to its own value (one value for every member, or a sequence of P), with
#: the dtype of its ``[P]`` device array (the single kernels' by-value type).
MEMBER_FIELDS = {
    "alpha": np.float64,
    "eps": np.float64,
    "beta0": np.float64,
    "beta_final": np.float64,
    "beta_steps": np.int64,
}


class StackedPrioritizedReplay(PrioritizedReplay):
    """:class:`PrioritizedReplay` over ``members`` members in stacked buffers.

    Args:
        members: P (>= 1).
        seeds: P Philox keys, member ``i``'s the ``seed`` of the replay it equals.
        alpha, eps, beta0, beta_final, beta_steps: one value for every member or a sequence of P (member
            ``i``'s the argument of the replay it equals; :data:`MEMBER_FIELDS`).
        The other arguments are :class:`PrioritizedReplay`'s (one value for every member).

    The methods are :class:`PrioritizedReplay`'s with a leading member axis on every batch array: ``add``
    takes obs ``[P, B, D]`` and action, reward, discount ``[P, B]`` (the same ``B`` for every member);
    ``sample`` returns indices and weights ``[P, B]`` and gathers into a :class:`cudarl.replay.Batch` of
    ``[P, B, ...]`` arrays, the windows into ``windows_out [P, 2B, width]``; ``update_priorities`` takes
    ``[P, B]``. :meth:`added`, :meth:`size` and :meth:`ready` are ``[P]`` arrays, :meth:`status` one list of
    names per member. :meth:`state_dict` holds every member's state (:meth:`member_state_dict` one member's,
    as the single replay's :meth:`PrioritizedReplay.state_dict`).
    """

    def __init__(self, members: int, capacity: int, obs_dim: int, *, seeds, **kw):
        if isinstance(members, bool) or not isinstance(members, (int, np.integer)) or int(members) < 1:
            raise ValueError(f"members: expected an integer >= 1, got {members!r}")
        if "seed" in kw:
            raise ValueError("seed: a stacked replay takes seeds, one per member")
        seeds = np.asarray(seeds)
        if seeds.shape != (int(members),) or seeds.dtype.kind not in "iu" or np.any(seeds < 0):
            raise ValueError(f"seeds: expected {int(members)} non-negative integers, got {seeds!r}")
        self._members = P = int(members)
        self._seeds = (seeds.astype(np.uint64) & np.uint64(0xFFFFFFFFFFFFFFFF)).astype(np.uint64)
        per = {}
        for k in MEMBER_FIELDS:
            if k in kw and np.ndim(kw[k]):
                v = list(kw.pop(k))
                if len(v) != P:
                    raise ValueError(f"{k}: one value or {P} (one per member), got {len(v)}")
                per[k] = v
        super().__init__(capacity, obs_dim, **kw, **{k: v[0] for k, v in per.items()})
        #: member ``i``'s :class:`cudarl.reference.replay.ReplaySpec` (its seed, alpha, eps and beta schedule);
        #: each is validated as a single replay's arguments
        self._specs = []
        for i in range(P):
            own = {k: v[i] for k, v in per.items()}
            if own:
                base = {k: getattr(self.spec, k) for k in MEMBER_FIELDS}
                own = {k: v for k, v in priority_constants(**{**base, **own}).items() if k in per}
            self._specs.append(replace(self.spec, seed=int(self._seeds[i]), **own))
        xp = self.xp
        #: each member's :data:`MEMBER_FIELDS` as ``[P]`` device arrays (read by the ``_members`` kernels)
        self.member_table = {
            k: xp.asarray(np.array([getattr(sp, k) for sp in self._specs], dt)) for k, dt in MEMBER_FIELDS.items()
        }
        # beta starts at each member's beta0, the running maximum at its initial_priority ** alpha
        self._scalars.set("beta", [sp.beta0 for sp in self._specs])
        ip = float(kw.get("initial_priority", 1.0))
        self._scalars.set("max_q", [int(_ref.quantize(ip**sp.alpha)) for sp in self._specs])

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
        """The :class:`cudarl.reference.replay.ReplaySpec` of the replay member ``i`` equals (its own seed,
        alpha, eps and beta schedule)."""
        return self._specs[member_index(i, self._members)]

    def _sample_weights(self, qsel, w) -> None:
        t = self.member_table
        self._ops.sample_weights_members(self.spec, self.bufs, qsel, w, t["beta0"], t["beta_final"], t["beta_steps"])

    def _update_priorities(self, indices, td) -> None:
        t = self.member_table
        self._ops.update_priorities_members(self.spec, self.bufs, indices, td, t["alpha"], t["eps"])

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

    # --- state --------------------------------------------------------------------------------
    @property
    def _member_keys(self) -> tuple[str, ...]:
        """The :meth:`state_dict` entries with a leading member axis (the others are one for all)."""
        return (*self._row_names, "priorities", "added", "step", "max_priority", "status", "write_pos", "size")

    def state_dict(self) -> dict:
        """:meth:`PrioritizedReplay.state_dict` with a leading member axis on each member's entries (rows
        ``[P, C, ...]``, priorities int64 ``[P, C]``, the counters int64 ``[P]``), the constants once, and
        ``members`` and ``seeds`` (uint64 ``[P]``) for the compatibility check. NumPy values only."""
        C = self.capacity
        sc = {k: self._scalars.get(k).astype(np.int64) for k in ("added", "step", "max_q", "status")}
        state = {name: _backend.to_numpy(getattr(self.bufs, name)).copy() for name in self._row_names}
        state["priorities"] = _backend.to_numpy(self.bufs.tree[:, :C]).copy()
        state.update(added=sc["added"], step=sc["step"], max_priority=sc["max_q"], status=sc["status"])
        state.update(write_pos=sc["added"] % C, size=np.minimum(sc["added"], C))
        return {**state, **self._state_constants(), "members": self._members, "seeds": self.seeds}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`: every member is checked as :meth:`PrioritizedReplay.load_state_dict`
        checks one before anything is written; ``members`` and ``seeds`` must be this replay's."""
        P = self._members
        if "members" not in state or int(state["members"]) != P:
            raise ValueError(f"state['members']: {state.get('members')} does not match this replay's {P}")
        seeds = np.asarray(state.get("seeds", []))
        if seeds.shape != (P,) or not np.array_equal(seeds.astype(np.uint64), self._seeds):
            raise ValueError(f"state['seeds']: {seeds.tolist()} are not this replay's {self._seeds.tolist()}")
        for k in self._member_keys:
            if k in state and np.shape(state[k])[:1] != (P,):
                raise ValueError(f"state[{k!r}]: expected a leading axis of {P} members, got {np.shape(state[k])}")
        rest = {k: v for k, v in state.items() if k not in ("members", "seeds")}
        checked = [
            self._checked_state({k: (v[i] if k in self._member_keys else v) for k, v in rest.items()}) for i in range(P)
        ]
        for i, (arrays, scal) in enumerate(checked):
            self._write_member(i, arrays, scal)
        self._added_host = min(scal["added"] for _, scal in checked)

    def member_state_dict(self, i: int) -> dict:
        """Member ``i``'s state as the :meth:`PrioritizedReplay.state_dict` of the replay it equals (host
        copies): a replay with ``seed=seeds[i]`` loads it and samples what member ``i`` would."""
        i = member_index(i, self._members)
        return self._state_of(self.bufs.member(i), lambda name: self._scalars.get(name)[i])

    def load_member_state_dict(self, i: int, state: dict) -> None:
        """Restore a :meth:`PrioritizedReplay.state_dict` (e.g. a single agent's replay) into member ``i``,
        checked as that method checks it; the other members keep theirs. Member ``i`` keeps its own Philox
        key ``seeds[i]`` (a single replay's state does not hold its seed): it continues as the replay of
        that seed would."""
        i = member_index(i, self._members)
        arrays, scal = self._checked_state(state)
        self._write_member(i, arrays, scal)
        self._added_host = int(self.added().min())

    def _write_member(self, i: int, arrays: dict, scal: dict) -> None:
        self._write_state(self.bufs.member(i), arrays, scal, lambda name, v: self._scalars.set_member(name, i, v))
