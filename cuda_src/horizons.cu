// horizons: the multi-horizon return head's loss (agent.aux "horizons"). Twin:
// cudarl/reference/horizons.py (the equations and the method). Launchers: cudarl/ops/horizons.py.
// Tests: tests/parity/test_horizons.py.
//
// One thread per sample b: the decision bar t of its state row, the cumulative log return over each
// horizon (ascending) summed in bar order, the squared error against the head's prediction where the
// horizon fits in the split (masked elsewhere: no read past t_end). Products are __fmul_rn and sums
// __fadd_rn (no FMA contraction), so the kernel equals its twin bit for bit. The batch totals follow
// in the same launch (future.cuh's future_totals); no float atomics (an integer ticket picks the block).

#include <cudarl/future.cuh>

namespace {
// One sample's loss, gradient and valid share (the loss kernel's per-thread work).
__device__ __forceinline__ void horizons_row(const float* __restrict__ pred, const float* __restrict__ row,
                                             const float* __restrict__ up, const float* __restrict__ down,
                                             const int* __restrict__ horizons, const float* __restrict__ hscale,
                                             float* __restrict__ loss_b, float* __restrict__ valid_b,
                                             float* __restrict__ grad, int H, int t_end, float scale) {
  int t;
  const float* x = cudarl::future_series(row, up, down, t);
  float acc = 0.0f, l = 0.0f, v = 0.0f;
  int j = 0;
  for (int h = 0; h < H; ++h) {
    const int k = horizons[h];
    float e = 0.0f;
    if (cudarl::future_fits(t, k, t_end)) {
      for (; j < k; ++j) acc = __fadd_rn(acc, x[j]);
      e = __fsub_rn(pred[h], __fmul_rn(acc, hscale[h]));
      v = __fadd_rn(v, 1.0f);
    }
    grad[h] = __fmul_rn(__fmul_rn(2.0f, scale), e);
    l = __fadd_rn(l, __fmul_rn(e, e));
  }
  *loss_b = __fmul_rn(scale, l);
  *valid_b = __fdiv_rn(v, (float)H);
}
}  // namespace

// loss: reads H predictions, the state row and at most max(horizons) log returns per sample; writes
// H gradients, loss_per[b] = scale sum_h e_bh^2, valid_per[b] = (horizons that fit) / H, where
// e_bh = pred[b, h] - hscale[h] sum_{j < horizons[h]} x[t + j] (0 where it does not fit) and
// grad[b, h] = 2 scale e_bh; then, by the block that finishes last (cudarl::future_totals: + 2B reads),
// out[0] = loss_scale sum_b loss_per[b] and out[1] = valid_scale sum_b valid_per[b], the bits of the
// two one-block regularizers_mean launches they replace.
extern "C" __global__ void cudarl_horizons_loss(const float* __restrict__ pred, const float* __restrict__ rows,
                                                const float* __restrict__ up, const float* __restrict__ down,
                                                const int* __restrict__ horizons, const float* __restrict__ hscale,
                                                float* __restrict__ loss_per, float* __restrict__ valid_per,
                                                float* __restrict__ grad, float* __restrict__ out,
                                                unsigned int* __restrict__ done, int B, int H, int t_end, float scale,
                                                float loss_scale, float valid_scale) {
  __shared__ float part[CUDARL_FUTURE_MEAN_SLOTS];
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < B)  // no return: every thread reaches future_totals' last_block()
    horizons_row(pred + (long long)b * H, rows + (long long)b * CUDARL_STATE_DIM, up, down, horizons, hscale,
                 loss_per + b, valid_per + b, grad + (long long)b * H, H, t_end, scale);
  cudarl::future_totals(loss_per, valid_per, out, done, B, loss_scale, valid_scale, part);
}
