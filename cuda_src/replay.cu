// Prioritized replay (Schaul et al. 2016, proportional, stratified) with n-step returns.
// Twin: cudarl/reference/replay.py (read its module docstring for the math and the rules).
//
// State: a ring of C rows; an int64 sum tree of fixed-point leaves (q = rint(p^alpha * 2^24),
// 1 <= q <= 2^40 for ready rows, 0 otherwise), 32-way, leaves first, level offsets in
// `levels`; device scalars added/step/max_q/status (int64) and beta (float64).
// Integer sums are exact, so the result never depends on an order: insert rewrites the leaves
// of a contiguous ring range and recomputes their ancestors as sums of children (level 1 in
// parallel, the levels above in the grid's last block); update_priorities adds leaf deltas to
// the ancestors with integer atomicAdd (DESIGN rule 3 allows integer atomics where order cannot
// matter). No float atomics anywhere.
//
// Every size, counter and schedule that changes between replays (added, step, max_q) is read
// from device memory, so a graph captured at one size samples rows added later.
//
// The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 5):
// every kernel takes blockIdx.y as the member mb. Each family of rows advances by mb times its
// stride argument (elements): the tree by st; the ring's state rows (s_obs, s_next, s_next_obs) by
// sr; its per-slot arrays (s_action, s_reward, s_discount, owner) by sc; a batch's rows (an insert's
// obs and next_obs, a gather's obs_out and next_obs_out) by sx; a batch's vectors (an insert's
// action, reward and discount, indices, qsel, td, weights, action_out, return_out, discount_out) by
// sv; the windows by sw; the flag scratch by FLAG_WORDS; each device scalar (added, step, max_q,
// status, beta, seed) by 1: [P] arrays. The Philox key is the member's seed[mb] and the counter the
// member's (step, stream_id), so a member draws what the agent alone draws. levels is shared (members
// have one capacity). The x grid, the block and each thread's work and order are the single launch's,
// so member mb gets the bits of a single launch on its rows; one member (gridDim.y = 1, mb = 0:
// every offset zero) is the single launch. The by-value constants (alpha, eps, the beta schedule,
// stream_id, the shapes) are one value for every member of a launch; sample_weights_members and
// update_priorities_members take each member's beta schedule, alpha and eps as [P] arrays.
#include <cudarl/philox.cuh>
#include <cudarl/units.cuh>
#include <cudarl/reduce.cuh>
#include <cudarl/window.cuh>

typedef long long i64;
typedef unsigned long long u64;

#define FANOUT 32
#define SCALE 16777216.0    // 2^24
#define Q_MAX (1LL << 40)
#define STATUS_EMPTY 1LL
#define STATUS_BAD_TD 2LL
#define STATUS_BAD_INDEX 4LL
#define STATUS_BAD_ROWS 8LL

__device__ __forceinline__ u64 umin64(u64 a, u64 b) { return a < b ? a : b; }
__device__ __forceinline__ u64 umax64(u64 a, u64 b) { return a > b ? a : b; }

// Add `delta` (two's complement) to every ancestor of `leaf`. Exact and order-independent.
__device__ __forceinline__ void add_to_ancestors(i64* tree, const i64* levels, int depth, i64 leaf, i64 delta) {
  if (delta == 0) return;
  i64 p = leaf;
  for (int k = 1; k <= depth; ++k) {
    p >>= 5;
    atomicAdd(reinterpret_cast<u64*>(tree + levels[k] + p), (u64)delta);
  }
}

// ---------------------------------------------------------------------------------------------
// insert: two launches, insert_check then insert_commit (the _next variants also take next_obs).
// A batch that fails the check must change nothing but `status`, and that decision needs the
// whole batch, so the check is one grid and the commit, which writes, a second.
//
// Both finish with the "last block" pattern (CUDA Programming Guide, threadFenceReduction; commit
// uses cudarl::last_block, check its own ticket that also counts bad blocks): each block, when
// done, takes a ticket from an arrival counter in `flag` (int64 scratch, FLAG_WORDS) with one
// integer atomicAdd; the block that draws the last ticket sees every other block's work, finishes
// the op alone and puts the counter back to 0 for the next launch. Which block is last depends on
// scheduling; what it computes does not (an OR of bits; integer sums of the finished level
// below), so the result is deterministic and no float is ever combined atomically.
#define FLAG_REJECT 0           // 1: the batch being inserted is rejected
#define FLAG_CHECK_ARRIVALS 1   // insert_check's arrival counter (0 between launches)
#define FLAG_COMMIT_ARRIVALS 2  // insert_commit's arrival counter (0 between launches)
#define FLAG_WORDS 3            // words of a member's flag scratch (reference.replay.FLAG_WORDS)
#define BAD_BLOCK (1ULL << 32)  // what a block that found a bad value adds on top of its ticket

// The member's batch to insert: mb * sx floats into obs (and next_obs), mb * sv into action, reward
// and discount (check_batch's and commit_batch's inputs).
template <bool kNext>
__device__ __forceinline__ void member_batch(i64 mb, i64 sx, i64 sv, const float*& obs, const float*& next_obs,
                                             const int*& action, const float*& reward, const float*& discount) {
  obs += mb * sx;
  if (kNext) next_obs += mb * sx;
  action += mb * sv;
  reward += mb * sv;
  discount += mb * sv;
}

// insert_check[_next]: grid-stride over the batch's B*D observations (and next_obs) and its B
// actions, rewards and discounts; a block ORs its threads' verdicts and adds 1 (+ BAD_BLOCK if
// bad) to flag[FLAG_CHECK_ARRIVALS]. The last block writes flag[FLAG_REJECT] (1 = reject; any
// block found a non-finite value, a discount outside [0, 1] or a negative action), sets
// status |= BAD_ROWS on reject and clears the counter. Reads B*D (2B*D) + 3B values.
template <bool kNext>
__device__ __forceinline__ void check_batch(const float* obs, const float* next_obs, const int* action,
                                            const float* reward, const float* discount, i64* flag, i64* status,
                                            i64 B, i64 D, i64 sx, i64 sv) {
  const i64 mb = blockIdx.y;  // the member: its batch, flag words and status
  member_batch<kNext>(mb, sx, sv, obs, next_obs, action, reward, discount);
  flag += mb * FLAG_WORDS;
  status += mb;
  const i64 stride = (i64)gridDim.x * blockDim.x;
  const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  int bad = 0;
  for (i64 e = t; e < B * D; e += stride) {
    bad |= !isfinite(obs[e]);
    if (kNext) bad |= !isfinite(next_obs[e]);
  }
  for (i64 r = t; r < B; r += stride) {
    const float d = discount[r];
    bad |= !isfinite(reward[r]) | !isfinite(d) | !(d >= 0.0f) | !(d <= 1.0f) | (action[r] < 0);
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    const u64 mine = bad ? BAD_BLOCK + 1ull : 1ull;
    const u64 seen = atomicAdd(reinterpret_cast<u64*>(flag + FLAG_CHECK_ARRIVALS), mine) + mine;
    if ((seen & 0xffffffffull) == (u64)gridDim.x) {  // the last ticket: every block has reported
      const i64 reject = (seen >> 32) != 0;
      flag[FLAG_REJECT] = reject;
      if (reject) status[0] |= STATUS_BAD_ROWS;
      atomicExch(reinterpret_cast<u64*>(flag + FLAG_CHECK_ARRIVALS), 0ull);
    }
  }
}

#if CUDARL_UNIT_IS(insert_check)
extern "C" __global__ void cudarl_replay_insert_check(const float* obs, const int* action, const float* reward,
                                                      const float* discount, i64* flag, i64* status, i64 B, i64 D,
                                                      i64 sx, i64 sv) {
  check_batch<false>(obs, nullptr, action, reward, discount, flag, status, B, D, sx, sv);  // next_obs: never read
}
#endif  // insert_check

#if CUDARL_UNIT_IS(insert_check_next)
extern "C" __global__ void cudarl_replay_insert_check_next(const float* obs, const float* next_obs, const int* action,
                                                           const float* reward, const float* discount, i64* flag,
                                                           i64* status, i64 B, i64 D, i64 sx, i64 sv) {
  check_batch<true>(obs, next_obs, action, reward, discount, flag, status, B, D, sx, sv);
}
#endif  // insert_check_next

// The nodes of one tree level (shift = 5 * level) whose subtree holds a slot of the ring range
// [s_lo, s_lo + R) mod C (0 <= s_lo < C, 1 <= R <= C): nodes lo .. lo+n1-1, then 0 .. n2-1 for the
// part that wrapped past slot C-1; merged into 0 .. n1-1 when that part reaches the first part's
// nodes, so every node is listed once. Twin: reference.replay.changed_nodes.
struct NodeSpan {
  i64 lo, n1, n2;
};

__device__ __forceinline__ NodeSpan changed_nodes(i64 s_lo, i64 R, i64 C, int shift) {
  const i64 end = s_lo + R;
  const i64 e1 = end < C ? end : C;
  NodeSpan sp;
  sp.lo = s_lo >> shift;
  sp.n1 = ((e1 - 1) >> shift) - sp.lo + 1;
  sp.n2 = end > C ? ((end - C - 1) >> shift) + 1 : 0;
  if (sp.n2 > sp.lo) {
    sp.n1 += sp.lo;
    sp.lo = 0;
    sp.n2 = 0;
  }
  return sp;
}

__device__ __forceinline__ i64 span_node(const NodeSpan& sp, i64 i) { return i < sp.n1 ? sp.lo + i : i - sp.n1; }

// insert_commit[_next] (skipped by every block when flag[FLAG_REJECT] != 0). With a0 = added,
// a1 = a0 + B, the leaves set are those of absolute rows [lo, a1), lo = max(a0 - lag, a1 - C, 0)
// (the new rows and the rows they make ready), R = a1 - lo <= C slots from s_lo = lo mod C.
//   blocks [0, row_blocks): a warp per batch row r (grid-stride), lanes over its D features:
//     copies the row (and next_obs) to slot (a0 + r) mod C. Reads and writes B*D (2B*D) + 3B values.
//   blocks [row_blocks, gridDim): a warp per level-1 node over the changed slots: lane c takes
//     leaf s = 32p + c; if s is in the range (absolute row a = lo + ((s - s_lo) mod C)) it writes
//     max_q if a + lag < a1 (ready) else 0, otherwise it reads the leaf; the warp's sum is the
//     node. Each node has one warp, so no leaf is read while being written. ~R/32 nodes, 264 B each.
//   the last block (cudarl::last_block, which leaves the ticket at 0): levels 2 .. depth over
//     changed_nodes, a warp per node summing its 32 children (read through L2: written by other
//     blocks), a __syncthreads between levels; then added = a1. Every other block read `added`
//     before its ticket.
#define COMMIT_THREADS 1024  // the launcher's block: 32 warps, so the last block takes a level of up to 32 nodes at once

template <bool kNext>
__device__ __forceinline__ void commit_batch(const float* obs, const float* next_obs, const int* action,
                                             const float* reward, const float* discount, float* s_obs,
                                             float* s_next_obs, int* s_action, float* s_reward, float* s_discount,
                                             i64* tree, const i64* levels, i64* flag, i64* added, const i64* max_q,
                                             i64 B, i64 D, i64 C, i64 lag, int depth, i64 row_blocks, i64 sx,
                                             i64 sv, i64 sr, i64 sc, i64 st) {
  {  // the member's batch, ring, tree, flag words and scalars (member 0: the pointers as given)
    const i64 mb = blockIdx.y;
    member_batch<kNext>(mb, sx, sv, obs, next_obs, action, reward, discount);
    s_obs += mb * sr;
    if (kNext) s_next_obs += mb * sr;
    s_action += mb * sc;
    s_reward += mb * sc;
    s_discount += mb * sc;
    tree += mb * st;
    flag += mb * FLAG_WORDS;
    added += mb;
    max_q += mb;
  }
  if (flag[FLAG_REJECT] != 0) return;  // the same word for every block: the whole grid skips
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 wpb = blockDim.x >> 5;
  const i64 a0 = added[0], a1 = a0 + B;
  i64 lo = a0 - lag;
  if (a1 - C > lo) lo = a1 - C;
  if (lo < 0) lo = 0;
  const i64 R = a1 - lo, s_lo = lo % C;
  if ((i64)blockIdx.x < row_blocks) {
    for (i64 r = (i64)blockIdx.x * wpb + warp; r < B; r += row_blocks * wpb) {
      const i64 slot = (a0 + r) % C;
      for (i64 c = lane; c < D; c += 32) {
        s_obs[slot * D + c] = obs[r * D + c];
        if (kNext) s_next_obs[slot * D + c] = next_obs[r * D + c];
      }
      if (lane == 0) {
        s_action[slot] = action[r];
        s_reward[slot] = reward[r];
        s_discount[slot] = discount[r];
      }
    }
  } else {
    const NodeSpan sp = changed_nodes(s_lo, R, C, 5);
    const i64 q_ready = max_q[0], parent = levels[1];
    const i64 warps = ((i64)gridDim.x - row_blocks) * wpb;
    for (i64 i = ((i64)blockIdx.x - row_blocks) * wpb + warp; i < sp.n1 + sp.n2; i += warps) {
      const i64 p = span_node(sp, i);
      const i64 s = p * FANOUT + lane;
      i64 v = 0;  // padding leaves (s >= C) are 0
      if (s < C) {
        i64 d = s - s_lo;
        if (d < 0) d += C;
        if (d < R) {  // slot s holds absolute row lo + d of this insert
          v = (lo + d < a1 - lag) ? q_ready : 0;
          tree[s] = v;
        } else {
          v = tree[s];
        }
      }
      v = cudarl::warp_sum(v);
      if (lane == 0) tree[parent + p] = v;
    }
  }
  // The ticket is the low 32 bits of the int64 word (little-endian; the high half stays 0). Every
  // thread's tree writes and its read of `added` come before its block's ticket.
  if (!cudarl::last_block(reinterpret_cast<unsigned int*>(flag + FLAG_COMMIT_ARRIVALS))) return;
  for (int k = 2; k <= depth; ++k) {
    const NodeSpan sp = changed_nodes(s_lo, R, C, 5 * k);
    const i64 src = levels[k - 1], dst = levels[k];
    for (i64 i = warp; i < sp.n1 + sp.n2; i += wpb) {
      const i64 p = span_node(sp, i);
      const i64 v = cudarl::warp_sum(__ldcg(tree + src + p * FANOUT + lane));
      if (lane == 0) tree[dst + p] = v;
    }
    __syncthreads();  // level k is complete before level k + 1 reads it
  }
  if (threadIdx.x == 0) added[0] = a1;
}

// The parameters of cudarl_replay_insert_commit, passed as one value (cudarl.signatures reads them here).
struct InsertCommitArgs {
  const float* obs;
  const int* action;
  const float* reward;
  const float* discount;
  float* s_obs;
  int* s_action;
  float* s_reward;
  float* s_discount;
  i64* tree;
  const i64* levels;
  i64* flag;
  i64* added;
  const i64* max_q;
  i64 B;
  i64 D;
  i64 C;
  i64 lag;
  int depth;
  i64 row_blocks;
  i64 sx;
  i64 sv;
  i64 sr;
  i64 sc;
  i64 st;
};

__device__ __forceinline__ void insert_commit_impl(
    const float* obs, const int* action, const float* reward, const float* discount, float* s_obs, int* s_action,
    float* s_reward, float* s_discount, i64* tree, const i64* levels, i64* flag, i64* added, const i64* max_q, i64 B,
    i64 D, i64 C, i64 lag, int depth, i64 row_blocks, i64 sx, i64 sv, i64 sr, i64 sc, i64 st) {
  commit_batch<false>(obs, nullptr, action, reward, discount, s_obs, nullptr, s_action, s_reward, s_discount, tree,
                      levels, flag, added, max_q, B, D, C, lag, depth, row_blocks, sx, sv, sr, sc,
                      st);  // next_obs: never touched
}

#if CUDARL_UNIT_IS(insert_commit)
extern "C" __global__ __launch_bounds__(COMMIT_THREADS, 1) void cudarl_replay_insert_commit(const InsertCommitArgs a) {
  insert_commit_impl(a.obs, a.action, a.reward, a.discount, a.s_obs, a.s_action, a.s_reward, a.s_discount, a.tree,
                     a.levels, a.flag, a.added, a.max_q, a.B, a.D, a.C, a.lag, a.depth, a.row_blocks, a.sx, a.sv,
                     a.sr, a.sc, a.st);
}
#endif  // insert_commit

// The parameters of cudarl_replay_insert_commit_next, passed as one value (cudarl.signatures reads them here).
struct InsertCommitNextArgs {
  const float* obs;
  const float* next_obs;
  const int* action;
  const float* reward;
  const float* discount;
  float* s_obs;
  float* s_next_obs;
  int* s_action;
  float* s_reward;
  float* s_discount;
  i64* tree;
  const i64* levels;
  i64* flag;
  i64* added;
  const i64* max_q;
  i64 B;
  i64 D;
  i64 C;
  i64 lag;
  int depth;
  i64 row_blocks;
  i64 sx;
  i64 sv;
  i64 sr;
  i64 sc;
  i64 st;
};

__device__ __forceinline__ void insert_commit_next_impl(
    const float* obs, const float* next_obs, const int* action, const float* reward, const float* discount,
    float* s_obs, float* s_next_obs, int* s_action, float* s_reward, float* s_discount, i64* tree, const i64* levels,
    i64* flag, i64* added, const i64* max_q, i64 B, i64 D, i64 C, i64 lag, int depth, i64 row_blocks, i64 sx, i64 sv,
    i64 sr, i64 sc, i64 st) {
  commit_batch<true>(obs, next_obs, action, reward, discount, s_obs, s_next_obs, s_action, s_reward, s_discount, tree,
                     levels, flag, added, max_q, B, D, C, lag, depth, row_blocks, sx, sv, sr, sc, st);
}

#if CUDARL_UNIT_IS(insert_commit_next)
extern "C" __global__ __launch_bounds__(COMMIT_THREADS, 1) void cudarl_replay_insert_commit_next(
    const InsertCommitNextArgs a) {
  insert_commit_next_impl(a.obs, a.next_obs, a.action, a.reward, a.discount, a.s_obs, a.s_next_obs, a.s_action,
                          a.s_reward, a.s_discount, a.tree, a.levels, a.flag, a.added, a.max_q, a.B, a.D, a.C, a.lag,
                          a.depth, a.row_blocks, a.sx, a.sv, a.sr, a.sc, a.st);
}
#endif  // insert_commit_next

// ---------------------------------------------------------------------------------------------
// sample_search: one warp per sample j (8 warps per block). Each lane computes the target
// (same value on every lane), then the warp descends the tree: at each level it reads the 32
// children (256 bytes), scans them inclusively with shuffles, and takes the first child whose
// inclusive sum exceeds the target. Reads depth*256 bytes per sample; writes indices[j],
// qsel[j]. T == 0 gives index 0, qsel 0 and status |= EMPTY.
// search_one is that warp's work (all 32 lanes; returns the leaf in every lane).
__device__ __forceinline__ i64 search_one(const i64* tree, const i64* levels, const i64* step, int* indices, i64* qsel,
                                          i64* status, i64 j, i64 B, int depth, u64 seed, unsigned int stream_id,
                                          int lane) {
  // levels[0 .. depth] in registers (lane k holds levels[k]; depth < 32 for any tree that fits in
  // memory), so each level's tree load waits on one load, not two: the same offsets, the same leaf.
  const i64 lv = lane <= depth ? levels[lane] : 0;
  const auto level = [&](int k) { return depth < 32 ? (i64)__shfl_sync(0xffffffffu, lv, k) : levels[k]; };
  const u64 T = (u64)tree[level(depth)];
  if (T == 0) {
    if (lane == 0) {
      indices[j] = 0;
      qsel[j] = 0;
      if (j == 0) atomicOr(reinterpret_cast<u64*>(status), (u64)STATUS_EMPTY);
    }
    return 0;
  }
  const uint4 rb = cudarl::philox_block(seed, (u64)step[0], stream_id, (unsigned int)j);
  const u64 r = ((u64)rb.y << 32) | (u64)rb.x;
  const u64 qB = T / (u64)B, rB = T % (u64)B;
  const u64 lo = (u64)j * qB + ((u64)j * rB) / (u64)B;
  const u64 hi = (u64)(j + 1) * qB + ((u64)(j + 1) * rB) / (u64)B;
  u64 t = lo + __umul64hi(r, hi - lo);
  i64 p = 0;
  for (int k = depth; k >= 1; --k) {
    const u64 v = (u64)tree[level(k - 1) + p * FANOUT + lane];
    u64 incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const u64 n = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += n;
    }
    unsigned int hit = __ballot_sync(0xffffffffu, incl > t);
    int c;
    if (hit) {
      c = __ffs(hit) - 1;
    } else {  // unreachable with a consistent tree; stay inside the last non-empty child
      const unsigned int nz = __ballot_sync(0xffffffffu, v > 0);
      c = nz ? 31 - __clz(nz) : 0;
    }
    const u64 incl_c = __shfl_sync(0xffffffffu, incl, c);
    const u64 v_c = __shfl_sync(0xffffffffu, v, c);
    t = hit ? t - (incl_c - v_c) : (v_c > 0 ? v_c - 1 : 0);
    p = p * FANOUT + c;
  }
  if (lane == 0) {
    indices[j] = (int)p;
    qsel[j] = tree[p];
  }
  return p;
}

// The member's tree, batch vectors and scalars (mb = blockIdx.y), for the searching kernels.
#define SEARCH_MEMBER()      \
  const i64 mb = blockIdx.y; \
  tree += mb * st;           \
  step += mb;                \
  indices += mb * sv;        \
  qsel += mb * sv;           \
  status += mb;              \
  seed += mb

#if CUDARL_UNIT_IS(sample_search)
extern "C" __global__ void cudarl_replay_sample_search(const i64* tree, const i64* levels, const i64* step,
                                                       int* indices, i64* qsel, i64* status, i64 B, int depth,
                                                       const u64* seed, unsigned int stream_id, i64 st, i64 sv) {
  const i64 j = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (j >= B) return;  // whole warps exit together (blockDim is a multiple of 32)
  SEARCH_MEMBER();
  search_one(tree, levels, step, indices, qsel, status, j, B, depth, seed[0], stream_id, (int)(threadIdx.x & 31));
}
#endif  // sample_search

// sample_weights: one block of 1024 threads (a member). Reads qsel [B] and step; writes
// weights[j] = (q_min / q_j)^beta (float64 pow, rounded to float32), beta[0], then step += 1.
namespace {

// One member's weights (its qsel, weights, step and beta at their offsets) with its beta schedule: the
// one statement of sample_weights and sample_weights_members. smin: the block's shared scratch [32].
__device__ __forceinline__ void sample_weights_one(const i64* qsel, float* weights, i64* step, double* beta_out, i64 B,
                                                   double beta0, double beta_final, i64 beta_steps, u64* smin) {
  const i64 s = step[0];
  double frac = __ddiv_rn((double)s, (double)beta_steps);
  if (frac > 1.0) frac = 1.0;
  const double beta = __dadd_rn(beta0, __dmul_rn(__dadd_rn(beta_final, -beta0), frac));
  u64 m = ~0ull;
  for (i64 j = threadIdx.x; j < B; j += blockDim.x) m = umin64(m, (u64)qsel[j]);
  m = cudarl::warp_min(m);
  if ((threadIdx.x & 31) == 0) smin[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = cudarl::warp_min(threadIdx.x < (blockDim.x >> 5) ? smin[threadIdx.x] : ~0ull);
    if (threadIdx.x == 0) smin[0] = m;
  }
  __syncthreads();
  const u64 qmin = smin[0];
  for (i64 j = threadIdx.x; j < B; j += blockDim.x) {
    const u64 q = (u64)qsel[j];
    weights[j] = (qmin == 0 || q == 0) ? 0.0f : (float)pow(__ddiv_rn((double)qmin, (double)q), beta);
  }
  __syncthreads();  // every thread has read step[0]
  if (threadIdx.x == 0) {
    beta_out[0] = beta;
    step[0] = s + 1;
  }
}

}  // namespace

#if CUDARL_UNIT_IS(sample_weights)
extern "C" __global__ void cudarl_replay_sample_weights(const i64* qsel, float* weights, i64* step, double* beta_out,
                                                        i64 B, double beta0, double beta_final, i64 beta_steps,
                                                        i64 sv) {
  __shared__ u64 smin[32];
  const i64 mb = blockIdx.y;  // one block per member (block (0, mb))
  sample_weights_one(qsel + mb * sv, weights + mb * sv, step + mb, beta_out + mb, B, beta0, beta_final, beta_steps,
                     smin);
}
#endif  // sample_weights

// sample_weights_members: sample_weights whose members each run their own beta schedule: beta0,
// beta_final (double) and beta_steps (i64) are [P] arrays (sample_weights' by-value types), member mb
// reading element mb, so it gets the bits of sample_weights launched alone with its schedule.
#if CUDARL_UNIT_IS(sample_weights_members)
extern "C" __global__ void cudarl_replay_sample_weights_members(const i64* qsel, float* weights, i64* step,
                                                                double* beta_out, i64 B, const double* beta0,
                                                                const double* beta_final, const i64* beta_steps,
                                                                i64 sv) {
  __shared__ u64 smin[32];
  const i64 mb = blockIdx.y;
  sample_weights_one(qsel + mb * sv, weights + mb * sv, step + mb, beta_out + mb, B, beta0[mb], beta_final[mb],
                     beta_steps[mb], smin);
}
#endif  // sample_weights_members

// ---------------------------------------------------------------------------------------------
// gather: thread per (sample j, column c < D), B*D threads. Reads 2 obs rows of D floats and
// n (reward, discount) pairs per sample; the bootstrap row is row (s + lag) mod C of s_next:
// s_next = s_obs and lag = n*n_envs normally, or the stored next_obs ring and lag = 0 with
// store_next_obs. Writes obs_out/next_obs_out [B, D],
// and for c == 0 action_out, return_out, discount_out. The n-step sums use explicitly rounded
// float32 operations (no FMA contraction) in the reference's order, so they match bitwise.
// An index outside [0, C) gives a zero row and status |= BAD_INDEX.
// gather_one is one (j, c) of it, from slot s.
__device__ __forceinline__ void gather_one(const float* s_obs, const int* s_action, const float* s_reward,
                                           const float* s_discount, const float* s_next, i64 j, i64 c, i64 s,
                                           float* obs_out, float* next_obs_out, int* action_out, float* return_out,
                                           float* discount_out, i64* status, i64 D, i64 C, i64 n_envs,
                                           int n_step, i64 lag) {
  const i64 e = j * D + c;
  if (s < 0 || s >= C) {  // never read out of bounds: a zero row and a status bit
    obs_out[e] = 0.0f;
    next_obs_out[e] = 0.0f;
    if (c == 0) {
      action_out[j] = 0;
      return_out[j] = 0.0f;
      discount_out[j] = 0.0f;
      atomicOr(reinterpret_cast<u64*>(status), (u64)STATUS_BAD_INDEX);
    }
    return;
  }
  const i64 nxt = (s + lag) % C;
  obs_out[e] = s_obs[s * D + c];
  next_obs_out[e] = s_next[nxt * D + c];
  if (c == 0) {
    // row = (s + k n_envs) mod C, stepped: s < C and inc = n_envs mod C < C, so one subtraction keeps
    // it in [0, C) (the same rows as the modulo per k, one 64-bit division in all instead of n_step).
    const i64 inc = n_step > 1 ? n_envs % C : 0;
    float G = 0.0f, g = 1.0f;
    i64 row = s;
    for (int k = 0; k < n_step; ++k) {
      G = __fadd_rn(G, __fmul_rn(g, s_reward[row]));
      g = __fmul_rn(g, s_discount[row]);
      row += inc;
      if (row >= C) row -= C;
    }
    action_out[j] = s_action[s];
    return_out[j] = G;
    discount_out[j] = g;
  }
}

// The parameters of cudarl_replay_gather, passed as one value (cudarl.signatures reads them here).
struct GatherArgs {
  const float* s_obs;
  const int* s_action;
  const float* s_reward;
  const float* s_discount;
  const float* s_next;
  const int* indices;
  float* obs_out;
  float* next_obs_out;
  int* action_out;
  float* return_out;
  float* discount_out;
  i64* status;
  i64 B;
  i64 D;
  i64 C;
  i64 n_envs;
  int n_step;
  i64 lag;
  i64 sv;
  i64 sx;
  i64 sr;
  i64 sc;
};

// The member's ring and batch (mb = blockIdx.y), for the gathering kernels.
#define GATHER_MEMBER()    \
  s_obs += mb * sr;        \
  s_next += mb * sr;       \
  s_action += mb * sc;     \
  s_reward += mb * sc;     \
  s_discount += mb * sc;   \
  obs_out += mb * sx;      \
  next_obs_out += mb * sx; \
  action_out += mb * sv;   \
  return_out += mb * sv;   \
  discount_out += mb * sv

__device__ __forceinline__ void gather_impl(const float* s_obs, const int* s_action, const float* s_reward,
                                            const float* s_discount, const float* s_next, const int* indices,
                                            float* obs_out, float* next_obs_out, int* action_out,
                                            float* return_out, float* discount_out, i64* status, i64 B, i64 D,
                                            i64 C, i64 n_envs, int n_step, i64 lag, i64 sv, i64 sx, i64 sr, i64 sc) {
  const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= B * D) return;
  const i64 mb = blockIdx.y;
  GATHER_MEMBER();
  indices += mb * sv;
  status += mb;
  const i64 j = e / D;
  gather_one(s_obs, s_action, s_reward, s_discount, s_next, j, e - j * D, indices[j], obs_out, next_obs_out, action_out,
             return_out, discount_out, status, D, C, n_envs, n_step, lag);
}

#if CUDARL_UNIT_IS(gather)
extern "C" __global__ void cudarl_replay_gather(const GatherArgs a) {
  gather_impl(a.s_obs, a.s_action, a.s_reward, a.s_discount, a.s_next, a.indices, a.obs_out, a.next_obs_out,
              a.action_out, a.return_out, a.discount_out, a.status, a.B, a.D, a.C, a.n_envs, a.n_step, a.lag, a.sv,
              a.sx, a.sr, a.sc);
}
#endif  // gather

// One warp's sample j of sample_search_gather (all 32 lanes): the search, then the gather of the
// slot found (lanes over the D columns). Returns the slot (every lane).
__device__ __forceinline__ i64 search_gather_warp(const i64* tree, const i64* levels, const i64* step, int* indices,
                                                  i64* qsel, i64* status, i64 B, int depth, u64 seed,
                                                  unsigned int stream_id, const float* s_obs, const int* s_action,
                                                  const float* s_reward, const float* s_discount, const float* s_next,
                                                  float* obs_out, float* next_obs_out, int* action_out,
                                                  float* return_out, float* discount_out, i64 D, i64 C, i64 n_envs,
                                                  int n_step, i64 lag, i64 j, int lane) {
  const i64 s = search_one(tree, levels, step, indices, qsel, status, j, B, depth, seed, stream_id, lane);
  for (i64 c = lane; c < D; c += 32)
    gather_one(s_obs, s_action, s_reward, s_discount, s_next, j, c, s, obs_out, next_obs_out, action_out, return_out,
               discount_out, status, D, C, n_envs, n_step, lag);
  return s;
}

// ---------------------------------------------------------------------------------------------
// sample_search_gather: sample_search and gather in one launch. The warp that finds sample j's
// slot gathers it (lanes over the D columns, lane 0 the action and n-step targets): the same
// writes, so the same bits, as sample_search then gather, one graph node fewer on the train
// step's chain. Threads: one warp per sample, as sample_search.
#if CUDARL_UNIT_IS(sample_search_gather)
extern "C" __global__ void cudarl_replay_sample_search_gather(
    const i64* tree, const i64* levels, const i64* step, int* indices, i64* qsel, i64* status, i64 B, int depth,
    const u64* seed, unsigned int stream_id, const float* s_obs, const int* s_action, const float* s_reward,
    const float* s_discount, const float* s_next, float* obs_out, float* next_obs_out, int* action_out,
    float* return_out, float* discount_out, i64 D, i64 C, i64 n_envs, int n_step, i64 lag, i64 st, i64 sv, i64 sx,
    i64 sr, i64 sc) {
  const i64 j = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (j >= B) return;  // whole warps exit together (blockDim is a multiple of 32)
  SEARCH_MEMBER();
  GATHER_MEMBER();
  search_gather_warp(tree, levels, step, indices, qsel, status, B, depth, seed[0], stream_id, s_obs, s_action, s_reward,
                     s_discount, s_next, obs_out, next_obs_out, action_out, return_out, discount_out, D, C, n_envs,
                     n_step, lag, j, (int)(threadIdx.x & 31));
}
#endif  // sample_search_gather

// sample_search_gather_windows: sample_search_gather, then the observation windows of the two state
// rows (D = 4: bar, mirror, position, hold) the search has just gathered, in the same launch:
//   obs_win[j] = window of obs_out[j], next_win[j] = window of next_obs_out[j]
// (cudarl::window_value: window.gather's bits; a bad index's zero rows give the windows of zero
// rows, as window.gather of them would). One node fewer on the train step's chain (the window
// gather was the launch after the search). Threads: a group of `wps` warps per sample (wps divides
// SW_THREADS / 32; the launcher's choice from the window's size): the group's first warp searches and
// gathers, hands the slot to the others through shared memory, and the group's lanes split the
// window's window * (F + 2) floats, twice. Reads the rows from the ring (not the outputs just written).
// At window 64 one warp a sample wrote 544 floats a lane, the step's longest serial chain after the
// scans (148 us of the SSM train step at bf6ed31); eight warps write 68. The writer of an element
// changes no bit. Blocks of SW_THREADS (the launcher's 32 * _WARPS_PER_BLOCK), at most 40 registers a
// thread (ptxas at sm_90: no spill), so six blocks (48 warps) an SM: each search is a chain of
// dependent loads (the tree levels, the row, the features), and more warps hide more of it
// (ncu at a75a02b, P = 64: 89.0 us against a 13.2 us floor). Registers change no bit.
#define SW_THREADS 256
#if CUDARL_UNIT_IS(sample_search_gather_windows)
extern "C" __global__ __launch_bounds__(SW_THREADS, 6) void cudarl_replay_sample_search_gather_windows(
    const i64* tree, const i64* levels, const i64* step, int* indices, i64* qsel, i64* status, i64 B, int depth,
    const u64* seed, unsigned int stream_id, const float* s_obs, const int* s_action, const float* s_reward,
    const float* s_discount, const float* s_next, float* obs_out, float* next_obs_out, int* action_out,
    float* return_out, float* discount_out, i64 D, i64 C, i64 n_envs, int n_step, i64 lag,
    const float* __restrict__ features, const float* __restrict__ sign, float* __restrict__ obs_win,
    float* __restrict__ next_win, int window, int n_features, i64 n_bars, i64 st, i64 sv, i64 sx, i64 sr, i64 sc,
    i64 sw, int wps) {
  __shared__ i64 slot[SW_THREADS / 32];  // a group's slot, at its first warp's index
  const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
  const int k = warp % wps, lead = warp - k;  // this warp's place in its group, and the group's first warp
  const i64 j = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / (32 * wps);
  SEARCH_MEMBER();
  GATHER_MEMBER();
  obs_win += mb * sw;
  next_win += mb * sw;
  if (k == 0 && j < B) {
    const i64 s = search_gather_warp(tree, levels, step, indices, qsel, status, B, depth, seed[0], stream_id, s_obs,
                                     s_action, s_reward, s_discount, s_next, obs_out, next_obs_out, action_out,
                                     return_out, discount_out, D, C, n_envs, n_step, lag, j, lane);
    if (lane == 0) slot[warp] = s;
  }
  __syncthreads();  // every warp of the block reaches it (no early return above)
  if (j >= B) return;
  const i64 s = slot[lead];
  float r0 = 0.0f, r1 = 0.0f, r2 = 0.0f, r3 = 0.0f, n0 = 0.0f, n1 = 0.0f, n2 = 0.0f, n3 = 0.0f;
  if (s >= 0 && s < C) {  // the values gather_one copied (every lane reads them: one cached line each)
    const float* r = s_obs + s * D;
    const float* nr = s_next + ((s + lag) % C) * D;
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
    n0 = nr[0], n1 = nr[1], n2 = nr[2], n3 = nr[3];
  }
  const int bar_width = n_features + 2, stride = 32 * wps, e0 = 32 * k + lane;
  const i64 row_width = (i64)window * bar_width;
  // (w, col) = divmod(e, bar_width), stepped with e (no 64-bit division per element)
  int w = e0 / bar_width, col = e0 % bar_width;
  for (i64 e = e0; e < row_width; e += stride) {
    obs_win[j * row_width + e] = cudarl::window_value(r0, r1, r2, r3, features, sign, w, col, window, n_features, n_bars);
    next_win[j * row_width + e] =
        cudarl::window_value(n0, n1, n2, n3, features, sign, w, col, window, n_features, n_bars);
    col += stride;
    while (col >= bar_width) {
      col -= bar_width;
      ++w;
    }
  }
}
#endif  // sample_search_gather_windows

// ---------------------------------------------------------------------------------------------
// update_priorities: one block of 1024 threads (a member), three phases over the batch:
//   1. owner[idx] = max j over occurrences (integer atomicMax: the last occurrence wins);
//   2. each winner with a finite td on a ready row writes its leaf and adds the delta to the
//      ancestors; the block's largest new leaf raises max_q;
//   3. winners reset owner[idx] = -1 (every touched entry has exactly one winner).
// Reads B indices and tds, 32-bit owner entries, depth ancestors per winner.
namespace {

// One member's update (its batch, tree, owner scratch and scalars at their offsets) with its alpha and
// eps: the one statement of update_priorities and update_priorities_members. smax [32], sflags: the
// block's shared scratch.
__device__ __forceinline__ void update_priorities_one(const int* indices, const float* td, i64* tree,
                                                      const i64* levels, int* owner, i64* max_q, i64* status, i64 B,
                                                      i64 C, int depth, double alpha, double eps, u64* smax,
                                                      int* sflags) {
  if (threadIdx.x == 0) *sflags = 0;
  __syncthreads();
  int flags = 0;
  for (i64 j = threadIdx.x; j < B; j += blockDim.x) {
    const int i = indices[j];
    if (i >= 0 && i < C) atomicMax(owner + i, (int)j);
    else flags |= (int)STATUS_BAD_INDEX;
  }
  __syncthreads();
  u64 m = 0;
  for (i64 j = threadIdx.x; j < B; j += blockDim.x) {
    const int i = indices[j];
    if (i < 0 || i >= C || owner[i] != (int)j) continue;
    const float d = td[j];
    if (!isfinite(d)) { flags |= (int)STATUS_BAD_TD; continue; }
    const i64 old = tree[i];
    if (old == 0) continue;  // not ready (overwritten since sampled): leave it
    const double x = pow(__dadd_rn(fabs((double)d), eps), alpha);
    double y = rint(__dmul_rn(x, SCALE));
    y = y < 1.0 ? 1.0 : (y > (double)Q_MAX ? (double)Q_MAX : y);
    const i64 q = (i64)y;
    tree[i] = q;
    add_to_ancestors(tree, levels, depth, i, q - old);
    m = umax64(m, (u64)q);
  }
  m = cudarl::warp_max(m);
  if ((threadIdx.x & 31) == 0) smax[threadIdx.x >> 5] = m;
  if (flags) atomicOr(sflags, flags);
  __syncthreads();
  for (i64 j = threadIdx.x; j < B; j += blockDim.x) {
    const int i = indices[j];
    if (i >= 0 && i < C && owner[i] == (int)j) owner[i] = -1;
  }
  if (threadIdx.x == 0) {
    u64 mm = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) mm = umax64(mm, smax[w]);
    if ((i64)mm > max_q[0]) max_q[0] = (i64)mm;
    if (*sflags) status[0] |= (i64)*sflags;
  }
}

}  // namespace

#if CUDARL_UNIT_IS(update_priorities)
extern "C" __global__ void cudarl_replay_update_priorities(const int* indices, const float* td, i64* tree,
                                                           const i64* levels, int* owner, i64* max_q, i64* status,
                                                           i64 B, i64 C, int depth, double alpha, double eps,
                                                           i64 sv, i64 st, i64 sc) {
  __shared__ u64 smax[32];
  __shared__ int sflags;
  const i64 mb = blockIdx.y;  // one block per member (block (0, mb)): its batch, tree, owner scratch and scalars
  update_priorities_one(indices + mb * sv, td + mb * sv, tree + mb * st, levels, owner + mb * sc, max_q + mb,
                        status + mb, B, C, depth, alpha, eps, smax, &sflags);
}
#endif  // update_priorities

// update_priorities_members: update_priorities whose members each have their own alpha and eps ([P]
// arrays of update_priorities' by-value type, double), member mb reading element mb: the bits of
// update_priorities launched alone with its constants.
#if CUDARL_UNIT_IS(update_priorities_members)
extern "C" __global__ void cudarl_replay_update_priorities_members(const int* indices, const float* td, i64* tree,
                                                                   const i64* levels, int* owner, i64* max_q,
                                                                   i64* status, i64 B, i64 C, int depth,
                                                                   const double* alpha, const double* eps, i64 sv,
                                                                   i64 st, i64 sc) {
  __shared__ u64 smax[32];
  __shared__ int sflags;
  const i64 mb = blockIdx.y;
  update_priorities_one(indices + mb * sv, td + mb * sv, tree + mb * st, levels, owner + mb * sc, max_q + mb,
                        status + mb, B, C, depth, alpha[mb], eps[mb], smax, &sflags);
}
#endif  // update_priorities_members

// ---------------------------------------------------------------------------------------------
// tree_level: thread p < n_dst sums the 32 children of node p: reads 256 bytes, writes 8.
// Launched once per level, bottom up, to rebuild the tree after a state is loaded.
#if CUDARL_UNIT_IS(tree_level)
extern "C" __global__ void cudarl_replay_tree_level(i64* tree, i64 src_off, i64 dst_off, i64 n_dst, i64 st) {
  const i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= n_dst) return;
  tree += (i64)blockIdx.y * st;  // the member's tree
  i64 s = 0;
  for (int c = 0; c < FANOUT; ++c) s += tree[src_off + p * FANOUT + c];
  tree[dst_off + p] = s;
}
#endif  // tree_level
