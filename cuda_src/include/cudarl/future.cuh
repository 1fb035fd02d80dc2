// The bars after a decision, for auxiliary targets (horizons.cu, risk.cu; twin:
// cudarl/reference/horizons.py future_log_returns). A state row's bar t is the decision bar; the
// log return of bar t + j (j >= 0) is the one a position held from the decision earns: up[t + j] =
// log(1 + ret[t + j]), down[] the mirrored market's log(1 - ret). A horizon of k bars needs
// ret[t + k - 1], which reads the price at t + k + 1: it must lie inside the split, t + k + 1 < t_end.
#pragma once

#define CUDARL_STATE_DIM 4

namespace cudarl {
// The decision's log-return series (up or down by the row's mirror flag) from bar t on, and t; the
// caller reads k bars of it only when future_fits(t, k, t_end).
__device__ __forceinline__ const float* future_series(const float* __restrict__ row, const float* __restrict__ up,
                                                      const float* __restrict__ down, int& t) {
  t = (int)row[0];
  return (row[1] != 0.0f ? down : up) + t;
}
__device__ __forceinline__ bool future_fits(int t, int k, int t_end) { return t >= 0 && t + k + 1 < t_end; }
}  // namespace cudarl
