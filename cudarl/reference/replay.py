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
STATUS_NAMES = {STATUS_EMPTY: "sampled an empty buffer", STATUS_BAD_TD: "non-finite td skipped",
                STATUS_BAD_INDEX: "out-of-range index skipped", STATUS_BAD_ROWS: "bad rows rejected"}


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
    return tuple((int(o), int(s)) for o, s in zip(offsets, sizes))


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
        flag: int64 ``[1]`` scratch (``insert``'s reject flag).
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
    for (src_off, src_n), (dst_off, _) in zip(layout[:-1], layout[1:]):
        tree_level(tree, src_off, dst_off, src_n // FANOUT)


def tree_level(tree: np.ndarray, src_off: int, dst_off: int, n_dst: int) -> None:
    """``tree[dst_off + p] = sum_{c<32} tree[src_off + 32p + c]`` for ``p < n_dst`` (int64)."""
    tree[dst_off : dst_off + n_dst] = tree[src_off : src_off + FANOUT * n_dst].reshape(n_dst, FANOUT).sum(axis=1)


def build_tree(spec: ReplaySpec, bufs: ReplayBuffers) -> None:
    """Rebuild ``bufs.tree``'s internal nodes from its leaves, bottom up (after loading a state)."""
    _refresh(bufs.tree, spec.capacity)


def insert_check(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """``flag = 1`` (and ``status |= STATUS_BAD_ROWS``) when the batch has a non-finite value,
    a discount outside ``[0, 1]`` or a negative action; else ``flag = 0``."""
    bad = (not np.all(np.isfinite(obs)) or not np.all(np.isfinite(reward)) or not np.all(np.isfinite(discount))
           or np.any(discount < 0) or np.any(discount > 1) or np.any(action < 0))
    bufs.flag[0] = int(bad)
    if bad:
        bufs.status[0] |= STATUS_BAD_ROWS


def insert_next_check(spec: ReplaySpec, bufs: ReplayBuffers, next_obs) -> None:
    """After ``insert_check``: ``flag = 1`` (and ``status |= STATUS_BAD_ROWS``) when ``next_obs``
    has a non-finite value; never clears ``flag``."""
    if not np.all(np.isfinite(next_obs)):
        bufs.flag[0] = 1
        bufs.status[0] |= STATUS_BAD_ROWS


def insert_next_rows(spec: ReplaySpec, bufs: ReplayBuffers, next_obs) -> None:
    """Write ``next_obs`` float32 ``[B, D]`` at slots ``(added + k) mod C`` of ``bufs.next_obs``
    unless ``flag`` is set."""
    if bufs.flag[0]:
        return
    slots = (int(bufs.added[0]) + np.arange(next_obs.shape[0])) % spec.capacity
    bufs.next_obs[slots] = next_obs


def insert_rows(spec: ReplaySpec, bufs: ReplayBuffers, obs, action, reward, discount) -> None:
    """Write the batch at slots ``(added + k) mod C`` unless ``flag`` is set."""
    if bufs.flag[0]:
        return
    slots = (int(bufs.added[0]) + np.arange(obs.shape[0])) % spec.capacity
    bufs.obs[slots] = obs
    bufs.action[slots] = action
    bufs.reward[slots] = reward
    bufs.discount[slots] = discount


def insert_priorities(spec: ReplaySpec, bufs: ReplayBuffers, B: int) -> None:
    """Leaves of absolute rows ``a in [max(added - nE, added + B - C, 0), added + B)``:
    ``max_q`` where ``a + nE < added + B`` (ready), else 0 (written, not yet ready). Skipped if ``flag``."""
    if bufs.flag[0]:
        return
    C, lag = spec.capacity, spec.lag
    a0 = int(bufs.added[0])
    a1 = a0 + int(B)
    rows = np.arange(max(a0 - lag, a1 - C, 0), a1)
    bufs.tree[rows % C] = np.where(rows < a1 - lag, bufs.max_q[0], 0)
    _refresh(bufs.tree, C)


def insert_advance(spec: ReplaySpec, bufs: ReplayBuffers, B: int) -> None:
    """``added += B`` unless ``flag`` is set."""
    if not bufs.flag[0]:
        bufs.added[0] += int(B)


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
    ``insert_check`` (then ``insert_next_check``), ``insert_rows`` (then ``insert_next_rows``),
    ``insert_priorities``, ``insert_advance`` in order: a bad batch changes nothing but ``status``.
    """
    check_next_obs_arg(spec, next_obs)
    insert_check(spec, bufs, obs, action, reward, discount)
    if spec.store_next_obs:
        insert_next_check(spec, bufs, next_obs)
    insert_rows(spec, bufs, obs, action, reward, discount)
    if spec.store_next_obs:
        insert_next_rows(spec, bufs, next_obs)
    insert_priorities(spec, bufs, obs.shape[0])
    insert_advance(spec, bufs, obs.shape[0])


def _mulhi64(r: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``floor(r * w / 2**64)`` for uint64 arrays, exact (Python integers)."""
    return np.array([(int(a) * int(b)) >> 64 for a, b in zip(r, w)], dtype=np.uint64)


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
    ``(s + lag) mod C`` (``lag = nE``, or 0: the row's own stored ``next_obs``). A discount of 0 (episode end) zeroes every later term and ``Gamma``.
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


def gather(spec: ReplaySpec, bufs: ReplayBuffers, indices, obs_out, next_obs_out, action_out, return_out, discount_out) -> None:
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
