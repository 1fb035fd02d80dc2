// Epsilon-greedy acting and the linear epsilon schedule: one copy for every kernel that acts, so
// a fused kernel chooses exactly what the separate ones do. Users: env.cu (act, from a Q table),
// agent.cu (epsilon; act_c51 and act_iqn, fused from the head's outputs). Twins:
// cudarl/reference/env.py (act) and cudarl/reference/agent.py (epsilon).
#pragma once

#include <cudarl/philox.cuh>

namespace cudarl {

constexpr u32 kStreamAct = 0x656E7632u;  // "env2": act() of env i draws 2i and 2i+1

// Lane k (0..3) of a Philox block.
__device__ __forceinline__ u32 lane_of(uint4 v, u32 k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

// An integer in [0, n) from a 32-bit draw: (x * n) >> 32.
__device__ __forceinline__ int below(u32 x, int n) { return (int)(((u64)x * (u64)(u32)n) >> 32); }

// eps = start + (end - start) * min(c, steps) / steps in float64, each operation rounded as
// written (no FMA contraction: the twin's Python arithmetic), then rounded once to float32.
__device__ __forceinline__ float epsilon_at(long long c, double start, double end, long long steps) {
  const double f = __ddiv_rn((double)(c < steps ? c : steps), (double)steps);
  return (float)__dadd_rn(start, __dmul_rn(__dadd_rn(end, -start), f));
}

// Env i's epsilon-greedy action from its Q row q[0 .. A): with draws 2i and 2i+1 of the stream
// (seed, env_count, kStreamAct), it explores when uniform(draw 2i) < eps and then takes
// below(draw 2i+1, A); otherwise the first index of the largest Q (a strict > scan from 0).
__device__ __forceinline__ int epsilon_greedy(const float* q, int A, float eps, u64 seed, u64 env_count, long long i) {
  const uint4 blk = philox_block(seed, env_count, kStreamAct, (u32)(i >> 1));
  const u32 k = 2u * (u32)(i & 1);
  if (u32_to_uniform(lane_of(blk, k)) < eps) return below(lane_of(blk, k + 1), A);
  float best = q[0];
  int a = 0;
  for (int j = 1; j < A; ++j) {
    const float v = q[j];
    if (v > best) {
      best = v;
      a = j;
    }
  }
  return a;
}

}  // namespace cudarl
