// risk: the risk head's loss (agent.aux "risk"): realised volatility and drawdown over the next k bars.
// Twin: cudarl/reference/risk.py (the equations and the method). Launchers: cudarl/ops/risk.py.
// Tests: tests/parity/test_risk.py.
//
// One thread per sample: the k log returns after its decision bar (masked where they run past the
// split: no read past t_end), their root mean square and the largest fall of their running sum from
// its running peak (both >= 0), scaled to units of the split's per-bar deviation; squared errors of the
// head's two outputs. __fmul_rn / __fadd_rn (no FMA contraction): equal to the twin bit for bit. The
// batch totals follow in the same launch (future.cuh's future_totals); no float atomics.

#include <cudarl/future.cuh>

namespace {
// One sample's loss, gradients and valid flag (the loss kernel's per-thread work).
__device__ __forceinline__ void risk_row(const float* __restrict__ pred, const float* __restrict__ row,
                                         const float* __restrict__ up, const float* __restrict__ down,
                                         float* __restrict__ loss_b, float* __restrict__ valid_b,
                                         float* __restrict__ grad, int k, int t_end, float inv_k, float vol_scale,
                                         float dd_scale, float scale) {
  int t;
  const float* x = cudarl::future_series(row, up, down, t);
  float e_vol = 0.0f, e_dd = 0.0f, v = 0.0f;
  if (cudarl::future_fits(t, k, t_end)) {
    float c = 0.0f, peak = 0.0f, dd = 0.0f, ss = 0.0f;
    for (int j = 0; j < k; ++j) {
      const float xj = x[j];
      c = __fadd_rn(c, xj);
      peak = fmaxf(peak, c);
      dd = fmaxf(dd, __fsub_rn(peak, c));
      ss = __fadd_rn(ss, __fmul_rn(xj, xj));
    }
    const float vol = __fmul_rn(__fsqrt_rn(__fmul_rn(ss, inv_k)), vol_scale);
    e_vol = __fsub_rn(pred[0], vol);
    e_dd = __fsub_rn(pred[1], __fmul_rn(dd, dd_scale));
    v = 1.0f;
  }
  const float g = __fmul_rn(2.0f, scale);
  grad[0] = __fmul_rn(g, e_vol);
  grad[1] = __fmul_rn(g, e_dd);
  *loss_b = __fmul_rn(scale, __fadd_rn(__fmul_rn(e_vol, e_vol), __fmul_rn(e_dd, e_dd)));
  *valid_b = v;
}
}  // namespace

// loss: reads 2 predictions, the state row and k log returns per sample; writes 2 gradients,
// loss_per[b] = scale (e_vol^2 + e_dd^2) and valid_per[b] (1 where the k bars fit, else 0 and no error).
// vol = sqrt(inv_k sum x_j^2) vol_scale, dd = max_j (peak_j - c_j) dd_scale with c_j = x_0 + .. + x_j,
// peak_j = max(0, c_0, .., c_j); grad = 2 scale e. Then, by the block that finishes last
// (cudarl::future_totals: + 2B reads), out[0] = loss_scale sum_b loss_per[b] and out[1] = valid_scale
// sum_b valid_per[b], the bits of the two one-block regularizers_mean launches they replace.
extern "C" __global__ void cudarl_risk_loss(const float* __restrict__ pred, const float* __restrict__ rows,
                                            const float* __restrict__ up, const float* __restrict__ down,
                                            float* __restrict__ loss_per, float* __restrict__ valid_per,
                                            float* __restrict__ grad, float* __restrict__ out,
                                            unsigned int* __restrict__ done, int B, int k, int t_end, float inv_k,
                                            float vol_scale, float dd_scale, float scale, float loss_scale,
                                            float valid_scale) {
  __shared__ float part[CUDARL_FUTURE_MEAN_SLOTS];
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < B)  // no return: every thread reaches future_totals' last_block()
    risk_row(pred + 2LL * b, rows + (long long)b * CUDARL_STATE_DIM, up, down, loss_per + b, valid_per + b,
             grad + 2LL * b, k, t_end, inv_k, vol_scale, dd_scale, scale);
  cudarl::future_totals(loss_per, valid_per, out, done, B, loss_scale, valid_scale, part);
}
