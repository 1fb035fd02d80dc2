// C51 targets and loss (Bellemare et al. 2017) with double-DQN selection.
// Twin: cudarl/reference/c51.py. Launchers: cudarl/ops/c51.py.
//
// Layout: logits [B, A, K] row-major, support [K] uniform (z_k = v_min + k dz), actions int32 [B].
// Every per-sample op maps ONE WARP TO ONE SAMPLE: lanes stride over atoms, and sums/maxima
// use an xor butterfly (IEEE + and max are commutative, so every lane ends with the same bits,
// and the order is fixed: results are bitwise repeatable). No atomics anywhere.

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

}  // namespace

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
  int best = 0;
  float best_q = C51_NEG_INF;
  for (int a = 0; a < A; ++a) {
    const float* x = online + ((long long)b * A + a) * K;
    float m, s;
    row_softmax_stats(x, K, lane, m, s);
    float acc = 0.f;
    for (int k = lane; k < K; k += C51_WARP) acc += (expf(x[k] - m) / s) * support[k];
    const float q = warp_sum(acc);
    if (a == 0 || q > best_q) { best_q = q; best = a; }
  }
  const float* y = target + ((long long)b * A + best) * K;
  float m, s;
  row_softmax_stats(y, K, lane, m, s);
  for (int k = lane; k < K; k += C51_WARP) probs[(long long)b * K + k] = expf(y[k] - m) / s;
  if (lane == 0) a_star[b] = best;
}

// ---------------------------------------------------------------------------------------------
// cudarl_c51_project: categorical projection of r + d z onto the support (gather form).
//   g_j = clip((clip(r + d z_j, v_min, v_max) - v_min) / dz, 0, K-1), l_j = floor(g_j), f_j = g_j - l_j
//   m_i = sum_j p_j [(1 - f_j) 1{l_j = i} + f_j 1{l_j + 1 = i}]
// An atom exactly on the grid has f_j = 0 and puts all its mass on l_j (no mass lost).
// A non-finite r or d gives a NaN row (clipping would turn NaN into v_min and hide it from the
// guard; the seed system's silent failures are what this prevents).
// Threads: one warp per sample; lane owns output atoms i = lane, lane+32, ... and sums over
// j = 0..K-1 in order (no scatter, no atomics). Reads K probs + 2 floats + K support per sample
// (re-read per lane from cache); writes K floats. O(K^2 / 32) flops per lane.
extern "C" __global__ void cudarl_c51_project(const float* __restrict__ probs, const float* __restrict__ r_t,
                                              const float* __restrict__ discount_t, const float* __restrict__ support,
                                              float* __restrict__ out, int B, int K) {
  const int lane = threadIdx.x % C51_WARP;
  const int b = blockIdx.x * (blockDim.x / C51_WARP) + threadIdx.x / C51_WARP;
  if (b >= B) return;
  const float v_min = support[0], v_max = support[K - 1];
  const float dz = (v_max - v_min) / (float)(K - 1);
  const float r = r_t[b], d = discount_t[b];
  const float* p = probs + (long long)b * K;
  if (!isfinite(r) || !isfinite(d)) {
    for (int i = lane; i < K; i += C51_WARP) out[(long long)b * K + i] = __int_as_float(0x7fc00000);
    return;
  }
  for (int i = lane; i < K; i += C51_WARP) {
    float acc = 0.f;
    for (int j = 0; j < K; ++j) {
      const float tz = fminf(fmaxf(r + d * support[j], v_min), v_max);
      const float g = fminf(fmaxf((tz - v_min) / dz, 0.f), (float)(K - 1));
      const float lo = floorf(g);
      const float f = g - lo;
      const int l = (int)lo;
      if (l == i) acc += p[j] * (1.f - f);
      else if (l + 1 == i) acc += p[j] * f;
    }
    out[(long long)b * K + i] = acc;
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_c51_loss: per-sample cross-entropy, its gradient wrt logits, and the priority signal.
//   L_b = -sum_k m_k log p_k, p = softmax(logits[b, a_b])
//   grad[b,a,k] = (w_b / B)(p_k sum_j m_j - m_k) for a = a_b, else 0 (every element written)
//   priority_b = L_b (kind 0, "ce") or max(0, L_b + sum_k m_k log m_k) (kind 1, "kl")
// An action outside [0, A) writes NaN loss and priority (the launcher cannot read device
// memory; the guard sees the NaN). Threads: one warp per sample.
// Reads K logits + K targets + 2 scalars per sample; writes A*K + 2 floats.
extern "C" __global__ void cudarl_c51_loss(const float* __restrict__ logits, const int* __restrict__ actions,
                                           const float* __restrict__ target, const float* __restrict__ weights,
                                           float* __restrict__ loss_per, float* __restrict__ priority,
                                           float* __restrict__ grad, int B, int A, int K, int kind) {
  const int lane = threadIdx.x % C51_WARP;
  const int b = blockIdx.x * (blockDim.x / C51_WARP) + threadIdx.x / C51_WARP;
  if (b >= B) return;
  const int act = actions[b];
  float* g = grad + (long long)b * A * K;
  if (act < 0 || act >= A) {
    for (int k = lane; k < A * K; k += C51_WARP) g[k] = 0.f;
    if (lane == 0) { loss_per[b] = C51_NAN; priority[b] = C51_NAN; }
    return;
  }
  const float* x = logits + ((long long)b * A + act) * K;
  const float* m = target + (long long)b * K;
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
  const float scale = weights[b] / (float)B;
  for (int a = 0; a < A; ++a) {
    float* ga = g + (long long)a * K;
    if (a == act) {
      for (int k = lane; k < K; k += C51_WARP) ga[k] = scale * (expf(x[k] - mx - log_s) * msum - m[k]);
    } else {
      for (int k = lane; k < K; k += C51_WARP) ga[k] = 0.f;
    }
  }
  if (lane == 0) {
    loss_per[b] = ce;
    priority[b] = kind == 0 ? ce : fmaxf(ce + mlogm, 0.f);
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_c51_weighted_mean: out[0] = scale * sum_i w_i v_i, by one block in a fixed order
// (thread t sums i = t, t + blockDim, ... in order; then a shared-memory tree). Launch with
// exactly one block of C51_REDUCE_THREADS threads. Reads 2n floats; writes 1 (out may be a
// mapped pinned view).
#define C51_REDUCE_THREADS 256
extern "C" __global__ void cudarl_c51_weighted_mean(const float* __restrict__ values, const float* __restrict__ w,
                                                    float* __restrict__ out, int n, float scale) {
  __shared__ float part[C51_REDUCE_THREADS];
  const int t = threadIdx.x;
  float acc = 0.f;
  for (int i = t; i < n; i += C51_REDUCE_THREADS) acc += w[i] * values[i];
  part[t] = acc;
  cudarl::block_tree_sum(part, C51_REDUCE_THREADS);
  if (t == 0) out[0] = scale * part[0];
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
