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

**Members** (a population's agents): every op also takes buffers with a leading axis of ``P``
(:class:`ReplayBuffers`, :func:`members`) and ``[P, ...]`` batch arrays, and runs the single op on each
member in turn (the kernels: ``blockIdx.y``); one spec holds the constants they share, ``bufs.seed [P]``
their Philox keys.

The twin is a package by concept: :mod:`.buffers` (constants, spec, arrays, readiness), :mod:`.sumtree`
(fixed-point priorities and their sums), :mod:`.ring` (insert), :mod:`.sampling` (search and weights),
:mod:`.nstep` (returns and gather); every op of ``cuda_src/replay.cu`` is importable from here.
"""

from .buffers import (
    FANOUT,
    FLAG_REJECT,
    FLAG_WORDS,
    Q_MAX,
    SCALE,
    SCALE_BITS,
    STATUS_BAD_INDEX,
    STATUS_BAD_ROWS,
    STATUS_BAD_TD,
    STATUS_EMPTY,
    STATUS_NAMES,
    ReplayBuffers,
    ReplaySpec,
    members,
    ready_count,
    ready_slots,
)
from .nstep import gather, nstep
from .ring import (
    check_next_obs_arg,
    insert,
    insert_check,
    insert_check_next,
    insert_commit,
    insert_commit_next,
    insert_range,
)
from .sampling import (
    beta_at,
    sample,
    sample_search,
    sample_search_gather,
    sample_search_gather_windows,
    sample_weights,
    sample_weights_members,
)
from .sumtree import (
    build_tree,
    changed_nodes,
    priority_to_leaf,
    quantize,
    rebuild_ancestors,
    refresh,
    tree_layout,
    tree_level,
    tree_nodes,
    update_priorities,
    update_priorities_members,
)

__all__ = [
    "FANOUT",
    "FLAG_REJECT",
    "FLAG_WORDS",
    "Q_MAX",
    "ReplayBuffers",
    "ReplaySpec",
    "SCALE",
    "SCALE_BITS",
    "STATUS_BAD_INDEX",
    "STATUS_BAD_ROWS",
    "STATUS_BAD_TD",
    "STATUS_EMPTY",
    "STATUS_NAMES",
    "beta_at",
    "build_tree",
    "changed_nodes",
    "check_next_obs_arg",
    "gather",
    "insert",
    "insert_check",
    "insert_check_next",
    "insert_commit",
    "insert_commit_next",
    "insert_range",
    "members",
    "nstep",
    "priority_to_leaf",
    "quantize",
    "ready_count",
    "ready_slots",
    "rebuild_ancestors",
    "refresh",
    "sample",
    "sample_search",
    "sample_search_gather",
    "sample_search_gather_windows",
    "sample_weights",
    "sample_weights_members",
    "tree_layout",
    "tree_level",
    "tree_nodes",
    "update_priorities",
    "update_priorities_members",
]
