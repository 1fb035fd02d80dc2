"""``causal``'s held-out sensitivity: each feature group's mean absolute change of Q over an evaluated split.

The training pass (:mod:`cudarl.auxiliary.causal`) measures a group on one sub-batch of training rows, the
last step it was intervened on. Here the same interventions (:func:`cudarl.reference.causal.intervene`,
the groups of :func:`cudarl.auxiliary.causal.group_masks`) run over every decision bar of a split, at the
flat position, with the weights that act::

    x_b       = the observation of decision bar b of the split, position 0 and hold 0   [n, window * (F + 2)]
    do_G(x)_b = x_b with group G intervened on (a swap draws row (b + 1) mod n; offset adds agent.causal_offset)
    S_G       = mean_{b, a} |Q(do_G(x))_b,a - Q(x)_b,a|                                  (b < n, a < A)

so ``S_G`` is a property of the weights and the split, not of the walk the policy takes through it. Each
evaluation's ``summary.json`` (the trainer's and a policy file's, ``cudarl-train evaluate``) lists it as
``causal_sensitivity_heldout`` when ``agent.aux`` holds ``causal`` (:func:`split_sensitivity`).
"""

from __future__ import annotations

import numpy as np

from ..backend import to_numpy
from ..reference import causal as ref
from ..reference.window import BAR, STATE_DIM, gather
from .causal import group_masks

#: Rows of one forward of :func:`heldout_sensitivity`: the observations, Q and intervened copies of one
#: chunk are what it holds at once, whatever the split's length.
CHUNK_ROWS = 1024


def heldout_sensitivity(q, obs, names, groups, window: int, offset: float, chunk: int = CHUNK_ROWS) -> dict:
    """``{group: S_G}`` (module docstring): the mean absolute change of ``q`` under each group's intervention.

    Args:
        q: ``q(x float32 [k, obs_dim]) -> [k, A]``, host arrays, ``k <= chunk`` (called twice on each
            chunk's shape: once clean, once per group, so a forward whose draws depend on the row, IQN's
            acting taus, compares each row with itself).
        obs: the split's observations, float32 ``[n, obs_dim]`` (``obs_dim = window * (F + 2)``), or anything
            with a ``shape`` whose slices ``obs[i:j]`` are those rows (:class:`FlatObservations`).
        names: the ``F`` feature names; ``groups``: ``agent.causal_groups`` (one without a column is left out).
        window: bars per observation; ``offset``: ``agent.causal_offset``.
        chunk: rows per forward; the result does not depend on it where ``q``'s rows do not.
    The donor of a swap is the next row of the split, row ``(b + 1) mod n``, across chunk boundaries."""
    kept, mask, mode = group_masks(names, groups)
    n, sums, a_n = int(obs.shape[0]), np.zeros(len(kept)), 0
    if n < 1:
        raise ValueError("heldout_sensitivity: no observations")
    for i in range(0, n, int(chunk)):
        j = min(i + int(chunk), n)
        # the chunk and the row after it (the next chunk's first; row 0 after the last), the swap's donor of
        # row j - 1; intervene then draws row (r + 1) of this block, and its last row is dropped
        block = np.concatenate([np.asarray(obs[i:j], np.float32), np.asarray(obs[j % n : j % n + 1], np.float32)])
        clean = np.asarray(q(block[:-1]), np.float64)
        a_n = clean.shape[1]
        for g in range(len(kept)):
            x = ref.intervene(block, mask, mode, np.array([g], np.int64), offset, window)[:-1]
            sums[g] += np.abs(np.asarray(q(x), np.float64) - clean).sum()
    return {name: float(sums[g] / (n * a_n)) for g, name in enumerate(kept)}


class FlatObservations:
    """The observations of bars ``first .. first + n - 1`` at the flat position (position 0, hold 0, no
    mirror), gathered on demand: ``obs[i:j]`` is float32 ``[j - i, window * (F + 2)]``, the windows the
    evaluation walk would feed the network at those bars holding nothing (:func:`cudarl.reference.window.gather`
    of the state rows ``[bar, 0, 0, 0]``); ``shape`` is ``(n, window * (F + 2))``. Memory: one slice at a time.

    Args: ``features`` float32 ``[T, F]`` (host), ``first``, ``n``, ``window``."""

    def __init__(self, features, first: int, n: int, window: int):
        self.features = np.asarray(features, np.float32)
        self.first, self.window = int(first), int(window)
        f_n = self.features.shape[1]
        self.shape = (int(n), self.window * (f_n + 2))
        self.sign = np.ones(f_n, np.float32)  # no row is a mirror row: the signs are never read

    def __getitem__(self, s: slice) -> np.ndarray:
        lo, hi, step = s.indices(self.shape[0])
        if step != 1:
            raise IndexError("FlatObservations: contiguous slices only")
        rows = np.zeros((max(hi - lo, 0), STATE_DIM), np.float32)
        rows[:, BAR] = np.arange(self.first + lo, self.first + max(hi, lo))
        out = np.empty((len(rows), self.shape[1]), np.float32)
        gather(rows, self.features, self.sign, out, self.window)
        return out


def split_sensitivity(q_into, xp, n_actions: int, prepared, split_name: str, cfg) -> dict:
    """:func:`heldout_sensitivity` over the decision bars of ``split_name`` of ``prepared`` (the bars the
    evaluation walk decides at: ``split.start .. split.stop - 3``, one episode of ``len(split) - 2`` steps)
    at the flat position, with ``cfg.agent``'s groups and offset and ``cfg.net.window``.

    ``q_into(obs, out)``: Q of ``obs [k, obs_dim]`` into ``out [k, n_actions]``, arrays of ``xp`` (the
    trainer's :meth:`cudarl.agent.Agent.eval_q_into`, a policy's :meth:`cudarl.policy.Policy.q_values_into`:
    the values the policy acts on, ``agent.act_by``'s measure)."""
    split = getattr(prepared.splits, split_name)
    obs = FlatObservations(prepared.x, split.start, split.stop - split.start - 2, cfg.net.window)

    def q(x):
        out = xp.empty((x.shape[0], n_actions), np.float32)
        q_into(xp.asarray(x), out)
        return to_numpy(out)

    a = cfg.agent
    return heldout_sensitivity(q, obs, prepared.names, a.causal_groups, cfg.net.window, a.causal_offset)
