// The unfused C51 chain: the targets (double-DQN next distribution, PopArt, projection) and the loss
// as separate launches. The train step runs the fused cudarl_c51_targets_loss[_popart] (cuda_src/c51.cu);
// this family is its ORACLE: the fused kernels must give these launches' bits
// (tests/parity/test_c51.py), and the public cudarl.losses.c51_targets / c51_loss run it.
// Twin: cudarl/reference/c51_chain.py. Launchers: cudarl/ops/c51_chain.py.
//
// Layout: logits [B, A, K] row-major, support [K] uniform (z_k = v_min + k dz), actions int32 [B].
// Every per-sample op maps ONE WARP TO ONE SAMPLE (cudarl/c51_rows.cuh). Batch reductions are one
// block's fixed-order tree; the only atomic is the integer ticket of cudarl::last_block (reduce.cuh).
//
// The targets are cudarl_c51_chain_targets (no PopArt: one launch), or cudarl_c51_chain_next_probs_td
// then cudarl_c51_chain_project_popart (PopArt: two launches); the loss is cudarl_c51_chain_loss (one
// launch, the batch mean included). next_probs and project are the same rows as standalone ops.

#include <cudarl/c51_rows.cuh>
#include <cudarl/popart.cuh>
#include <cudarl/reduce.cuh>

using namespace cudarl::c51;  // NOLINT: the rows this family is made of

namespace {

using cudarl::warp_sum;

// Double-DQN selection and next distribution of one sample, by one warp (see
// cudarl_c51_chain_next_probs): returns a* (the same in every lane), writes p[k] = softmax(target[a*])_k
// for the lane's atoms k and sets pz to the lane's part of sum_k p_k z_k.
__device__ __forceinline__ int next_probs_row(const float* online, const float* target, const float* support,
                                              float* p, int A, int K, int lane, float& pz) {
  const int best = select_action(online, support, A, K, lane);
  probs_row(target + (long long)best * K, support, p, K, lane, pz);
  return best;
}

// Projection of r + d z with next probabilities p onto the support, one sample by one warp (see
// cudarl_c51_chain_project): the lane writes out[i] for i = lane, lane + 32, ... Each source atom's
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

// loss_row_x for one sample's logits x_all [A, K] (see cudarl_c51_chain_loss).
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
// cudarl_c51_chain_next_probs: double-DQN next-state distribution.
//   a*_b = argmax_a sum_k softmax(online[b,a])_k z_k (first max on ties); probs_b = softmax(target[b,a*]).
// Threads: one warp per sample b; grid covers ceil(B / warps_per_block).
// Reads 2*A*K + K floats per sample (online, target row a* once more, support); writes K floats + 1 int.
extern "C" __global__ void cudarl_c51_chain_next_probs(const float* __restrict__ online, const float* __restrict__ target,
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
// cudarl_c51_chain_project: categorical projection of r + d z onto the support (gather form).
//   g_j = clip((clip(r + d z_j, v_min, v_max) - v_min) / dz, 0, K-1), l_j = floor(g_j), f_j = g_j - l_j
//   m_i = sum_j p_j [(1 - f_j) 1{l_j = i} + f_j 1{l_j + 1 = i}]
// An atom exactly on the grid has f_j = 0 and puts all its mass on l_j (no mass lost).
// A non-finite r or d gives a NaN row (clipping would turn NaN into v_min and hide it from the
// guard; the seed system's silent failures are what this prevents).
// Threads: one warp per sample; lane owns output atoms i = lane, lane+32, ... and sums the shares
// of j = 0..K-1 in order (no scatter, no atomics); each share is computed once and broadcast by
// shuffle. Reads K probs + 2 floats + K support per sample; writes K floats. O(K^2 / 32) shuffles
// and compares per lane, O(K / 32) divisions.
extern "C" __global__ void cudarl_c51_chain_project(const float* __restrict__ probs, const float* __restrict__ r_t,
                                              const float* __restrict__ discount_t, const float* __restrict__ support,
                                              float* __restrict__ out, int B, int K) {
  const int lane = threadIdx.x % C51_WARP;
  const int b = blockIdx.x * (blockDim.x / C51_WARP) + threadIdx.x / C51_WARP;
  if (b >= B) return;
  project_row(probs + (long long)b * K, r_t[b], discount_t[b], support, out + (long long)b * K, K, lane);
}

// ---------------------------------------------------------------------------------------------
// cudarl_c51_chain_targets: the target distribution without PopArt in one launch: a*_b and probs_b as
// cudarl_c51_chain_next_probs, then m_b = the projection of r_b + d_b z with probs_b as
// cudarl_c51_chain_project (the same rows: the launch pair's arithmetic).
// Threads: one warp per sample; its lanes write probs_b, __syncwarp() orders those global
// writes before the warp reads them back (every lane reads all K for its atoms).
// Reads 2*A*K + K + 2 floats per sample (+ probs_b again from L1); writes 2K floats + 1 int.
extern "C" __global__ void cudarl_c51_chain_targets(const float* __restrict__ online, const float* __restrict__ target,
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
// cudarl_c51_chain_next_probs_td: with PopArt, the first of the targets phase's two launches.
//   a*_b, probs_b as cudarl_c51_chain_next_probs;  v_b = sum_k probs_bk z_k (the normalised next value)
//   y_b = r_b + d_b (s v_b + mu)   (return-space TD target, with the statistics BEFORE this step)
//   state_prev = state             (block 0 copies the 8 floats; see cudarl_c51_chain_project_popart)
// Threads: one warp per sample (v_b is a warp_sum). state is only read here.
// Reads 2*A*K + K + 2 floats per sample and 8; writes K + 1 floats + 1 int per sample and 8.
extern "C" __global__ void cudarl_c51_chain_next_probs_td(const float* __restrict__ online, const float* __restrict__ target,
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
// cudarl_c51_chain_project_popart: with PopArt, the second launch. The statistics move with this
// step's y, then the projection runs on rewards normalised with the UPDATED statistics:
//   state = update(state_prev, y)    (cudarl_popart_update's math and summation order)
//   r~_b = (r_b - (1 - d_b) mu') / s'  (written to r_norm),  m_b = projection of r~_b + d_b z
// Threads: blocks of pa::kReduceThreads (8 warps, one sample per warp; launch exactly that many).
// Every block reduces all of y in the same fixed order, so every block holds the same bits of
// the new statistics without a launch between (B floats per block, from L2); block 0's thread 0
// writes them to state. Nothing in this launch reads state (the old statistics come from
// state_prev, copied by the launch before), so that write races with no read. No atomics.
// Reads B + 9 floats per block, K + 2 per sample; writes K + 1 floats per sample and 7.
extern "C" __global__ void cudarl_c51_chain_project_popart(const float* __restrict__ probs, const float* __restrict__ r_t,
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
// cudarl_c51_chain_loss: per-sample cross-entropy, its gradient wrt logits, the priority signal, and
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
extern "C" __global__ void cudarl_c51_chain_loss(const float* __restrict__ logits, const int* __restrict__ actions,
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
