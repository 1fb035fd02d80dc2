// One float of an observation window: the layout of cudarl/reference/window.py, one copy for every
// kernel that gathers windows (window.cu's gather; env.cu's record_step, which gathers the next
// observation from the state row it has just computed). Pure copies and an exact sign flip.
#pragma once

namespace cudarl {

// Element (w, c) of the window of the state row (bar, mirror, position, hold): bar b = bar -
// (window - 1) + w gives features[b, c] (times sign[c] when mirror != 0; 0 for b outside [0,
// n_bars)) for c < n_features; the newest bar's last two columns are the position and the hold
// fraction; every other column is 0.
__device__ __forceinline__ float window_value(float bar, float mirror, float position, float hold,
                                              const float* __restrict__ features, const float* __restrict__ sign,
                                              int w, int c, int window, int n_features, long long n_bars) {
  if (c < n_features) {
    const long long b = (long long)bar - (window - 1) + w;
    if (b < 0 || b >= n_bars) return 0.0f;
    const float f = features[b * n_features + c];
    return mirror != 0.0f ? __fmul_rn(f, sign[c]) : f;
  }
  if (w != window - 1) return 0.0f;
  return c == n_features ? position : hold;
}

}  // namespace cudarl
