"""Writing the ring: the check that rejects a bad batch whole, then the commit of the rows, of the leaves
they make ready (the running maximum priority) and of those leaves' ancestors."""

from __future__ import annotations

import numpy as np

from .buffers import FLAG_REJECT, STATUS_BAD_ROWS, ReplayBuffers, ReplaySpec, members
from .sumtree import rebuild_ancestors


def _batch_is_bad(obs, action, reward, discount, next_obs=None) -> bool:
    """A non-finite value (obs, reward, discount, next_obs), a discount outside ``[0, 1]`` or a negative action."""
    bad = (
        not np.all(np.isfinite(obs))
        or not np.all(np.isfinite(reward))
        or not np.all(np.isfinite(discount))
        or np.any(discount < 0)
        or np.any(discount > 1)
        or np.any(action < 0)
    )
    return bool(bad or (next_obs is not None and not np.all(np.isfinite(next_obs))))


def _set_reject(bufs: ReplayBuffers, bad: bool) -> None:
    bufs.flag[FLAG_REJECT] = int(bad)
    if bad:
        bufs.status[0] |= STATUS_BAD_ROWS


@members()
def insert_check(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """``flag[FLAG_REJECT] = 1`` (and ``status |= STATUS_BAD_ROWS``) when the batch has a
    non-finite value, a discount outside ``[0, 1]`` or a negative action; else 0."""
    _set_reject(bufs, _batch_is_bad(obs, action, reward, discount))


@members()
def insert_check_next(spec: ReplaySpec, bufs: ReplayBuffers, obs, next_obs, action, reward, discount) -> None:
    """``insert_check`` of a batch that also carries ``next_obs`` float32 ``[B, D]`` (``store_next_obs``):
    a non-finite ``next_obs`` rejects it too."""
    _set_reject(bufs, _batch_is_bad(obs, action, reward, discount, next_obs))


def insert_range(spec: ReplaySpec, added: int, B: int) -> tuple[int, int]:
    """``(lo, a1)``: the absolute rows ``[lo, a1)`` whose leaves an insert of ``B`` rows at ``added``
    sets, ``a1 = added + B``, ``lo = max(added - lag, a1 - C, 0)``: the new rows and the rows they
    make ready (``a1 - lo <= C``)."""
    a1 = int(added) + int(B)
    return max(int(added) - spec.lag, a1 - spec.capacity, 0), a1


def _commit(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount, next_obs=None) -> None:
    if bufs.flag[FLAG_REJECT]:
        return
    C, lag, B = spec.capacity, spec.lag, obs.shape[0]
    a0 = int(bufs.added[0])
    slots = (a0 + np.arange(B)) % C
    bufs.obs[slots] = obs
    bufs.action[slots] = action
    bufs.reward[slots] = reward
    bufs.discount[slots] = discount
    if next_obs is not None:
        bufs.next_obs[slots] = next_obs
    lo, a1 = insert_range(spec, a0, B)
    rows = np.arange(lo, a1)
    bufs.tree[rows % C] = np.where(rows < a1 - lag, bufs.max_q[0], 0)  # ready: max_q; written, not yet ready: 0
    rebuild_ancestors(bufs.tree, C, lo % C, a1 - lo)
    bufs.added[0] = a1


@members()
def insert_commit(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """Unless ``flag[FLAG_REJECT]``: write the batch at slots ``(added + k) mod C``; set the leaves
    of absolute rows ``a in [lo, a1)`` (``insert_range``) to ``max_q`` where ``a + lag < a1``
    (ready) else 0 (written, not yet ready); recompute their ancestors; ``added += B``."""
    _commit(spec, bufs, obs, action, reward, discount)


@members()
def insert_commit_next(spec: ReplaySpec, bufs: ReplayBuffers, obs, next_obs, action, reward, discount) -> None:
    """``insert_commit`` that also writes ``next_obs`` float32 ``[B, D]`` at the same slots of
    ``bufs.next_obs`` (``store_next_obs``)."""
    _commit(spec, bufs, obs, action, reward, discount, next_obs)


def check_next_obs_arg(spec: ReplaySpec, next_obs) -> None:
    """``next_obs`` is required with ``store_next_obs`` and refused without it."""
    if spec.store_next_obs and next_obs is None:
        raise ValueError("next_obs: required by a buffer with store_next_obs=True")
    if not spec.store_next_obs and next_obs is not None:
        raise ValueError("next_obs: this buffer takes s_{t+n} from the ring; pass store_next_obs=True to store it")


@members()
def insert(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount, next_obs=None) -> None:
    """Append ``B`` transitions at the write position and mark rows that became ready.

    Args:
        obs: float32 ``[B, D]``; action: int32 ``[B]``; reward: float32 ``[B]``;
        discount: float32 ``[B]`` in ``[0, 1]`` (``gamma * (1 - done)``). ``B % n_envs == 0``,
        ``B <= C``.
        next_obs: float32 ``[B, D]``, ``s_{t+1}`` of each row; with ``store_next_obs`` only.
    ``insert_check`` then ``insert_commit`` (``insert_check_next``, ``insert_commit_next`` with
    ``store_next_obs``): a bad batch changes nothing but ``status``.
    """
    check_next_obs_arg(spec, next_obs)
    if spec.store_next_obs:
        insert_check_next(spec, bufs, obs, next_obs, action, reward, discount)
        insert_commit_next(spec, bufs, obs, next_obs, action, reward, discount)
    else:
        insert_check(spec, bufs, obs, action, reward, discount)
        insert_commit(spec, bufs, obs, action, reward, discount)
