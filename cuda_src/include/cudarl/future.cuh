// The bars after a decision, for auxiliary targets (horizons.cu, risk.cu; twin:
// cudarl/reference/horizons.py future_log_returns). A state row's bar t is the decision bar; the
// log return of bar t + j (j >= 0) is the one a position held from the decision earns: up[t + j] =
// log(1 + ret[t + j]), down[] the mirrored market's log(1 - ret). A horizon of k bars needs
// ret[t + k - 1], which reads the price at t + k + 1: it must lie inside the split, t + k + 1 < t_end.
//
// future_totals: the losses' two batch totals in their own launch's tail (no regularizers_mean
// launches after it): the block that finishes last (cudarl::last_block on the integer ticket
// *done, 0 at launch and left 0) sums loss_per and valid_per in the order of the one-block
// regularizers_mean kernel (256 threads: CUDARL_FUTURE_MEAN_SLOTS, cudarl::block_ordered_sum) and
// scales them as it did, so out[] has the bits those two launches gave.
#pragma once

#include <cudarl/reduce.cuh>

#define CUDARL_STATE_DIM 4
#define CUDARL_FUTURE_MEAN_SLOTS 256  // regularizers.cu's RG_THREADS: the former mean's block

namespace cudarl {
// The decision's log-return series (up or down by the row's mirror flag) from bar t on, and t; the
// caller reads k bars of it only when future_fits(t, k, t_end).
__device__ __forceinline__ const float* future_series(const float* __restrict__ row, const float* __restrict__ up,
                                                      const float* __restrict__ down, int& t) {
  t = (int)row[0];
  return (row[1] != 0.0f ? down : up) + t;
}
__device__ __forceinline__ bool future_fits(int t, int k, int t_end) { return t >= 0 && t + k + 1 < t_end; }

// out[0] = loss_scale sum_b loss_per[b], out[1] = valid_scale sum_b valid_per[b] (see the banner). Call
// from every thread of every block, after the block's loss_per and valid_per writes; part holds
// CUDARL_FUTURE_MEAN_SLOTS floats of shared memory.
__device__ __forceinline__ void future_totals(const float* loss_per, const float* valid_per, float* out,
                                              unsigned int* done, int B, float loss_scale, float valid_scale,
                                              float* part) {
  if (last_block(done)) {
    const float l = block_ordered_sum<CUDARL_FUTURE_MEAN_SLOTS>(loss_per, B, part);
    const float v = block_ordered_sum<CUDARL_FUTURE_MEAN_SLOTS>(valid_per, B, part);
    if (threadIdx.x == 0) {
      out[0] = __fmul_rn(loss_scale, l);
      out[1] = __fmul_rn(valid_scale, v);
    }
  }
}
}  // namespace cudarl
