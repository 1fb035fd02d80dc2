// The per-sample rows of C51 shared by the fused targets-and-loss kernels (cuda_src/c51.cu) and the
// unfused chain that is their oracle (cuda_src/c51_chain.cu), so both round alike: one warp per
// sample, lanes striding over atoms, xor-butterfly sums and maxima (fixed order: the same bits in
// every lane and on every run). Twins: cudarl/reference/c51_chain.py.
#pragma once

#include <cudarl/reduce.cuh>

#define C51_WARP 32
// NVRTC has no <math.h>: infinities and NaN by bit pattern.
#define C51_NEG_INF __int_as_float((int)0xff800000u)
#define C51_NAN __int_as_float((int)0x7fffffffu)
// Slots of the loss's batch mean (cudarl::block_weighted_sum: the order of the former one-block mean
// kernel of 256 threads), in cudarl_c51_chain_loss and the fused kernels alike.
#define C51_MEAN_SLOTS 256

namespace cudarl {
namespace c51 {

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

// One source atom j of a projection: the atom l_j below r + d z_j and the shares of p_j that go
// to l_j and l_j + 1 (see cudarl_c51_chain_project). j >= K gives l = -2, which matches no atom.
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

}  // namespace c51
}  // namespace cudarl
