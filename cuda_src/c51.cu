// C51 targets and loss (Bellemare et al. 2017) with double-DQN selection.
// Twin: cudarl/reference/c51.py. Launchers: cudarl/ops/c51.py.
//
// Layout: logits [B, A, K] row-major, support [K] uniform (z_k = v_min + k dz), actions int32 [B].
// Every per-sample op maps ONE WARP TO ONE SAMPLE: lanes stride over atoms, and sums/maxima
// use an xor butterfly (IEEE + and max are commutative, so every lane ends with the same bits,
// and the order is fixed: results are bitwise repeatable). Batch reductions are one block's
// fixed-order tree; the only atomic is the integer ticket of cudarl::last_block (reduce.cuh).
//
// The train step's targets phase is cudarl_c51_targets (no PopArt: one launch), or
// cudarl_c51_next_probs_td then cudarl_c51_project_popart (PopArt: two launches); the loss phase
// is cudarl_c51_loss (one launch, the batch mean included). next_probs and project are the
// same rows as standalone ops.

#include <cudarl/dueling.cuh>
#include <cudarl/popart.cuh>
#include <cudarl/reduce.cuh>

#define C51_WARP 32
// NVRTC has no <math.h>: infinities and NaN by bit pattern.
#define C51_NEG_INF __int_as_float((int)0xff800000u)
#define C51_NAN __int_as_float((int)0x7fffffffu)

namespace {

using cudarl::warp_max;
using cudarl::warp_sum;

// Max and sum of exp(x - max) of one row of K logits, the same in every lane.
__device__ __forceinline__ void row_softmax_stats(const float* x, int K, int lane, float& m, float& s) {
  float mx = C51_NEG_INF;
  for (int k = lane; k < K; k += C51_WARP) mx = fmaxf(mx, x[k]);
  m = warp_max(mx);
  float acc = 0.f;
  for (int k = lane; k < K; k += C51_WARP) acc += expf(x[k] - m);
  s = warp_sum(acc);
}

// Double-DQN selection of one sample, by one warp: a* = argmax_a sum_k softmax(online[a])_k z_k
// (first max on ties), the same in every lane. online: [A, K]. Four actions at a time, their
// reductions interleaved (independent shuffle chains: the warp waits on one latency, not four);
// each action's arithmetic is the one-at-a-time form's, so the same q bits and the same a*.
#define C51_SEL 4
__device__ __forceinline__ int select_action(const float* online, const float* support, int A, int K, int lane) {
  int best = 0;
  float best_q = C51_NEG_INF;
  for (int a0 = 0; a0 < A; a0 += C51_SEL) {
    const int n = A - a0 < C51_SEL ? A - a0 : C51_SEL;
    const float* x = online + (long long)a0 * K;
    float m[C51_SEL], s[C51_SEL], acc[C51_SEL];
#pragma unroll
    for (int u = 0; u < C51_SEL; ++u) m[u] = C51_NEG_INF;
    for (int k = lane; k < K; k += C51_WARP)
#pragma unroll
      for (int u = 0; u < C51_SEL; ++u)
        if (u < n) m[u] = fmaxf(m[u], x[u * K + k]);
#pragma unroll
    for (int u = 0; u < C51_SEL; ++u) m[u] = warp_max(m[u]);
#pragma unroll
    for (int u = 0; u < C51_SEL; ++u) s[u] = 0.f;
    for (int k = lane; k < K; k += C51_WARP)
#pragma unroll
      for (int u = 0; u < C51_SEL; ++u)
        if (u < n) s[u] += expf(x[u * K + k] - m[u]);
#pragma unroll
    for (int u = 0; u < C51_SEL; ++u) s[u] = warp_sum(s[u]);
#pragma unroll
    for (int u = 0; u < C51_SEL; ++u) acc[u] = 0.f;
    for (int k = lane; k < K; k += C51_WARP)
#pragma unroll
      for (int u = 0; u < C51_SEL; ++u)
        if (u < n) acc[u] += (expf(x[u * K + k] - m[u]) / s[u]) * support[k];
#pragma unroll
    for (int u = 0; u < C51_SEL; ++u) acc[u] = warp_sum(acc[u]);
#pragma unroll
    for (int u = 0; u < C51_SEL; ++u)
      if (u < n && (a0 + u == 0 || acc[u] > best_q)) { best_q = acc[u]; best = a0 + u; }
  }
  return best;
}

// p[k] = softmax(y)_k for the lane's atoms k of one row y [K]; pz = the lane's part of sum_k p_k z_k.
__device__ __forceinline__ void probs_row(const float* y, const float* support, float* p, int K, int lane, float& pz) {
  float m, s;
  row_softmax_stats(y, K, lane, m, s);
  pz = 0.f;
  for (int k = lane; k < K; k += C51_WARP) {
    const float pk = expf(y[k] - m) / s;
    p[k] = pk;
    pz += pk * support[k];
  }
}

// Double-DQN selection and next distribution of one sample, by one warp (see
// cudarl_c51_next_probs): returns a* (the same in every lane), writes p[k] = softmax(target[a*])_k
// for the lane's atoms k and sets pz to the lane's part of sum_k p_k z_k.
__device__ __forceinline__ int next_probs_row(const float* online, const float* target, const float* support,
                                              float* p, int A, int K, int lane, float& pz) {
  const int best = select_action(online, support, A, K, lane);
  probs_row(target + (long long)best * K, support, p, K, lane, pz);
  return best;
}

// One source atom j of a projection: the atom l_j below r + d z_j and the shares of p_j that go
// to l_j and l_j + 1 (see cudarl_c51_project). j >= K gives l = -2, which matches no atom.
struct Share {
  int l;
  float lo, hi;
};

// The share of source atom j with probability pj and support point zj (j < K).
__device__ __forceinline__ Share share_at(float pj, float r, float d, float zj, int K, float v_min, float v_max,
                                          float dz) {
  const float tz = fminf(fmaxf(r + d * zj, v_min), v_max);
  const float num = tz - v_min;  // +0 where tz is clipped to v_min (often, at j = 0): 0 / dz is +0,
  const float g = fminf(fmaxf(num == 0.f ? 0.f : num / dz, 0.f), (float)(K - 1));  // without the slow path
  const float lo = floorf(g);
  const float f = g - lo;
  return Share{(int)lo, pj * (1.f - f), pj * f};
}

__device__ __forceinline__ Share share_of(const float* p, float r, float d, const float* support, int j, int K,
                                          float v_min, float v_max, float dz) {
  return j < K ? share_at(p[j], r, d, support[j], K, v_min, v_max, dz) : Share{-2, 0.f, 0.f};
}

// Projection of r + d z with next probabilities p onto the support, one sample by one warp (see
// cudarl_c51_project): the lane writes out[i] for i = lane, lane + 32, ... Each source atom's
// share is computed once, by lane j % 32, and broadcast with shuffles, so every lane adds the
// shares that land on its atom in j order (the twin's np.add.at order) at a few instructions per
// j; the former form recomputed the division for every (i, j) pair and took 30 us of the
// reference step (ncu, docs/perf-notes.md). All lanes reach every shuffle (whole warps only).
__device__ __forceinline__ void project_row(const float* p, float r, float d, const float* support, float* out, int K,
                                            int lane) {
  const float v_min = support[0], v_max = support[K - 1];
  const float dz = (v_max - v_min) / (float)(K - 1);
  if (!isfinite(r) || !isfinite(d)) {
    for (int i = lane; i < K; i += C51_WARP) out[i] = __int_as_float(0x7fc00000);
    return;
  }
  for (int i0 = 0; i0 < K; i0 += C51_WARP) {
    const int i = i0 + lane;
    float acc = 0.f;
    for (int j0 = 0; j0 < K; j0 += C51_WARP) {
      const Share sh = share_of(p, r, d, support, j0 + lane, K, v_min, v_max, dz);
      const int n = K - j0 < C51_WARP ? K - j0 : C51_WARP;
      for (int t = 0; t < n; ++t) {
        const int l = __shfl_sync(0xffffffffu, sh.l, t);
        const float lo = __shfl_sync(0xffffffffu, sh.lo, t);
        const float hi = __shfl_sync(0xffffffffu, sh.hi, t);
        if (l == i) acc += lo;
        else if (l + 1 == i) acc += hi;
      }
    }
    if (i < K) out[i] = acc;
  }
}

// A share in a float4 of a warp's stage (l as its bits, lo, hi).
__device__ __forceinline__ void stage_share(float4* stage, int j, const Share& sh) {
  stage[j] = make_float4(__int_as_float(sh.l), sh.lo, sh.hi, 0.f);
}

// Adds share s4 to the sums of target atoms ia and ib (if it lands there).
__device__ __forceinline__ void add_share(const float4& s4, int ia, int ib, float& acc_a, float& acc_b) {
  const int l = __float_as_int(s4.x);
  if (l == ia) acc_a += s4.y;
  else if (l + 1 == ia) acc_a += s4.z;
  if (l == ib) acc_b += s4.y;
  else if (l + 1 == ib) acc_b += s4.z;
}

// The staged projection's sums for target atoms ia and ib: the shares of j = 0..K-1, in order.
// Four shares are read before any is added: the loads overlap instead of each waiting on the one
// before (ncu at af237d7: one shared-load latency per j when the compiler reused one register).
__device__ __forceinline__ void staged_sums(const float4* stage, int K, int ia, int ib, float& acc_a, float& acc_b) {
  acc_a = 0.f;
  acc_b = 0.f;
  int j = 0;
  for (; j + 4 <= K; j += 4) {
    const float4 s0 = stage[j], s1 = stage[j + 1], s2 = stage[j + 2], s3 = stage[j + 3];
    add_share(s0, ia, ib, acc_a, acc_b);
    add_share(s1, ia, ib, acc_a, acc_b);
    add_share(s2, ia, ib, acc_a, acc_b);
    add_share(s3, ia, ib, acc_a, acc_b);
  }
  for (; j < K; ++j) add_share(stage[j], ia, ib, acc_a, acc_b);
}

// project_row with the shares staged in shared memory instead of shuffled: lane j % 32 computes
// source atom j's share once into stage[j] = (l_j, lo_j, hi_j) (float4s: the warp's own K-entry
// scratch, 16-byte aligned), then every lane walks j = 0..K-1 with broadcast reads, adding the
// shares that land on its atoms i = lane + 64 c and i + 32 into two sums. The same shares, added in
// the same j order, as project_row: the same bits, at one shared load per j and lane instead of
// three shuffles per j for each 32 atoms (the shuffles were the SM's bottleneck, ncu at c58292e).
__device__ __forceinline__ void project_row_staged(const float* p, float r, float d, const float* support, float* out,
                                                   int K, int lane, float4* stage) {
  const float v_min = support[0], v_max = support[K - 1];
  const float dz = (v_max - v_min) / (float)(K - 1);
  if (!isfinite(r) || !isfinite(d)) {
    for (int i = lane; i < K; i += C51_WARP) out[i] = __int_as_float(0x7fc00000);
    return;
  }
  for (int j = lane; j < K; j += C51_WARP) stage_share(stage, j, share_of(p, r, d, support, j, K, v_min, v_max, dz));
  __syncwarp();
  for (int i0 = 0; i0 < K; i0 += 2 * C51_WARP) {
    const int ia = i0 + lane, ib = ia + C51_WARP;
    float acc_a, acc_b;
    staged_sums(stage, K, ia, ib, acc_a, acc_b);
    if (ia < K) out[ia] = acc_a;
    if (ib < K) out[ib] = acc_b;
  }
  __syncwarp();  // every lane is done with stage before the caller reuses it
}

// Cross-entropy, its gradient and the priority of one sample by one warp, given the chosen
// action's logits x [K] (act in [0, A)): m = target[b] [K], g = grad[b] [A, K] (every element
// written); lane 0 writes *loss_b, *prio_b.
__device__ __forceinline__ void loss_row_x(const float* x, int act, const float* m, float w, float* g, float* loss_b,
                                           float* prio_b, int B, int A, int K, int kind, int lane) {
  float mx, s;
  row_softmax_stats(x, K, lane, mx, s);
  const float log_s = logf(s);
  float ce = 0.f, msum = 0.f, mlogm = 0.f;
  for (int k = lane; k < K; k += C51_WARP) {
    const float mk = m[k];
    ce -= mk * (x[k] - mx - log_s);
    msum += mk;
    if (mk > 0.f) mlogm += mk * logf(mk);
  }
  ce = warp_sum(ce);
  msum = warp_sum(msum);
  mlogm = warp_sum(mlogm);
  const float scale = w / (float)B;
  for (int a = 0; a < A; ++a) {
    float* ga = g + (long long)a * K;
    if (a == act) {
      for (int k = lane; k < K; k += C51_WARP) ga[k] = scale * (expf(x[k] - mx - log_s) * msum - m[k]);
    } else {
      for (int k = lane; k < K; k += C51_WARP) ga[k] = 0.f;
    }
  }
  if (lane == 0) {
    *loss_b = ce;
    *prio_b = kind == 0 ? ce : fmaxf(ce + mlogm, 0.f);
  }
}

// An action outside [0, A): a zero gradient and NaN loss and priority (the launcher cannot read
// device memory; the guard sees the NaN).
__device__ __forceinline__ void loss_row_bad_action(float* g, float* loss_b, float* prio_b, int A, int K, int lane) {
  for (int k = lane; k < A * K; k += C51_WARP) g[k] = 0.f;
  if (lane == 0) { *loss_b = C51_NAN; *prio_b = C51_NAN; }
}

// loss_row_x for one sample's logits x_all [A, K] (see cudarl_c51_loss).
__device__ __forceinline__ void loss_row(const float* x_all, int act, const float* m, float w, float* g, float* loss_b,
                                         float* prio_b, int B, int A, int K, int kind, int lane) {
  if (act < 0 || act >= A) {
    loss_row_bad_action(g, loss_b, prio_b, A, K, lane);
    return;
  }
  loss_row_x(x_all + (long long)act * K, act, m, w, g, loss_b, prio_b, B, A, K, kind, lane);
}

}  // namespace

namespace pa = cudarl::popart;

// ---------------------------------------------------------------------------------------------
// cudarl_c51_next_probs: double-DQN next-state distribution.
//   a*_b = argmax_a sum_k softmax(online[b,a])_k z_k (first max on ties); probs_b = softmax(target[b,a*]).
// Threads: one warp per sample b; grid covers ceil(B / warps_per_block).
// Reads 2*A*K + K floats per sample (online, target row a* once more, support); writes K floats + 1 int.
extern "C" __global__ void cudarl_c51_next_probs(const float* __restrict__ online, const float* __restrict__ target,
                                                 const float* __restrict__ support, float* __restrict__ probs,
                                                 int* __restrict__ a_star, int B, int A, int K) {
  const int lane = threadIdx.x % C51_WARP;
  const int b = blockIdx.x * (blockDim.x / C51_WARP) + threadIdx.x / C51_WARP;
  if (b >= B) return;  // whole warps leave together
  float pz;
  const int best = next_probs_row(online + (long long)b * A * K, target + (long long)b * A * K, support,
                                  probs + (long long)b * K, A, K, lane, pz);
  if (lane == 0) a_star[b] = best;
}

// ---------------------------------------------------------------------------------------------
// cudarl_c51_project: categorical projection of r + d z onto the support (gather form).
//   g_j = clip((clip(r + d z_j, v_min, v_max) - v_min) / dz, 0, K-1), l_j = floor(g_j), f_j = g_j - l_j
//   m_i = sum_j p_j [(1 - f_j) 1{l_j = i} + f_j 1{l_j + 1 = i}]
// An atom exactly on the grid has f_j = 0 and puts all its mass on l_j (no mass lost).
// A non-finite r or d gives a NaN row (clipping would turn NaN into v_min and hide it from the
// guard; the seed system's silent failures are what this prevents).
// Threads: one warp per sample; lane owns output atoms i = lane, lane+32, ... and sums the shares
// of j = 0..K-1 in order (no scatter, no atomics); each share is computed once and broadcast by
// shuffle. Reads K probs + 2 floats + K support per sample; writes K floats. O(K^2 / 32) shuffles
// and compares per lane, O(K / 32) divisions.
extern "C" __global__ void cudarl_c51_project(const float* __restrict__ probs, const float* __restrict__ r_t,
                                              const float* __restrict__ discount_t, const float* __restrict__ support,
                                              float* __restrict__ out, int B, int K) {
  const int lane = threadIdx.x % C51_WARP;
  const int b = blockIdx.x * (blockDim.x / C51_WARP) + threadIdx.x / C51_WARP;
  if (b >= B) return;
  project_row(probs + (long long)b * K, r_t[b], discount_t[b], support, out + (long long)b * K, K, lane);
}

// ---------------------------------------------------------------------------------------------
// cudarl_c51_targets: the target distribution without PopArt in one launch: a*_b and probs_b as
// cudarl_c51_next_probs, then m_b = the projection of r_b + d_b z with probs_b as
// cudarl_c51_project (the same rows: the launch pair's arithmetic).
// Threads: one warp per sample; its lanes write probs_b, __syncwarp() orders those global
// writes before the warp reads them back (every lane reads all K for its atoms).
// Reads 2*A*K + K + 2 floats per sample (+ probs_b again from L1); writes 2K floats + 1 int.
extern "C" __global__ void cudarl_c51_targets(const float* __restrict__ online, const float* __restrict__ target,
                                              const float* __restrict__ support, const float* __restrict__ r_t,
                                              const float* __restrict__ discount_t, float* __restrict__ probs,
                                              int* __restrict__ a_star, float* __restrict__ out, int B, int A, int K) {
  const int lane = threadIdx.x % C51_WARP;
  const int b = blockIdx.x * (blockDim.x / C51_WARP) + threadIdx.x / C51_WARP;
  if (b >= B) return;
  float* p = probs + (long long)b * K;
  float pz;
  const int best = next_probs_row(online + (long long)b * A * K, target + (long long)b * A * K, support, p, A, K, lane, pz);
  if (lane == 0) a_star[b] = best;
  __syncwarp();
  project_row(p, r_t[b], discount_t[b], support, out + (long long)b * K, K, lane);
}

// ---------------------------------------------------------------------------------------------
// cudarl_c51_next_probs_td: with PopArt, the first of the targets phase's two launches.
//   a*_b, probs_b as cudarl_c51_next_probs;  v_b = sum_k probs_bk z_k (the normalised next value)
//   y_b = r_b + d_b (s v_b + mu)   (return-space TD target, with the statistics BEFORE this step)
//   state_prev = state             (block 0 copies the 8 floats; see cudarl_c51_project_popart)
// Threads: one warp per sample (v_b is a warp_sum). state is only read here.
// Reads 2*A*K + K + 2 floats per sample and 8; writes K + 1 floats + 1 int per sample and 8.
extern "C" __global__ void cudarl_c51_next_probs_td(const float* __restrict__ online, const float* __restrict__ target,
                                                    const float* __restrict__ support, const float* __restrict__ r_t,
                                                    const float* __restrict__ discount_t, const float* __restrict__ state,
                                                    float* __restrict__ probs, int* __restrict__ a_star,
                                                    float* __restrict__ y, float* __restrict__ state_prev, int B, int A,
                                                    int K) {
  if (blockIdx.x == 0 && threadIdx.x < pa::STATE_SIZE) state_prev[threadIdx.x] = state[threadIdx.x];
  const int lane = threadIdx.x % C51_WARP;
  const int b = blockIdx.x * (blockDim.x / C51_WARP) + threadIdx.x / C51_WARP;
  if (b >= B) return;
  float pz;
  const int best = next_probs_row(online + (long long)b * A * K, target + (long long)b * A * K, support,
                                  probs + (long long)b * K, A, K, lane, pz);
  const float v = warp_sum(pz);
  if (lane == 0) {
    a_star[b] = best;
    y[b] = pa::td_target(r_t[b], discount_t[b], v, state[pa::MU], state[pa::SIGMA] / state[pa::SCALE]);
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_c51_project_popart: with PopArt, the second launch. The statistics move with this
// step's y, then the projection runs on rewards normalised with the UPDATED statistics:
//   state = update(state_prev, y)    (cudarl_popart_update's math and summation order)
//   r~_b = (r_b - (1 - d_b) mu') / s'  (written to r_norm),  m_b = projection of r~_b + d_b z
// Threads: blocks of pa::kReduceThreads (8 warps, one sample per warp; launch exactly that many).
// Every block reduces all of y in the same fixed order, so every block holds the same bits of
// the new statistics without a launch between (B floats per block, from L2); block 0's thread 0
// writes them to state. Nothing in this launch reads state (the old statistics come from
// state_prev, copied by the launch before), so that write races with no read. No atomics.
// Reads B + 9 floats per block, K + 2 per sample; writes K + 1 floats per sample and 7.
extern "C" __global__ void cudarl_c51_project_popart(const float* __restrict__ probs, const float* __restrict__ r_t,
                                                     const float* __restrict__ discount_t,
                                                     const float* __restrict__ support, const float* __restrict__ y,
                                                     const float* __restrict__ state_prev,
                                                     const float* __restrict__ beta, float* __restrict__ state,
                                                     float* __restrict__ r_norm, float* __restrict__ out, int B, int K,
                                                     float sigma_min) {
  __shared__ float s1[pa::kReduceThreads];
  __shared__ float s2[pa::kReduceThreads];
  const pa::Stats old = pa::load(state_prev);
  float sum, sum2;
  pa::batch_moments(y, B, s1, s2, sum, sum2);  // every thread of every block, before any returns
  const pa::Stats st = pa::updated(old, beta[0], sum, sum2, B, sigma_min);
  if (blockIdx.x == 0 && threadIdx.x == 0) pa::store(state, old, st);
  const int lane = threadIdx.x % C51_WARP;
  const int b = blockIdx.x * (blockDim.x / C51_WARP) + threadIdx.x / C51_WARP;
  if (b >= B) return;
  const float d = discount_t[b];
  const float rn = pa::normalized_reward(r_t[b], d, st.mu, st.sigma / st.scale);
  if (lane == 0) r_norm[b] = rn;
  project_row(probs + (long long)b * K, rn, d, support, out + (long long)b * K, K, lane);
}

// ---------------------------------------------------------------------------------------------
// cudarl_c51_loss: per-sample cross-entropy, its gradient wrt logits, the priority signal, and
// the importance-weighted batch mean, in one launch.
//   L_b = -sum_k m_k log p_k, p = softmax(logits[b, a_b])
//   grad[b,a,k] = (w_b / B)(p_k sum_j m_j - m_k) for a = a_b, else 0 (every element written)
//   priority_b = L_b (kind 0, "ce") or max(0, L_b + sum_k m_k log m_k) (kind 1, "kl")
//   loss[0] = scale * sum_b w_b L_b   (scale = 1 / B from the launcher)
// An action outside [0, A) writes NaN loss and priority (the launcher cannot read device
// memory; the guard sees the NaN). Threads: one warp per sample. The block that finishes last
// (cudarl::last_block on the integer ticket *done, 0 at launch and left 0) sums loss_per in
// the fixed order of cudarl::block_weighted_sum<C51_MEAN_SLOTS> (the order of the former
// one-block mean kernel of 256 threads), whichever block that is.
// Reads K logits + K targets + 2 scalars per sample (+ 2B by the last block); writes A*K + 2
// floats per sample and 1 (loss may be a mapped pinned view).
#define C51_MEAN_SLOTS 256
extern "C" __global__ void cudarl_c51_loss(const float* __restrict__ logits, const int* __restrict__ actions,
                                           const float* __restrict__ target, const float* __restrict__ weights,
                                           float* __restrict__ loss_per, float* __restrict__ priority,
                                           float* __restrict__ grad, float* __restrict__ loss, unsigned int* __restrict__ done,
                                           int B, int A, int K, int kind, float scale) {
  __shared__ float part[C51_MEAN_SLOTS];
  const int lane = threadIdx.x % C51_WARP;
  const int b = blockIdx.x * (blockDim.x / C51_WARP) + threadIdx.x / C51_WARP;
  if (b < B)  // no return: every thread reaches last_block()
    loss_row(logits + (long long)b * A * K, actions[b], target + (long long)b * K, weights[b], grad + (long long)b * A * K,
             loss_per + b, priority + b, B, A, K, kind, lane);
  if (cudarl::last_block(done)) {
    const float sum = cudarl::block_weighted_sum<C51_MEAN_SLOTS>(loss_per, weights, B, part);
    if (threadIdx.x == 0) loss[0] = scale * sum;
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_c51_targets_loss (no PopArt) and cudarl_c51_targets_loss_popart: the train step's targets
// and loss in ONE launch, from the dueling head's raw output va [B, (1 + A) K] (V, then Adv [A, K])
// of the online net at s_t (va_tm1) and s_{t+1} (va_online_tp1) and the target net at s_{t+1}:
//   logits = dueling combine of va (cudarl/dueling.cuh: cudarl_nn_dueling_forward's rounding)
//   a*, probs, [y, PopArt update, r_norm], target m   as cudarl_c51_targets / next_probs_td +
//                                                       project_popart
//   loss_per, priority, loss[0]                        as cudarl_c51_loss
//   dva [B, (1 + A) K] = dL/dva                        as cudarl_nn_dueling_backward of the loss's
//                                                       dL/dlogits (which is not stored)
// Every output has the bits of that chain of five launches (dueling_forward x2, the targets
// pair, loss, dueling_backward), with no logits or dlogits buffers in memory: the combined rows
// live in registers (the register path, K <= 64 and A <= 8) or in shared memory per warp (the
// generic path). Four to five graph nodes fewer on the step's critical path.
//
// Threads: blocks of 4 warps (128 threads: twice the SMs of 8-warp blocks at B = 512), one warp per
// sample, samples b = warp, warp + 4 * gridDim.x, ... (any grid covers any B). With PopArt every y
// must exist before any sample is projected: the y pass, then cudarl::grid_barrier(barrier), then
// every block reduces y in project_popart's order (pa::batch_moments_half: so every block holds the
// same new statistics; block 0 stores them), then the projection and loss pass. The grid is at most
// one block per SM (the launcher), so every block is resident; the launch leaves *barrier and *done
// at 0 (last_block resets them). phase 1 then phase 2 is the same work in two launches with no
// barrier (phase 1: pass 1, and the statistics copied to state_prev; phase 2: the rest, the old
// statistics from state_prev), the same bits, for a GPU shared with other processes (MPS), where
// a launch's blocks cannot count on being resident together (run.grid_barrier = false); phase 0
// is the one launch. The projection stages its shares in shared memory
// (project_row_staged: the same bits as project_row).
// Shared memory: 4 warps x (max(A, 4) + 1) K floats, rounded up to float4s (dynamic; past 48 KiB
// the launcher opts in) + 256 + 2 * 128 floats.
// Reads 3 (1 + A) K + K + 4 floats per sample (+ 2B by the last block, + B per block with
// PopArt); writes (1 + A) K + 2 K + 4 floats per sample and 1 (+ 8 with PopArt).
#define C51_TL_WARPS 4
static_assert(C51_TL_WARPS * C51_WARP * 2 == pa::kReduceThreads, "batch_moments_half needs half a reduce block");

namespace {

// The combined logits of action a at the lane's atoms of one va row, into x [K].
__device__ __forceinline__ void dueling_row(const float* va, int a, float* x, int A, int K, int lane) {
  for (int k = lane; k < K; k += C51_WARP) x[k] = cudarl::dueling_logit(va, cudarl::dueling_mean(va, A, K, k), a, K, k);
}

// With PopArt, between the passes: wait for every block's y (phase 0), then every block reduces y in
// project_popart's order (pa::batch_moments_half: every block the same new statistics); block 0
// stores them. Returns the new statistics.
__device__ __forceinline__ pa::Stats tl_popart_stats(const float* y, int B, const pa::Stats& old, const float* beta,
                                                     float sigma_min, int phase, unsigned int* barrier, float* s1,
                                                     float* s2, float* state_out) {
  if (phase == 0) cudarl::grid_barrier(barrier);
  float sum, sum2;
  pa::batch_moments_half(y, B, s1, s2, sum, sum2);
  const pa::Stats st = pa::updated(old, beta[0], sum, sum2, B, sigma_min);
  if (blockIdx.x == 0 && threadIdx.x == 0) pa::store(state_out, old, st);
  return st;
}

// The end of the launch: the last block sums the batch mean (cudarl_c51_loss's order) and sets the
// barrier back to 0 (every block is past it by then).
__device__ __forceinline__ void tl_finish(bool popart, int phase, const float* loss_per, const float* weights, int B,
                                          float scale, float* part, float* loss, unsigned int* done,
                                          unsigned int* barrier) {
  if (cudarl::last_block(done)) {
    if (popart && phase == 0 && threadIdx.x == 0) *barrier = 0u;
    const float sum = cudarl::block_weighted_sum<C51_MEAN_SLOTS>(loss_per, weights, B, part);
    if (threadIdx.x == 0) loss[0] = scale * sum;
  }
}

// ---- the register path (K <= 64, A <= MAXA) ------------------------------------------------------
// Lane l owns atoms l and l + 32 (the generic path's k = lane, lane + 32 loops, in that order); a
// sample's three va rows, its probabilities and its target live in registers, loaded by one round of
// independent loads, and the loss's softmax of the chosen action (which needs no target) is done
// before the PopArt barrier, not after. The generic path reads va again for every action and atom
// and waits on each load (ncu at cc5acbb: 21 us, its warps stalled on global loads and short
// dependent chains, one warp a scheduler). Every rounding is the generic path's in the same order:
// the same bits (tests/parity/test_c51.py runs both paths against the launch chain).
#define C51_TLR_MAXK 64

struct TlArgs {  // targets_loss_body's arguments, as one value for the register path
  const float* va_tm1;
  const float* va_online_tp1;
  const float* va_target_tp1;
  const int* actions;
  const float* weights;
  const float* support;
  const float* r_t;
  const float* discount_t;
  const float* beta;
  float* state_out;
  float* y;
  float* r_norm;
  float* probs;
  int* a_star;
  float* target;
  float* loss_per;
  float* priority;
  float* dva;
  float* loss;
  unsigned int* done;
  unsigned int* barrier;
  int B, A, K, kind;
  float scale, sigma_min;
  int phase;
};

template <int MAXA>
struct TlRow {  // one va row [(1 + A) K] at the lane's atoms j = 0, 1 (k = lane + 32 j)
  float v[2];
  float adv[2][MAXA];
};

// An atom past K holds 1s: every value computed from it stays normal, so no IEEE division on it
// takes the slow path (a zero or denormal operand does; ncu at af237d7: ~200 instructions a warp in
// that path, most on atoms that do not exist). Nothing from such an atom is added or stored.
template <int MAXA>
__device__ __forceinline__ void tlr_load(const float* __restrict__ va, int A, int K, int lane, TlRow<MAXA>& r) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int k = lane + C51_WARP * j;
    const bool ok = k < K;
    r.v[j] = ok ? va[k] : 1.f;
#pragma unroll
    for (int a = 0; a < MAXA; ++a) r.adv[j][a] = ok && a < A ? va[(1 + a) * K + k] : 1.f;
  }
}

// x[a] = the register array's element a (a runtime index, uniform across the warp).
template <int MAXA>
__device__ __forceinline__ float tlr_pick(const float (&x)[MAXA], int a) {
  float v = x[0];
#pragma unroll
  for (int u = 1; u < MAXA; ++u)
    if (u == a) v = x[u];
  return v;
}

// The dueling logit of action a at the lane's atom j (dueling.cuh's roundings).
template <int MAXA>
__device__ __forceinline__ float tlr_logit(const TlRow<MAXA>& r, int j, int a, int A) {
  return (r.v[j] + tlr_pick(r.adv[j], a)) - cudarl::dueling_mean_regs(r.adv[j], A);  // dueling_combine's order
}

// row_softmax_stats of the row whose lane atoms are x0, x1 (ok0, ok1: they exist); also returns the
// lane's exp(x - m), 1 where the atom does not exist (a normal dividend). Branch-free (ncu at
// a2653d2: this path's warps waited on instruction fetch after every short branch): exp is computed
// for every lane and the sums add only existing atoms, in the generic path's order.
__device__ __forceinline__ void tlr_softmax_stats(float x0, float x1, bool ok0, bool ok1, float& m, float& s,
                                                  float& e0, float& e1) {
  float mx = fmaxf(C51_NEG_INF, ok0 ? x0 : C51_NEG_INF);
  mx = fmaxf(mx, ok1 ? x1 : C51_NEG_INF);
  m = warp_max(mx);
  e0 = expf(x0 - m);
  e1 = expf(x1 - m);
  float acc = 0.f;
  if (ok0) acc += e0;
  if (ok1) acc += e1;
  s = warp_sum(acc);
  e0 = ok0 ? e0 : 1.f;
  e1 = ok1 ? e1 : 1.f;
}

// select_action on the online row at s' (every action's reductions interleaved; the actions past A
// are reduced too, on tlr_load's padding, and never chosen: no branch around a shuffle).
template <int MAXA>
__device__ __forceinline__ int tlr_select(const TlRow<MAXA>& on, float z0, float z1, bool ok0, bool ok1, int A) {
  float x[2][MAXA], m[MAXA], s[MAXA], acc[MAXA];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float mean = cudarl::dueling_mean_regs(on.adv[j], A);
#pragma unroll
    for (int a = 0; a < MAXA; ++a) x[j][a] = cudarl::dueling_combine(on.v[j], on.adv[j][a], mean);
  }
#pragma unroll
  for (int a = 0; a < MAXA; ++a) {
    m[a] = fmaxf(C51_NEG_INF, ok0 ? x[0][a] : C51_NEG_INF);
    m[a] = fmaxf(m[a], ok1 ? x[1][a] : C51_NEG_INF);
  }
#pragma unroll
  for (int a = 0; a < MAXA; ++a) m[a] = warp_max(m[a]);
#pragma unroll
  for (int a = 0; a < MAXA; ++a) {
    x[0][a] = expf(x[0][a] - m[a]);  // x now holds exp(x - m)
    x[1][a] = expf(x[1][a] - m[a]);
    s[a] = 0.f;
    if (ok0) s[a] += x[0][a];
    if (ok1) s[a] += x[1][a];
  }
#pragma unroll
  for (int a = 0; a < MAXA; ++a) s[a] = warp_sum(s[a]);
#pragma unroll
  for (int a = 0; a < MAXA; ++a) {
    const float q0 = (ok0 ? x[0][a] : 1.f) / s[a], q1 = (ok1 ? x[1][a] : 1.f) / s[a];
    acc[a] = 0.f;
    if (ok0) acc[a] += q0 * z0;
    if (ok1) acc[a] += q1 * z1;
  }
#pragma unroll
  for (int a = 0; a < MAXA; ++a) acc[a] = warp_sum(acc[a]);
  int best = 0;
  float best_q = acc[0];
#pragma unroll
  for (int a = 1; a < MAXA; ++a)
    if (a < A && acc[a] > best_q) {
      best_q = acc[a];
      best = a;
    }
  return best;
}

// The loss's part that needs no target: the chosen action's logits at s and their softmax.
struct TlLoss {
  int act;
  float w, x0, x1, mx, log_s;
};

template <int MAXA>
__device__ __forceinline__ TlLoss tlr_loss_prep(const float* va_tm1_b, int act, float w, int A, int K, int lane,
                                                bool ok0, bool ok1) {
  TlLoss L{act, w, 0.f, 0.f, 0.f, 0.f};
  TlRow<MAXA> r;
  tlr_load(va_tm1_b, A, K, lane, r);  // an action outside [0, A) picks row 0: computed, never used
  L.x0 = tlr_logit(r, 0, act, A);
  L.x1 = tlr_logit(r, 1, act, A);
  float s, e0, e1;
  tlr_softmax_stats(L.x0, L.x1, ok0, ok1, L.mx, s, e0, e1);
  L.log_s = logf(s);
  return L;
}

// loss_row_x (or loss_row_bad_action) and dueling_backward_atom with the target m0, m1 at the
// lane's atoms: writes dva_b [(1 + A) K], *loss_b, *prio_b.
template <int MAXA>
__device__ __forceinline__ void tlr_loss(const TlLoss& L, float m0, float m1, bool ok0, bool ok1, float* dva_b,
                                         float* loss_b, float* prio_b, int B, int A, int K, int kind, int lane) {
  const bool bad = L.act < 0 || L.act >= A;  // uniform across the warp
  const float lg0 = logf(m0 > 0.f ? m0 : 1.f), lg1 = logf(m1 > 0.f ? m1 : 1.f);
  float ce = 0.f, msum = 0.f, mlogm = 0.f;
  if (ok0) {
    ce -= m0 * (L.x0 - L.mx - L.log_s);
    msum += m0;
    if (m0 > 0.f) mlogm += m0 * lg0;
  }
  if (ok1) {
    ce -= m1 * (L.x1 - L.mx - L.log_s);
    msum += m1;
    if (m1 > 0.f) mlogm += m1 * lg1;
  }
  ce = warp_sum(ce);
  msum = warp_sum(msum);
  mlogm = warp_sum(mlogm);
  const float scale = L.w / (float)B;
  const float e0 = expf(L.x0 - L.mx - L.log_s), e1 = expf(L.x1 - L.mx - L.log_s);
  float g[2] = {0.f, 0.f};
  if (ok0 && !bad) g[0] = scale * (e0 * msum - m0);
  if (ok1 && !bad) g[1] = scale * (e1 * msum - m1);
  if (lane == 0) {
    *loss_b = bad ? C51_NAN : ce;
    *prio_b = bad ? C51_NAN : kind == 0 ? ce : fmaxf(ce + mlogm, 0.f);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int k = lane + C51_WARP * j;
    float d[MAXA], dadv[MAXA], dv;
#pragma unroll
    for (int a = 0; a < MAXA; ++a) d[a] = k >= K ? 1.f : a == L.act ? g[j] : 0.f;
    cudarl::dueling_backward_regs(d, A, dv, dadv);
    if (k < K) dva_b[k] = dv;
#pragma unroll
    for (int a = 0; a < MAXA; ++a)
      if (a < A && k < K) dva_b[(1 + a) * K + k] = dadv[a];
  }
}

template <bool kPopArt, int MAXA>
__device__ __forceinline__ void targets_loss_regs(const TlArgs& t, const pa::Stats& old, float4* stage, float* part,
                                                  float* s1, float* s2) {
  const int lane = threadIdx.x % C51_WARP, warp = threadIdx.x / C51_WARP;
  const int A = t.A, K = t.K, B = t.B, row = (1 + A) * K;
  const bool ok0 = lane < K, ok1 = lane + C51_WARP < K;
  const float z0 = t.support[ok0 ? lane : K - 1], z1 = t.support[ok1 ? lane + C51_WARP : K - 1];
  const float v_min = t.support[0], v_max = t.support[K - 1];
  const float dz = (v_max - v_min) / (float)(K - 1);
  const int first = blockIdx.x * C51_TL_WARPS + warp, stride = gridDim.x * C51_TL_WARPS;
  // the warp's first sample keeps its probabilities, r and d in registers from pass 1 to pass 2
  float p_first[2] = {0.f, 0.f}, r_first = 0.f, d_first = 0.f;

  // pass 1: a*, probs (and y)
  for (int b = first; b < B && t.phase != 2; b += stride) {
    TlRow<MAXA> on, tg;
    tlr_load(t.va_online_tp1 + (long long)b * row, A, K, lane, on);
    tlr_load(t.va_target_tp1 + (long long)b * row, A, K, lane, tg);
    const float r = t.r_t[b], d = t.discount_t[b];
    const int best = tlr_select(on, z0, z1, ok0, ok1, A);
    float m, s, e0, e1;
    tlr_softmax_stats(tlr_logit(tg, 0, best, A), tlr_logit(tg, 1, best, A), ok0, ok1, m, s, e0, e1);
    const float q0 = e0 / s, q1 = e1 / s;
    float* pb = t.probs + (long long)b * K;
    if (ok0) pb[lane] = q0;
    if (ok1) pb[lane + C51_WARP] = q1;
    if (kPopArt) {
      float pz = 0.f;
      if (ok0) pz += q0 * z0;
      if (ok1) pz += q1 * z1;
      const float v = warp_sum(pz);
      if (lane == 0) t.y[b] = pa::td_target(r, d, v, old.mu, old.sigma / old.scale);
    }
    if (lane == 0) t.a_star[b] = best;
    if (b == first) {
      p_first[0] = q0;
      p_first[1] = q1;
      r_first = r;
      d_first = d;
    }
  }
  if (t.phase == 1) return;  // the two-launch form's first launch: the second reads y
  // the first sample's loss softmax, while other blocks finish pass 1
  TlLoss L_first{};
  if (first < B)
    L_first = tlr_loss_prep<MAXA>(t.va_tm1 + (long long)first * row, t.actions[first], t.weights[first], A, K, lane,
                                  ok0, ok1);
  pa::Stats st{};
  if (kPopArt) st = tl_popart_stats(t.y, B, old, t.beta, t.sigma_min, t.phase, t.barrier, s1, s2, t.state_out);

  // pass 2: the projection, the loss and dL/dva
  for (int b = first; b < B; b += stride) {
    const bool cached = b == first && t.phase == 0;
    float q0 = p_first[0], q1 = p_first[1], rn = r_first, d = d_first;
    if (!cached) {
      const float* pb = t.probs + (long long)b * K;
      q0 = ok0 ? pb[lane] : 0.f;
      q1 = ok1 ? pb[lane + C51_WARP] : 0.f;
      rn = t.r_t[b];
      d = t.discount_t[b];
    }
    const TlLoss L = b == first ? L_first
                                : tlr_loss_prep<MAXA>(t.va_tm1 + (long long)b * row, t.actions[b], t.weights[b], A, K,
                                                      lane, ok0, ok1);
    if (kPopArt) {
      rn = pa::normalized_reward(rn, d, st.mu, st.sigma / st.scale);
      if (lane == 0) t.r_norm[b] = rn;
    }
    float m0, m1;
    if (!isfinite(rn) || !isfinite(d)) {
      m0 = m1 = __int_as_float(0x7fc00000);
    } else {
      const Share h0 = share_at(q0, rn, d, z0, K, v_min, v_max, dz), h1 = share_at(q1, rn, d, z1, K, v_min, v_max, dz);
      if (ok0) stage_share(stage, lane, h0);
      if (ok1) stage_share(stage, lane + C51_WARP, h1);
      __syncwarp();
      staged_sums(stage, K, lane, lane + C51_WARP, m0, m1);
      __syncwarp();  // every lane is done with stage before the next sample
    }
    float* mb = t.target + (long long)b * K;
    if (ok0) mb[lane] = m0;
    if (ok1) mb[lane + C51_WARP] = m1;
    tlr_loss<MAXA>(L, m0, m1, ok0, ok1, t.dva + (long long)b * row, t.loss_per + b, t.priority + b, B, A, K, t.kind,
                   lane);
  }
  tl_finish(kPopArt, t.phase, t.loss_per, t.weights, B, t.scale, part, t.loss, t.done, t.barrier);
}

template <bool kPopArt>
__device__ __forceinline__ void targets_loss_body(
    const float* __restrict__ va_tm1, const float* __restrict__ va_online_tp1, const float* __restrict__ va_target_tp1,
    const int* __restrict__ actions, const float* __restrict__ weights, const float* __restrict__ support,
    const float* __restrict__ r_t, const float* __restrict__ discount_t, const float* state, const float* beta,
    float* state_out, float* y, float* r_norm, float* __restrict__ probs, int* __restrict__ a_star,
    float* __restrict__ target, float* __restrict__ loss_per, float* __restrict__ priority, float* __restrict__ dva,
    float* __restrict__ loss, unsigned int* done, unsigned int* barrier, float* state_prev, int B, int A, int K,
    int kind, float scale, float sigma_min, int phase) {
  extern __shared__ float4 c51_tl_smem[];
  __shared__ float part[C51_MEAN_SLOTS];
  __shared__ float s1[pa::kReduceThreads / 2];
  __shared__ float s2[pa::kReduceThreads / 2];
  const int lane = threadIdx.x % C51_WARP, warp = threadIdx.x / C51_WARP;
  const int row = (1 + A) * K;
  // per warp, in float4s: [max(A, 4) K floats: the online logits at s', then the projection's
  // shares, then dL/dlogits] [K floats: the target row a*, then the online row a]
  const int big = (A > 4 ? A : 4) * K, per_warp4 = (big + K + 3) / 4;
  float4* stage = c51_tl_smem + (long long)warp * per_warp4;
  float* logits = reinterpret_cast<float*>(stage);
  float* x = logits + big;
  const int first = blockIdx.x * C51_TL_WARPS + warp, stride = gridDim.x * C51_TL_WARPS;
  pa::Stats old{};
  if (kPopArt) old = pa::load(phase == 2 ? state_prev : state);  // every block, before block 0 stores the new ones
  if (kPopArt && phase == 1 && blockIdx.x == 0 && threadIdx.x < pa::STATE_SIZE) state_prev[threadIdx.x] = state[threadIdx.x];
  if (K <= C51_TLR_MAXK && A <= 8) {  // the register path (uniform: A and K are launch arguments)
    const TlArgs t{va_tm1, va_online_tp1, va_target_tp1, actions, weights, support, r_t, discount_t, beta, state_out, y,
                   r_norm, probs, a_star, target, loss_per, priority, dva, loss, done, barrier, B, A, K, kind, scale,
                   sigma_min, phase};
    if (A <= 3) targets_loss_regs<kPopArt, 3>(t, old, stage, part, s1, s2);  // short, flat, long
    else if (A == 4) targets_loss_regs<kPopArt, 4>(t, old, stage, part, s1, s2);
    else targets_loss_regs<kPopArt, 8>(t, old, stage, part, s1, s2);
    return;
  }

  // the generic path. pass 1: a*, probs (and y)
  for (int b = first; b < B && phase != 2; b += stride) {
    const float* vo = va_online_tp1 + (long long)b * row;
    for (int a = 0; a < A; ++a) dueling_row(vo, a, logits + a * K, A, K, lane);
    __syncwarp();
    const int best = select_action(logits, support, A, K, lane);
    dueling_row(va_target_tp1 + (long long)b * row, best, x, A, K, lane);
    __syncwarp();
    float pz;
    probs_row(x, support, probs + (long long)b * K, K, lane, pz);
    if (kPopArt) {
      const float v = warp_sum(pz);
      if (lane == 0) y[b] = pa::td_target(r_t[b], discount_t[b], v, old.mu, old.sigma / old.scale);
    }
    if (lane == 0) a_star[b] = best;
    __syncwarp();  // every lane's probs and x reads are done before the next sample overwrites x
  }
  if (phase == 1) return;  // the two-launch form's first launch: the second reads y
  pa::Stats st{};
  if (kPopArt) st = tl_popart_stats(y, B, old, beta, sigma_min, phase, barrier, s1, s2, state_out);

  // pass 2: the projection, the loss and dL/dva
  for (int b = first; b < B; b += stride) {
    const float d = discount_t[b];
    float rn = r_t[b];
    if (kPopArt) {
      rn = pa::normalized_reward(rn, d, st.mu, st.sigma / st.scale);
      if (lane == 0) r_norm[b] = rn;
    }
    float* m = target + (long long)b * K;
    project_row_staged(probs + (long long)b * K, rn, d, support, m, K, lane, stage);
    const int act = actions[b];
    if (act < 0 || act >= A) {
      loss_row_bad_action(logits, loss_per + b, priority + b, A, K, lane);
    } else {
      dueling_row(va_tm1 + (long long)b * row, act, x, A, K, lane);
      __syncwarp();
      loss_row_x(x, act, m, weights[b], logits, loss_per + b, priority + b, B, A, K, kind, lane);
    }
    __syncwarp();
    for (int k = lane; k < K; k += C51_WARP) cudarl::dueling_backward_atom(logits, dva + (long long)b * row, A, K, k);
    __syncwarp();
  }
  tl_finish(kPopArt, phase, loss_per, weights, B, scale, part, loss, done, barrier);
}

}  // namespace

extern "C" __global__ void cudarl_c51_targets_loss(
    const float* __restrict__ va_tm1, const float* __restrict__ va_online_tp1, const float* __restrict__ va_target_tp1,
    const int* __restrict__ actions, const float* __restrict__ weights, const float* __restrict__ support,
    const float* __restrict__ r_t, const float* __restrict__ discount_t, float* __restrict__ probs,
    int* __restrict__ a_star, float* __restrict__ target, float* __restrict__ loss_per, float* __restrict__ priority,
    float* __restrict__ dva, float* __restrict__ loss, unsigned int* __restrict__ done, int B, int A, int K, int kind,
    float scale) {
  targets_loss_body<false>(va_tm1, va_online_tp1, va_target_tp1, actions, weights, support, r_t, discount_t, nullptr,
                           nullptr, nullptr, nullptr, nullptr, probs, a_star, target, loss_per, priority, dva, loss, done,
                           nullptr, nullptr, B, A, K, kind, scale, 0.f, 0);
}

extern "C" __global__ void cudarl_c51_targets_loss_popart(
    const float* __restrict__ va_tm1, const float* __restrict__ va_online_tp1, const float* __restrict__ va_target_tp1,
    const int* __restrict__ actions, const float* __restrict__ weights, const float* __restrict__ support,
    const float* __restrict__ r_t, const float* __restrict__ discount_t, float* state, const float* __restrict__ beta,
    float* __restrict__ y, float* __restrict__ r_norm, float* __restrict__ probs, int* __restrict__ a_star,
    float* __restrict__ target, float* __restrict__ loss_per, float* __restrict__ priority, float* __restrict__ dva,
    float* __restrict__ loss, unsigned int* __restrict__ done, unsigned int* __restrict__ barrier,
    float* __restrict__ state_prev, int B, int A, int K, int kind, float scale, float sigma_min, int phase) {
  targets_loss_body<true>(va_tm1, va_online_tp1, va_target_tp1, actions, weights, support, r_t, discount_t, state, beta,
                          state, y, r_norm, probs, a_star, target, loss_per, priority, dva, loss, done, barrier, state_prev,
                          B, A, K, kind, scale, sigma_min, phase);
}

// ---------------------------------------------------------------------------------------------
// cudarl_c51_n_step: n-step reward and bootstrap discount of each sample.
//   R_b = sum_{i<n} gamma^i r_{b,i} prod_{j<i} (1 - term_{b,j}),  d_b = gamma^n prod_{j<n} (1 - term_{b,j})
// gamma is read from device memory (a schedule, or the adaptive-gamma controller, moves it).
// Threads: one per sample, summing i = 0..n-1 in order. Reads 2n + 1 floats; writes 2.
extern "C" __global__ void cudarl_c51_n_step(const float* __restrict__ rewards, const float* __restrict__ terminal,
                                             const float* __restrict__ gamma, float* __restrict__ r_t,
                                             float* __restrict__ discount_t, int B, int n) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const float gm = gamma[0];
  float ret = 0.f, g = 1.f, alive = 1.f;
  for (int i = 0; i < n; ++i) {
    ret += g * alive * rewards[(long long)b * n + i];
    alive *= 1.f - terminal[(long long)b * n + i];
    g *= gm;
  }
  r_t[b] = ret;
  discount_t[b] = g * alive;
}
