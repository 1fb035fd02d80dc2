// Prioritized replay (Schaul et al. 2016, proportional, stratified) with n-step returns.
// Twin: cudarl/reference/replay.py (read its module docstring for the math and the rules).
//
// State: a ring of C rows; an int64 sum tree of fixed-point leaves (q = rint(p^alpha * 2^24),
// 1 <= q <= 2^40 for ready rows, 0 otherwise), 32-way, leaves first, level offsets in
// `levels`; device scalars added/step/max_q/status (int64) and beta (float64).
// Integer sums are exact, so the tree is maintained incrementally with integer atomicAdd of
// deltas: the result does not depend on the order of the atomics (DESIGN rule 3 allows integer
// atomics where order cannot matter). No float atomics anywhere.
//
// Every size, counter and schedule that changes between replays (added, step, max_q) is read
// from device memory, so a graph captured at one size samples rows added later.
#include <cudarl/philox.cuh>
#include <cudarl/reduce.cuh>

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

// 1 if any of x[threadIdx.x], x[threadIdx.x + blockDim.x], ... (below n) is NaN or inf.
__device__ __forceinline__ int thread_any_nonfinite(const float* x, i64 n) {
  int bad = 0;
  for (i64 e = threadIdx.x; e < n; e += blockDim.x) bad |= !isfinite(x[e]);
  return bad;
}

// Thread e < B*D copies x[e] (row r = e / D of the batch) to row (added + r) mod C of the ring.
__device__ __forceinline__ void ring_store(const float* x, float* ring, i64 e, i64 added, i64 D, i64 C) {
  const i64 r = e / D, c = e - r * D;
  ring[((added + r) % C) * D + c] = x[e];
}

// ---------------------------------------------------------------------------------------------
// insert_check: one block; thread t scans elements t, t+blockDim, ... of the batch.
// Reads B*D + 3B values; writes flag[0] (1 = reject) and, on reject, status |= BAD_ROWS.
extern "C" __global__ void cudarl_replay_insert_check(const float* obs, const int* action, const float* reward,
                                                      const float* discount, i64* flag, i64* status, i64 B, i64 D) {
  int bad = thread_any_nonfinite(obs, B * D);
  for (i64 r = threadIdx.x; r < B; r += blockDim.x) {
    const float d = discount[r];
    bad |= !isfinite(reward[r]) | !isfinite(d) | !(d >= 0.0f) | !(d <= 1.0f) | (action[r] < 0);
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    flag[0] = bad;
    if (bad) status[0] |= STATUS_BAD_ROWS;
  }
}

// insert_rows: thread per (row r, feature c) of the batch, B*D threads.
// Reads B*D + 3B values; writes them at slot (added + r) mod C. Skipped when flag[0] != 0.
extern "C" __global__ void cudarl_replay_insert_rows(const float* obs, const int* action, const float* reward,
                                                     const float* discount, float* s_obs, int* s_action,
                                                     float* s_reward, float* s_discount, const i64* flag,
                                                     const i64* added, i64 B, i64 D, i64 C) {
  const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= B * D || flag[0] != 0) return;
  const i64 r = e / D, c = e - r * D;
  const i64 slot = (added[0] + r) % C;
  ring_store(obs, s_obs, e, added[0], D, C);
  if (c == 0) {
    s_action[slot] = action[r];
    s_reward[slot] = reward[r];
    s_discount[slot] = discount[r];
  }
}

// insert_next_check (store_next_obs only; launched after insert_check): one block, thread t
// scans elements t, t+blockDim, ... of next_obs [B, D]. Reads B*D floats; on a non-finite value
// sets flag[0] = 1 and status |= BAD_ROWS (never clears flag: insert_check owns that).
extern "C" __global__ void cudarl_replay_insert_next_check(const float* next_obs, i64* flag, i64* status, i64 B,
                                                           i64 D) {
  const int bad = __syncthreads_or(thread_any_nonfinite(next_obs, B * D));
  if (threadIdx.x == 0 && bad) {
    flag[0] = 1;
    status[0] |= STATUS_BAD_ROWS;
  }
}

// insert_next_rows (store_next_obs only): thread per (row, feature), B*D threads. Reads B*D
// floats; writes them at row (added + r) mod C of s_next_obs. Skipped when flag[0] != 0.
extern "C" __global__ void cudarl_replay_insert_next_rows(const float* next_obs, float* s_next_obs, const i64* flag,
                                                          const i64* added, i64 B, i64 D, i64 C) {
  const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= B * D || flag[0] != 0) return;
  ring_store(next_obs, s_next_obs, e, added[0], D, C);
}

// insert_priorities: thread t handles absolute row a = lo + t with
// lo = max(added - lag, added + B - C, 0), a < added + B (at most B + lag threads).
// Leaf of a := max_q if a + lag < added + B (ready) else 0; ancestors get the delta.
extern "C" __global__ void cudarl_replay_insert_priorities(i64* tree, const i64* levels, const i64* flag,
                                                           const i64* added, const i64* max_q, i64 B, i64 C,
                                                           i64 lag, int depth) {
  if (flag[0] != 0) return;
  const i64 a0 = added[0], a1 = a0 + B;
  i64 lo = a0 - lag;
  if (a1 - C > lo) lo = a1 - C;
  if (lo < 0) lo = 0;
  const i64 a = lo + (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (a >= a1) return;
  const i64 slot = a % C;
  const i64 q = (a < a1 - lag) ? max_q[0] : 0;
  const i64 old = tree[slot];
  tree[slot] = q;
  add_to_ancestors(tree, levels, depth, slot, q - old);
}

// insert_advance: one thread; added += B unless the batch was rejected.
extern "C" __global__ void cudarl_replay_insert_advance(i64* added, const i64* flag, i64 B) {
  if (flag[0] == 0) added[0] += B;
}

// ---------------------------------------------------------------------------------------------
// sample_search: one warp per sample j (8 warps per block). Each lane computes the target
// (same value on every lane), then the warp descends the tree: at each level it reads the 32
// children (256 bytes), scans them inclusively with shuffles, and takes the first child whose
// inclusive sum exceeds the target. Reads depth*256 bytes per sample; writes indices[j],
// qsel[j]. T == 0 gives index 0, qsel 0 and status |= EMPTY.
extern "C" __global__ void cudarl_replay_sample_search(const i64* tree, const i64* levels, const i64* step,
                                                       int* indices, i64* qsel, i64* status, i64 B, int depth,
                                                       u64 seed, unsigned int stream_id) {
  const i64 j = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (j >= B) return;  // whole warps exit together (blockDim is a multiple of 32)
  const u64 T = (u64)tree[levels[depth]];
  if (T == 0) {
    if (lane == 0) {
      indices[j] = 0;
      qsel[j] = 0;
      if (j == 0) atomicOr(reinterpret_cast<u64*>(status), (u64)STATUS_EMPTY);
    }
    return;
  }
  const uint4 rb = cudarl::philox_block(seed, (u64)step[0], stream_id, (unsigned int)j);
  const u64 r = ((u64)rb.y << 32) | (u64)rb.x;
  const u64 qB = T / (u64)B, rB = T % (u64)B;
  const u64 lo = (u64)j * qB + ((u64)j * rB) / (u64)B;
  const u64 hi = (u64)(j + 1) * qB + ((u64)(j + 1) * rB) / (u64)B;
  u64 t = lo + __umul64hi(r, hi - lo);
  i64 p = 0;
  for (int k = depth; k >= 1; --k) {
    const u64 v = (u64)tree[levels[k - 1] + p * FANOUT + lane];
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
}

// sample_weights: one block of 1024 threads. Reads qsel [B] and step; writes
// weights[j] = (q_min / q_j)^beta (float64 pow, rounded to float32), beta[0], then step += 1.
extern "C" __global__ void cudarl_replay_sample_weights(const i64* qsel, float* weights, i64* step, double* beta_out,
                                                        i64 B, double beta0, double beta_final, i64 beta_steps) {
  __shared__ u64 smin[32];
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

// ---------------------------------------------------------------------------------------------
// gather: thread per (sample j, column c < W), B*W threads. Reads 2 obs rows of D floats and
// n (reward, discount) pairs per sample; the bootstrap row is row (s + lag) mod C of s_next:
// s_next = s_obs and lag = n*n_envs normally, or the stored next_obs ring and lag = 0 with
// store_next_obs. Writes obs_out/next_obs_out [B, W] (zero for c >= D),
// and for c == 0 action_out, return_out, discount_out. The n-step sums use explicitly rounded
// float32 operations (no FMA contraction) in the reference's order, so they match bitwise.
// An index outside [0, C) gives a zero row and status |= BAD_INDEX.
extern "C" __global__ void cudarl_replay_gather(const float* s_obs, const int* s_action, const float* s_reward,
                                                const float* s_discount, const float* s_next, const int* indices,
                                                float* obs_out, float* next_obs_out, int* action_out,
                                                float* return_out, float* discount_out, i64* status, i64 B, i64 D,
                                                i64 W, i64 C, i64 n_envs, int n_step, i64 lag) {
  const i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= B * W) return;
  const i64 j = e / W, c = e - j * W;
  const i64 s = indices[j];
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
  obs_out[e] = c < D ? s_obs[s * D + c] : 0.0f;
  next_obs_out[e] = c < D ? s_next[nxt * D + c] : 0.0f;
  if (c == 0) {
    float G = 0.0f, g = 1.0f;
    for (int k = 0; k < n_step; ++k) {
      const i64 row = (s + (i64)k * n_envs) % C;
      G = __fadd_rn(G, __fmul_rn(g, s_reward[row]));
      g = __fmul_rn(g, s_discount[row]);
    }
    action_out[j] = s_action[s];
    return_out[j] = G;
    discount_out[j] = g;
  }
}

// ---------------------------------------------------------------------------------------------
// update_priorities: one block of 1024 threads, three phases over the batch:
//   1. owner[idx] = max j over occurrences (integer atomicMax: the last occurrence wins);
//   2. each winner with a finite td on a ready row writes its leaf and adds the delta to the
//      ancestors; the block's largest new leaf raises max_q;
//   3. winners reset owner[idx] = -1 (every touched entry has exactly one winner).
// Reads B indices and tds, 32-bit owner entries, depth ancestors per winner.
extern "C" __global__ void cudarl_replay_update_priorities(const int* indices, const float* td, i64* tree,
                                                           const i64* levels, int* owner, i64* max_q, i64* status,
                                                           i64 B, i64 C, int depth, double alpha, double eps) {
  __shared__ u64 smax[32];
  __shared__ int sflags;
  if (threadIdx.x == 0) sflags = 0;
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
  if (flags) atomicOr(&sflags, flags);
  __syncthreads();
  for (i64 j = threadIdx.x; j < B; j += blockDim.x) {
    const int i = indices[j];
    if (i >= 0 && i < C && owner[i] == (int)j) owner[i] = -1;
  }
  if (threadIdx.x == 0) {
    u64 mm = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) mm = umax64(mm, smax[w]);
    if ((i64)mm > max_q[0]) max_q[0] = (i64)mm;
    if (sflags) status[0] |= (i64)sflags;
  }
}

// ---------------------------------------------------------------------------------------------
// tree_level: thread p < n_dst sums the 32 children of node p: reads 256 bytes, writes 8.
// Launched once per level, bottom up, to rebuild the tree after a state is loaded.
extern "C" __global__ void cudarl_replay_tree_level(i64* tree, i64 src_off, i64 dst_off, i64 n_dst) {
  const i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= n_dst) return;
  i64 s = 0;
  for (int c = 0; c < FANOUT; ++c) s += tree[src_off + p * FANOUT + c];
  tree[dst_off + p] = s;
}
