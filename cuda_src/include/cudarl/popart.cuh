// PopArt statistics as device functions (van Hasselt et al. 2016), shared by every kernel that
// moves or applies them: cuda_src/popart.cu and the fused C51 targets in cuda_src/c51.cu.
// Twin: cudarl/reference/popart.py (equations there).
//
// state: float32 [8] = {mu, sigma, mu_prev, sigma_prev, m1, m2, decay, scale}
//   m1, m2: EMAs of E[y], E[y^2] from zero; decay = prod (1 - beta_t); mu = m1 / (1 - decay),
//   sigma = sqrt(max(m2 / (1 - decay) - mu^2, sigma_min^2)) (bias-corrected like Adam);
//   scale: support units per standard deviation. The normalised coordinate is
//   y_hat = (y - mu) / s with s = sigma / scale.
//
//   load(state)                  the statistics as values (read them all before anyone writes)
//   batch_moments(y, B, s1, s2, sum, sum2)
//                                sum_i y_i and sum_i y_i^2 by one block of kReduceThreads threads:
//                                thread t sums i = t, t + 256, ... in order, then block_tree_sum;
//                                every thread gets both sums, and every block the same bits
//   batch_moments_half(...)      the same bits from a block of kReduceThreads / 2 threads
//   updated(old, beta, sum, sum2, B, sigma_min)
//                                the statistics after one batch of B targets with those sums
//   store(state, old, new)       write them (mu_prev, sigma_prev <- old mu, sigma; scale kept). The
//                                first update (old.decay == 1: the initial identity, no statistics
//                                yet) sets mu_prev, sigma_prev to the new ones: there is nothing to
//                                preserve, so the rescale leaves a fresh network's outputs as
//                                normalised values instead of blowing them up by sigma_0 / sigma_1
//   normalized_reward(r, d, mu, s), td_target(r, d, v, mu, s)
//                                (r - (1 - d) mu) / s  and  r + d (s v + mu)
#pragma once

#include <cudarl/reduce.cuh>

namespace cudarl {
namespace popart {

enum : int { MU = 0, SIGMA = 1, MU_PREV = 2, SIGMA_PREV = 3, M1 = 4, M2 = 5, DECAY = 6, SCALE = 7, STATE_SIZE = 8 };

// Threads of the block that reduces a batch (cudarl/ops/popart.py and ops/c51.py launch this many).
constexpr int kReduceThreads = 256;

struct Stats {
  float mu, sigma, m1, m2, decay, scale;
};

__device__ __forceinline__ Stats load(const float* state) {
  return Stats{state[MU], state[SIGMA], state[M1], state[M2], state[DECAY], state[SCALE]};
}

// Slot t's part of the batch moments: sum of y_i and y_i^2 over i = t, t + kReduceThreads, ... in
// order (kFromL2: read y with cudarl::load_l2, for y written by other blocks before a grid_barrier).
template <bool kFromL2>
__device__ __forceinline__ void slot_moments(const float* y, int B, int t, float& a1, float& a2) {
  a1 = 0.f;
  a2 = 0.f;
  for (int i = t; i < B; i += kReduceThreads) {
    const float v = kFromL2 ? load_l2(y + i) : y[i];
    a1 += v;
    a2 += v * v;
  }
}

// Requires blockDim.x == kReduceThreads; s1, s2: __shared__ float [kReduceThreads].
__device__ __forceinline__ void batch_moments(const float* y, int B, float* s1, float* s2, float& sum, float& sum2) {
  const int t = threadIdx.x;
  float a1, a2;
  slot_moments<false>(y, B, t, a1, a2);
  s1[t] = a1;
  s2[t] = a2;
  block_tree_sum2(s1, s2, kReduceThreads);  // the same tree for each: sums as in one fused loop
  sum = s1[0];
  sum2 = s2[0];
}

// batch_moments' bits from a block of kReduceThreads / 2 threads (s1, s2: that many floats): thread
// t holds slots t and t + kReduceThreads / 2 and adds them, which is the first level of the
// kReduceThreads tree; the tree goes on over the half. y read from L2 (see slot_moments).
__device__ __forceinline__ void batch_moments_half(const float* y, int B, float* s1, float* s2, float& sum, float& sum2) {
  constexpr int H = kReduceThreads / 2;
  const int t = threadIdx.x;
  float a1, a2, b1, b2;
  slot_moments<true>(y, B, t, a1, a2);
  slot_moments<true>(y, B, t + H, b1, b2);
  s1[t] = a1 + b1;
  s2[t] = a2 + b2;
  block_tree_sum2(s1, s2, H);
  sum = s1[0];
  sum2 = s2[0];
}

__device__ __forceinline__ Stats updated(const Stats& old, float beta, float sum, float sum2, int B, float sigma_min) {
  const float mean = sum / (float)B, mean2 = sum2 / (float)B;
  Stats s;
  s.m1 = (1.f - beta) * old.m1 + beta * mean;
  s.m2 = (1.f - beta) * old.m2 + beta * mean2;
  s.decay = old.decay * (1.f - beta);
  const float c = 1.f - s.decay;
  s.mu = s.m1 / c;
  s.sigma = sqrtf(fmaxf(s.m2 / c - s.mu * s.mu, sigma_min * sigma_min));
  s.scale = old.scale;
  return s;
}

__device__ __forceinline__ void store(float* state, const Stats& old, const Stats& s) {
  const bool first = old.decay == 1.f;
  state[MU_PREV] = first ? s.mu : old.mu;
  state[SIGMA_PREV] = first ? s.sigma : old.sigma;
  state[M1] = s.m1;
  state[M2] = s.m2;
  state[DECAY] = s.decay;
  state[MU] = s.mu;
  state[SIGMA] = s.sigma;
}

// A reward for a target in normalised coordinates: (r + d (s z + mu) - mu) / s = r~ + d z.
__device__ __forceinline__ float normalized_reward(float r, float d, float mu, float s) {
  return (r - (1.f - d) * mu) / s;
}

// The return-space TD target from a normalised next value v.
__device__ __forceinline__ float td_target(float r, float d, float v, float mu, float s) {
  return r + d * (s * v + mu);
}

}  // namespace popart
}  // namespace cudarl
