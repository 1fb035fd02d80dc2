"""Prioritized replay in NumPy: the CPU backend and the oracle of ``cuda_src/replay.cu``.

Prioritized experience replay (Schaul et al., ICLR 2016, "Prioritized Experience Replay"),
proportional variant, with stratified sampling and n-step returns.

Storage is a ring of ``C`` rows. Rows are written in batches of ``B`` (a multiple of
``n_envs``), time-major, so the row after absolute row ``a`` in the same environment is
``a + n_envs`` and its slot is ``(a + n_envs) mod C``. One int64 counter, ``added``, is the
single source of truth for the ring: ``write_pos = added mod C``, ``size = min(added, C)``.

**Readiness.** Row ``a`` needs ``s_{a+n*E}`` to bootstrap its n-step target, so it becomes
*ready* (sampleable) only once ``a + n*E < added``: its leaf holds 0 until then and then the
running maximum priority. Leaf 0 <=> not ready; every ready leaf is at least 1.

**Stored next observations** (``store_next_obs``, n = 1 only). Rows whose next state is not
the next row of their column (the env's counterfactual and mirrored rows) carry their own
``s_{t+1}``, written into a second ring ``next_obs`` beside ``obs``. Such a row needs nothing
later, so it is ready as soon as it is written (``lag = 0``) and ``gather`` copies its stored
``next_obs``; the return is ``r_t`` and the bootstrap discount ``d_t``.

**Fixed-point priorities.** A leaf holds ``q = clip(rint(p**alpha * 2**24), 1, 2**40)`` as
int64 (``p**alpha`` evaluated in float64), so every sum is an exact integer and independent
of summation order; a tree of 32-way node sums (``tree_layout``) stays exact under
incremental updates. With capacity below 2**23 every sum is below 2**63.

**Sampling** (stratified, proportional to ``q_i / T`` with ``T = sum_i q_i``): for
``j in [0, B)`` the integer stratum is ``[lo_j, lo_{j+1})`` with ``lo_j = floor(j*T/B)``,
computed exactly as ``j*(T div B) + (j*(T mod B)) div B``; the target is
``t_j = lo_j + floor(r_j * (lo_{j+1} - lo_j) / 2**64)`` with ``r_j`` 64 random bits
(Philox lanes 0 and 1 of block ``j`` of the stream ``(seed, step, stream_id)``, lane 1 high),
and the sampled row is the ``i`` with ``prefix_i <= t_j < prefix_i + q_i``.

**Importance weights** ``w_j = (N * P(j))**-beta / max_k w_k`` where the maximum is over the
*sampled batch* (Algorithm 1 of the paper normalises by ``max_i w_i`` over the minibatch
being weighted). Since ``P(j) = q_j / T`` this is exactly ``w_j = (q_min / q_j)**beta`` with
``q_min`` the smallest sampled leaf (float64, then float32). ``beta`` anneals on the device:
``beta(step) = beta0 + (beta_final - beta0) * min(1, step / beta_steps)``.

**Device rules mirrored here** (the object raises ``ValueError`` before calling the ops;
the ops themselves behave as the kernels do on inputs no host could check):

* ``insert``: a batch with a non-finite observation, reward or discount, a discount outside
  ``[0, 1]`` or a negative action is rejected whole; status bit ``STATUS_BAD_ROWS``.
* ``update_priorities``: when an index appears several times in one batch, its *last*
  occurrence in batch order decides; if that ``td`` is not finite the priority is left
  unchanged (``STATUS_BAD_TD``); indices outside ``[0, C)`` are skipped
  (``STATUS_BAD_INDEX``); rows that are not ready (leaf 0, e.g. overwritten since they were
  sampled) are left unchanged.
* ``sample`` from an empty tree writes index 0, weight 0 and sets ``STATUS_EMPTY``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import philox

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
        row_width: width of a gathered row, ``D`` or ``D`` rounded up to 32 floats (128 bytes).
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
    row_width: int
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
        last beta used.
        next_obs: float32 ``[C, D]`` with ``store_next_obs``, else ``None`` (never launched on).
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
    next_obs: object = None

    @property
    def leaves(self):
        return self.tree[: self.owner.shape[0]]


def quantize(x: np.ndarray) -> np.ndarray:
    """float64 ``p**alpha`` -> int64 leaf ``clip(rint(x * 2**24), 1, 2**40)``."""
    return np.clip(np.rint(np.asarray(x, np.float64) * SCALE), 1, Q_MAX).astype(np.int64)


def priority_to_leaf(td: np.ndarray, alpha: float, eps: float) -> np.ndarray:
    """Leaf of a TD error: ``quantize((|td| + eps)**alpha)`` in float64. ``td``: float32 ``[B]``."""
    x = np.power(np.abs(np.asarray(td, np.float32).astype(np.float64)) + np.float64(eps), np.float64(alpha))
    return quantize(x)


def beta_at(spec: ReplaySpec, step: int) -> float:
    """``beta0 + (beta_final - beta0) * min(1, step / beta_steps)`` in float64."""
    frac = min(1.0, float(step) / float(spec.beta_steps))
    return float(np.float64(spec.beta0) + np.float64(spec.beta_final - spec.beta0) * np.float64(frac))


def _refresh(tree: np.ndarray, capacity: int) -> None:
    """Recompute every internal node from the leaves (exact integer sums)."""
    layout = tree_layout(capacity)
    for (src_off, src_n), (dst_off, _) in zip(layout[:-1], layout[1:], strict=False):
        tree_level(tree, src_off, dst_off, src_n // FANOUT)


def tree_level(tree: np.ndarray, src_off: int, dst_off: int, n_dst: int) -> None:
    """``tree[dst_off + p] = sum_{c<32} tree[src_off + 32p + c]`` for ``p < n_dst`` (int64)."""
    tree[dst_off : dst_off + n_dst] = tree[src_off : src_off + FANOUT * n_dst].reshape(n_dst, FANOUT).sum(axis=1)


def build_tree(spec: ReplaySpec, bufs: ReplayBuffers) -> None:
    """Rebuild ``bufs.tree``'s internal nodes from its leaves, bottom up (after loading a state)."""
    _refresh(bufs.tree, spec.capacity)


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


def insert_check(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """``flag[FLAG_REJECT] = 1`` (and ``status |= STATUS_BAD_ROWS``) when the batch has a
    non-finite value, a discount outside ``[0, 1]`` or a negative action; else 0."""
    _set_reject(bufs, _batch_is_bad(obs, action, reward, discount))


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


def insert_commit(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """Unless ``flag[FLAG_REJECT]``: write the batch at slots ``(added + k) mod C``; set the leaves
    of absolute rows ``a in [lo, a1)`` (``insert_range``) to ``max_q`` where ``a + lag < a1``
    (ready) else 0 (written, not yet ready); recompute their ancestors; ``added += B``."""
    _commit(spec, bufs, obs, action, reward, discount)


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


def _mulhi64(r: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``floor(r * w / 2**64)`` for uint64 arrays, exact (Python integers)."""
    return np.array([(int(a) * int(b)) >> 64 for a, b in zip(r, w, strict=True)], dtype=np.uint64)


def sample_search(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, qsel_out) -> None:
    """Stratified proportional search: ``indices_out`` int32 ``[B]``, ``qsel_out`` int64 ``[B]``
    (the sampled leaves), from the stream ``(seed, step, stream_id)``. Reads ``step``, does not
    advance it. An empty tree gives index 0, leaf 0 and ``STATUS_EMPTY``."""
    B = indices_out.shape[0]
    leaves = bufs.tree[: spec.capacity]
    incl = np.cumsum(leaves)  # exact: int64 with T < 2**63
    T = int(incl[-1])
    if T == 0:
        indices_out[:] = 0
        qsel_out[:] = 0
        bufs.status[0] |= STATUS_EMPTY
        return
    blk = philox.blocks(spec.seed, int(bufs.step[0]), spec.stream_id, np.arange(B, dtype=np.uint32))
    r = (blk[:, 1].astype(np.uint64) << np.uint64(32)) | blk[:, 0].astype(np.uint64)
    j = np.arange(B + 1, dtype=np.uint64)
    qB, rB = np.uint64(T // B), np.uint64(T % B)
    lo = j * qB + (j * rB) // np.uint64(B)
    target = lo[:-1] + _mulhi64(r, lo[1:] - lo[:-1])
    idx = np.searchsorted(incl, target.astype(np.int64), side="right")
    indices_out[:] = idx.astype(np.int32)
    qsel_out[:] = leaves[idx]


def sample_weights(spec: ReplaySpec, bufs: ReplayBuffers, qsel, weights_out) -> None:
    """``weights_out[j] = (min_k q_k / q_j)**beta(step)`` (float64, then float32; 0 if a leaf is 0);
    writes ``beta``, then ``step += 1``."""
    step = int(bufs.step[0])
    beta = beta_at(spec, step)
    q = np.asarray(qsel).astype(np.float64)
    qmin = q.min()
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where((q == 0) | (qmin == 0), 0.0, np.power(qmin / q, np.float64(beta)))
    weights_out[:] = w.astype(np.float32)
    bufs.beta[0] = beta
    bufs.step[0] = step + 1


def sample(spec: ReplaySpec, bufs: ReplayBuffers, indices_out, weights_out, qsel_out) -> None:
    """Stratified proportional sampling of ``B = len(indices_out)`` rows; then ``step += 1``.

    Writes ``indices_out`` int32 ``[B]``, ``weights_out`` float32 ``[B]``
    (``(q_min / q_j)**beta``), ``qsel_out`` int64 ``[B]`` (the sampled leaves), ``beta``.
    """
    sample_search(spec, bufs, indices_out, qsel_out)
    sample_weights(spec, bufs, qsel_out, weights_out)


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


def gather(
    spec: ReplaySpec, bufs: ReplayBuffers, indices, obs_out, next_obs_out, action_out, return_out, discount_out
) -> None:
    """Copy the sampled rows into the trainer's buffers.

    Args:
        indices: int32 ``[B]`` slots.
    Writes ``obs_out``, ``next_obs_out`` float32 ``[B, row_width]`` (columns ``>= D`` zero;
    ``next_obs`` is the bootstrap row ``s_{t+n}``, or the row's stored ``next_obs`` with
    ``store_next_obs``), ``action_out`` int32 ``[B]``,
    ``return_out`` / ``discount_out`` float32 ``[B]`` (``nstep``). An index outside ``[0, C)``
    gives a zero row and ``STATUS_BAD_INDEX`` (the kernel never reads out of bounds).
    """
    D = spec.obs_dim
    s = np.asarray(indices, np.int64)
    bad = (s < 0) | (s >= spec.capacity)
    if np.any(bad):
        bufs.status[0] |= STATUS_BAD_INDEX
    s = np.where(bad, 0, s)
    G, gamma, nxt = nstep(spec, bufs, s)
    obs_out[:, :D] = bufs.obs[s]
    obs_out[:, D:] = 0
    next_obs_out[:, :D] = (bufs.next_obs if spec.store_next_obs else bufs.obs)[nxt]
    next_obs_out[:, D:] = 0
    action_out[:] = bufs.action[s]
    return_out[:] = G
    discount_out[:] = gamma
    for out in (obs_out, next_obs_out, action_out, return_out, discount_out):
        out[bad] = 0


def sample_search_gather(
    spec: ReplaySpec,
    bufs: ReplayBuffers,
    indices_out,
    qsel_out,
    obs_out,
    next_obs_out,
    action_out,
    return_out,
    discount_out,
) -> None:
    """:func:`sample_search` then :func:`gather` of the rows found (the GPU does both in one launch)."""
    sample_search(spec, bufs, indices_out, qsel_out)
    gather(spec, bufs, indices_out, obs_out, next_obs_out, action_out, return_out, discount_out)


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
    _refresh(bufs.tree, C)


def ready_slots(capacity: int, lag: int, added: int) -> np.ndarray:
    """Slots of the ready rows: absolute rows ``[max(0, added - C), added - lag)`` mod C."""
    return np.arange(max(0, added - capacity), max(0, added - lag)) % capacity


def ready_count(capacity: int, lag: int, added: int) -> int:
    """``len(ready_slots(capacity, lag, added))`` without building it."""
    return max(0, (added - lag) - max(0, added - capacity))
