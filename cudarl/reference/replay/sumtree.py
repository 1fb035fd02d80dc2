"""The sum tree of fixed-point priorities: 32-way levels over the leaves (exact int64 sums, so every
sum is independent of its order), the leaf of a TD error, the rebuild of a range's ancestors, and
``update_priorities``."""

from __future__ import annotations

import numpy as np

from .buffers import FANOUT, Q_MAX, SCALE, STATUS_BAD_INDEX, STATUS_BAD_TD, ReplayBuffers, ReplaySpec, members


def tree_layout(capacity: int) -> tuple[tuple[int, int], ...]:
    """``(offset, size)`` of each level of the sum tree in one int64 array, leaves first.

    Level 0 holds the leaves padded to a multiple of 32; node ``p`` of level ``k`` is the sum of
    nodes ``32p .. 32p+31`` of level ``k-1``; every level but the root (size 1) is padded to a
    multiple of 32 so a warp reads 32 children without bounds checks. Padding nodes are 0.
    """
    ceil32 = lambda n: -(-n // FANOUT) * FANOUT  # noqa: E731
    sizes = [ceil32(int(capacity))]
    while sizes[-1] > 1:
        n = -(-sizes[-1] // FANOUT)
        sizes.append(1 if n == 1 else ceil32(n))
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
    return tuple((int(o), int(s)) for o, s in zip(offsets, sizes, strict=True))


def tree_nodes(capacity: int) -> int:
    """Total int64 nodes of the tree of ``capacity`` leaves."""
    off, size = tree_layout(capacity)[-1]
    return off + size


def quantize(x: np.ndarray) -> np.ndarray:
    """float64 ``p**alpha`` -> int64 leaf ``clip(rint(x * 2**24), 1, 2**40)``."""
    return np.clip(np.rint(np.asarray(x, np.float64) * SCALE), 1, Q_MAX).astype(np.int64)


def priority_to_leaf(td: np.ndarray, alpha: float, eps: float) -> np.ndarray:
    """Leaf of a TD error: ``quantize((|td| + eps)**alpha)`` in float64. ``td``: float32 ``[B]``."""
    x = np.power(np.abs(np.asarray(td, np.float32).astype(np.float64)) + np.float64(eps), np.float64(alpha))
    return quantize(x)


def refresh(tree: np.ndarray, capacity: int) -> None:
    """Recompute every internal node from the leaves (exact integer sums)."""
    layout = tree_layout(capacity)
    for (src_off, src_n), (dst_off, _) in zip(layout[:-1], layout[1:], strict=False):
        tree_level(tree, src_off, dst_off, src_n // FANOUT)


def tree_level(tree: np.ndarray, src_off: int, dst_off: int, n_dst: int) -> None:
    """``tree[dst_off + p] = sum_{c<32} tree[src_off + 32p + c]`` for ``p < n_dst`` (int64). Members:
    ``tree [P, nodes]``, each member's tree in turn."""
    if tree.ndim == 2:
        for one in tree:
            tree_level(one, src_off, dst_off, n_dst)
        return
    tree[dst_off : dst_off + n_dst] = tree[src_off : src_off + FANOUT * n_dst].reshape(n_dst, FANOUT).sum(axis=1)


@members()
def build_tree(spec: ReplaySpec, bufs: ReplayBuffers) -> None:
    """Rebuild ``bufs.tree``'s internal nodes from its leaves, bottom up (after loading a state)."""
    refresh(bufs.tree, spec.capacity)


def changed_nodes(s_lo: int, R: int, capacity: int, level: int) -> np.ndarray:
    """The nodes of tree level ``level`` (>= 1) whose subtree holds a slot of the ring range
    ``[s_lo, s_lo + R) mod C`` (``0 <= s_lo < C``, ``1 <= R <= C``), each once, in the order the
    kernel's warps take them: ``lo .. lo+n1-1`` then ``0 .. n2-1`` (the part that wrapped past slot
    ``C - 1``), or ``0 .. n1-1`` when the wrapped part reaches the first part's nodes."""
    C, shift = int(capacity), 5 * int(level)
    end = s_lo + R
    lo = s_lo >> shift
    n1 = ((min(end, C) - 1) >> shift) - lo + 1
    n2 = ((end - C - 1) >> shift) + 1 if end > C else 0
    if n2 > lo:
        lo, n1, n2 = 0, n1 + lo, 0
    return np.concatenate([np.arange(lo, lo + n1), np.arange(n2)]).astype(np.int64)


def rebuild_ancestors(tree: np.ndarray, capacity: int, s_lo: int, R: int) -> None:
    """Recompute, bottom up, every ancestor of the leaves in the ring range ``[s_lo, s_lo + R) mod C``
    as the sum of its 32 children (exact integers): what ``insert_commit`` does on the device."""
    layout = tree_layout(capacity)
    for k in range(1, len(layout)):
        p = changed_nodes(s_lo, R, capacity, k)
        src, dst = layout[k - 1][0], layout[k][0]
        tree[dst + p] = tree[src + FANOUT * p[:, None] + np.arange(FANOUT)].sum(axis=1)


@members()
def update_priorities(spec: ReplaySpec, bufs: ReplayBuffers, indices, td) -> None:
    """Set the priority of rows ``indices`` (int32 ``[B]``) to ``(|td| + eps)**alpha``.

    ``td``: float32 ``[B]``. The last occurrence of an index in batch order decides; see the
    module docstring for non-finite ``td``, out-of-range indices and rows that are not ready.
    Raises the running maximum ``max_q`` to the largest leaf written.
    """
    C = spec.capacity
    idx = np.asarray(indices, np.int64)
    td = np.asarray(td, np.float32)
    in_range = (idx >= 0) & (idx < C)
    if not np.all(in_range):
        bufs.status[0] |= STATUS_BAD_INDEX
    last = {}
    for j in np.flatnonzero(in_range):
        last[int(idx[j])] = j  # later occurrences overwrite: the last one wins
    if not last:
        return
    rows = np.fromiter(last.keys(), np.int64)
    js = np.fromiter(last.values(), np.int64)
    finite = np.isfinite(td[js])
    if not np.all(finite):
        bufs.status[0] |= STATUS_BAD_TD
    ready = bufs.tree[rows] > 0
    keep = finite & ready
    if not np.any(keep):
        return
    q = priority_to_leaf(td[js[keep]], spec.alpha, spec.eps)
    bufs.tree[rows[keep]] = q
    bufs.max_q[0] = max(int(bufs.max_q[0]), int(q.max()))
    refresh(bufs.tree, C)


def update_priorities_members(spec: ReplaySpec, bufs: ReplayBuffers, indices, td, alpha, eps) -> None:
    """:func:`update_priorities` over the member axis (``bufs`` with it, ``indices`` and ``td`` ``[P, B]``)
    whose members each have their own ``alpha`` and ``eps`` (``[P]``): member ``i`` the single call with
    ``spec``'s alpha and eps replaced by its own."""
    from dataclasses import replace

    for i in range(bufs.members):
        update_priorities(replace(spec, alpha=float(alpha[i]), eps=float(eps[i])), bufs.member(i), indices[i], td[i])
