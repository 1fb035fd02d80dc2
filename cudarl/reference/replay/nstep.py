"""The n-step return and bootstrap discount of a sampled row, and the gather of sampled rows into the
learner's batch (``s_t``, ``a_t``, the return, the discount, ``s_{t+n}``)."""

from __future__ import annotations

import numpy as np

from .buffers import STATUS_BAD_INDEX, ReplayBuffers, ReplaySpec, members


def nstep(spec: ReplaySpec, bufs: ReplayBuffers, slots) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n-step return, bootstrap discount and bootstrap slot of rows ``slots`` (int ``[B]``).

    ``G = sum_{k<n} (prod_{i<k} d_{s+iE}) r_{s+kE}``, ``Gamma = prod_{k<n} d_{s+kE}``,
    accumulated in float32 in this order (``G += g * r``, then ``g *= d``), bootstrap slot
    ``(s + lag) mod C`` (``lag = nE``, or 0: the row's own stored ``next_obs``). A discount of 0
    (episode end) zeroes every later term and ``Gamma``.
    """
    C, E = spec.capacity, spec.n_envs
    s = np.asarray(slots, np.int64)
    G = np.zeros(s.shape, np.float32)
    g = np.ones(s.shape, np.float32)
    for k in range(spec.n_step):
        row = (s + k * E) % C
        G = (G + (g * bufs.reward[row]).astype(np.float32)).astype(np.float32)
        g = (g * bufs.discount[row]).astype(np.float32)
    return G, g, (s + spec.lag) % C


@members()
def gather(
    spec: ReplaySpec, bufs: ReplayBuffers, indices, obs_out, next_obs_out, action_out, return_out, discount_out
) -> None:
    """Copy the sampled rows into the trainer's buffers.

    Args:
        indices: int32 ``[B]`` slots.
    Writes ``obs_out``, ``next_obs_out`` float32 ``[B, D]`` (``next_obs`` is the bootstrap row
    ``s_{t+n}``, or the row's stored ``next_obs`` with ``store_next_obs``), ``action_out`` int32 ``[B]``,
    ``return_out`` / ``discount_out`` float32 ``[B]`` (``nstep``). An index outside ``[0, C)``
    gives a zero row and ``STATUS_BAD_INDEX`` (the kernel never reads out of bounds).
    """
    s = np.asarray(indices, np.int64)
    bad = (s < 0) | (s >= spec.capacity)
    if np.any(bad):
        bufs.status[0] |= STATUS_BAD_INDEX
    s = np.where(bad, 0, s)
    G, gamma, nxt = nstep(spec, bufs, s)
    obs_out[...] = bufs.obs[s]
    next_obs_out[...] = (bufs.next_obs if spec.store_next_obs else bufs.obs)[nxt]
    action_out[:] = bufs.action[s]
    return_out[:] = G
    discount_out[:] = gamma
    for out in (obs_out, next_obs_out, action_out, return_out, discount_out):
        out[bad] = 0
