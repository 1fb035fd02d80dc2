"""The replay's constants and arrays: the fixed-point scale, the status bits, :class:`ReplaySpec` (what a
launch bakes in), :class:`ReplayBuffers` (every array the ops read and write) and the ring's readiness
arithmetic (``added`` is the one counter: ``write_pos = added mod C``, ``size = min(added, C)``)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .._members import over_members

SCALE_BITS = 24
#: Fixed-point scale of a leaf: ``q = rint(p**alpha * SCALE)``.
SCALE = float(1 << SCALE_BITS)
#: Largest leaf (``p**alpha <= 65536``); larger priorities are clamped.
Q_MAX = 1 << 40
FANOUT = 32
STATUS_EMPTY = 1  # sample() on a buffer with no ready row
STATUS_BAD_TD = 2  # update_priorities() met a non-finite td (priority left unchanged)
STATUS_BAD_INDEX = 4  # update_priorities() or gather() met an index outside [0, capacity) (skipped / zero row)
STATUS_BAD_ROWS = 8  # insert() met non-finite values, discount outside [0, 1] or action < 0 (batch rejected)
#: Words of the int64 ``flag`` scratch: the reject flag of the insert in progress, then the
#: arrival counters of the two insert kernels (the device's; 0 between launches).
FLAG_REJECT, FLAG_WORDS = 0, 3
STATUS_NAMES = {
    STATUS_EMPTY: "sampled an empty buffer",
    STATUS_BAD_TD: "non-finite td skipped",
    STATUS_BAD_INDEX: "out-of-range index skipped",
    STATUS_BAD_ROWS: "bad rows rejected",
}


@dataclass(frozen=True)
class ReplaySpec:
    """The constants of one buffer (baked into launches; nothing here changes between replays).

    Attributes:
        capacity: rows in the ring, ``C``.
        obs_dim: features per observation row, ``D``.
        n_step: ``n`` of the n-step return.
        n_envs: ``E``, environments interleaved time-major in the ring.
        alpha: priority exponent.
        eps: added to ``|td|`` before the exponent.
        beta0, beta_final, beta_steps: the importance-weight exponent schedule.
        seed, stream_id: the Philox key and stream of the sampler.
        store_next_obs: rows carry their own next observation (ring ``next_obs``); needs ``n == 1``.
    """

    capacity: int
    obs_dim: int
    n_step: int
    n_envs: int
    alpha: float
    eps: float
    beta0: float
    beta_final: float
    beta_steps: int
    seed: int
    stream_id: int
    store_next_obs: bool = False

    def __post_init__(self):
        if self.store_next_obs and self.n_step != 1:
            raise ValueError(f"store_next_obs: requires n_step == 1, got n_step={self.n_step}")

    @property
    def lag(self) -> int:
        """Rows between a row and its bootstrap row: ``n * E``; 0 with ``store_next_obs`` (the
        bootstrap observation is the row's own stored ``next_obs``)."""
        return 0 if self.store_next_obs else self.n_step * self.n_envs


@dataclass
class ReplayBuffers:
    """Every array of one buffer (NumPy or CuPy), as the ops read and write them.

    Attributes:
        obs: float32 ``[C, D]``; action: int32 ``[C]``; reward: float32 ``[C]``;
        discount: float32 ``[C]`` (``gamma`` normally, 0 where the episode ended after this step).
        tree: int64 ``[tree_nodes(C)]``, leaves first (``tree_layout``).
        levels: int64 ``[depth + 1]``, the level offsets of ``tree``.
        owner: int32 ``[C]``, all -1 between launches (scratch of ``update_priorities``).
        flag: int64 ``[FLAG_WORDS]`` scratch: ``flag[FLAG_REJECT]`` is ``insert``'s reject flag;
            the other words are the insert kernels' arrival counters (0 between launches).
        added, step, max_q, status: int64 ``[1]`` device scalars; beta: float64 ``[1]``, the
        last beta used; seed: uint64 ``[1]``, the sampler's Philox key (``spec.seed`` for one buffer).
        next_obs: float32 ``[C, D]`` with ``store_next_obs``, else ``None`` (never launched on).

    Members (a population's agents, :meth:`member`): every array but ``levels`` (one capacity, one
    layout) has a leading axis of ``P``: rows ``[P, C, D]``, ``[P, C]``, ``tree [P, nodes]``,
    ``flag [P, FLAG_WORDS]``, each device scalar ``[P]`` (a seed per member).
    """

    obs: object
    action: object
    reward: object
    discount: object
    tree: object
    levels: object
    owner: object
    flag: object
    added: object
    step: object
    max_q: object
    status: object
    beta: object
    seed: object
    next_obs: object = None

    @property
    def leaves(self):
        return self.tree[: self.owner.shape[0]]

    @property
    def members(self) -> int | None:
        """``P`` when the buffers have the member axis (``tree [P, nodes]``), else None."""
        return int(self.tree.shape[0]) if self.tree.ndim == 2 else None

    def member(self, i: int) -> ReplayBuffers:
        """Member ``i``'s buffers as one buffer's (views: writes reach the stacked arrays): row ``i`` of each
        array, a 1-element view of each device scalar, ``levels`` shared."""
        one = {}
        for f in fields(self):
            a = getattr(self, f.name)
            if a is None or f.name == "levels":
                one[f.name] = a
            elif f.name in SCALARS:
                one[f.name] = a[i : i + 1]
            else:
                one[f.name] = a[i]
        return ReplayBuffers(**one)


#: The device scalars of :class:`ReplayBuffers` (``[1]``, or ``[P]`` with the member axis).
SCALARS = ("added", "step", "max_q", "status", "beta", "seed")


def members(*shared: str):
    """Give a twin ``fn(spec, bufs, ...)`` the member axis: when ``bufs`` has it (:attr:`ReplayBuffers.members`),
    run ``fn`` once per member ``i`` on ``bufs.member(i)`` and row ``i`` of every other array argument
    (``[P, ...]``), the arguments named in ``shared`` (the feature matrix, ...) and the non-arrays as given;
    otherwise it is the single call. Member ``i`` is then the single call's result by construction, as the
    kernels' ``blockIdx.y`` makes it on the GPU."""

    def split(fn, a):
        P = a["bufs"].members
        if P is None:
            return None
        rows = [k for k, v in a.items() if k not in ("spec", "bufs", *shared) and hasattr(v, "ndim")]
        bad = [k for k in rows if a[k].ndim < 1 or a[k].shape[0] != P]
        if bad:
            raise ValueError(f"{fn.__name__}: {bad} must have the member axis of {P} members, as bufs has")
        return [dict(a, bufs=a["bufs"].member(i), **{k: a[k][i] for k in rows}) for i in range(P)]

    return over_members(split)


def ready_slots(capacity: int, lag: int, added: int) -> np.ndarray:
    """Slots of the ready rows: absolute rows ``[max(0, added - C), added - lag)`` mod C."""
    return np.arange(max(0, added - capacity), max(0, added - lag)) % capacity


def ready_count(capacity: int, lag: int, added: int) -> int:
    """``len(ready_slots(capacity, lag, added))`` without building it."""
    return max(0, (added - lag) - max(0, added - capacity))
