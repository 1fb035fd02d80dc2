// horizons: the multi-horizon return head's loss (agent.aux "horizons"). Twin:
// cudarl/reference/horizons.py (the equations and the method). Launchers: cudarl/ops/horizons.py.
// Tests: tests/parity/test_horizons.py.
//
// One thread per sample b: the decision bar t of its state row, the cumulative log return over each
// horizon (ascending) summed in bar order, the squared error against the head's prediction where the
// horizon fits in the split (masked elsewhere: no read past t_end). Products are __fmul_rn and sums
// __fadd_rn (no FMA contraction), so the kernel equals its twin bit for bit; no atomics.

#include <cudarl/future.cuh>

// loss: reads H predictions, the state row and at most max(horizons) log returns per sample; writes
// H gradients, loss_per[b] = scale sum_h e_bh^2, valid_per[b] = (horizons that fit) / H, where
// e_bh = pred[b, h] - hscale[h] sum_{j < horizons[h]} x[t + j] (0 where it does not fit) and
// grad[b, h] = 2 scale e_bh.
extern "C" __global__ void cudarl_horizons_loss(const float* __restrict__ pred, const float* __restrict__ rows,
                                                const float* __restrict__ up, const float* __restrict__ down,
                                                const int* __restrict__ horizons, const float* __restrict__ hscale,
                                                float* __restrict__ loss_per, float* __restrict__ valid_per,
                                                float* __restrict__ grad, int B, int H, int t_end, float scale) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  int t;
  const float* x = cudarl::future_series(rows + (long long)b * CUDARL_STATE_DIM, up, down, t);
  float acc = 0.0f, l = 0.0f, v = 0.0f;
  int j = 0;
  for (int h = 0; h < H; ++h) {
    const int k = horizons[h];
    float e = 0.0f;
    if (cudarl::future_fits(t, k, t_end)) {
      for (; j < k; ++j) acc = __fadd_rn(acc, x[j]);
      e = __fsub_rn(pred[(long long)b * H + h], __fmul_rn(acc, hscale[h]));
      v = __fadd_rn(v, 1.0f);
    }
    grad[(long long)b * H + h] = __fmul_rn(__fmul_rn(2.0f, scale), e);
    l = __fadd_rn(l, __fmul_rn(e, e));
  }
  loss_per[b] = __fmul_rn(scale, l);
  valid_per[b] = __fdiv_rn(v, (float)H);
}
