// Selectivity: a learned gate over the input features or the window's positions, with an L1 penalty
// (agent.aux = ["selectivity"]). Twin: cudarl/reference/selectivity.py (the equations and our
// choices). Launchers: cudarl/ops/selectivity.py. x is [B, W, C] (C = F + 2; the position columns
// c >= F are never gated); over = 0: a gate per feature (J = F), 1: a gate per bar (J = W).
// No atomics: backward is one block per gate, its members summed in one fixed order.

#include <cudarl/reduce.cuh>

#define SL_THREADS 256

namespace {
__device__ __forceinline__ float sigmoid(float l) { return 1.f / (1.f + expf(-l)); }
}  // namespace

// ---------------------------------------------------------------------------------------------
// cudarl_selectivity_forward: out[b, w, c] = s_j x[b, w, c], j = c (over 0) or w (over 1), c < F;
// out = x on the position columns. Threads: grid-stride, one element each. Reads 4 B W C bytes
// (+ the J gate logits); writes 4 B W C.
extern "C" __global__ void cudarl_selectivity_forward(const float* __restrict__ x, const float* __restrict__ logit,
                                                      float* __restrict__ out, int B, int W, int C, int F, int over) {
  const long long n = (long long)B * W * C;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const int c = (int)(i % C);
    const int w = (int)((i / C) % W);
    out[i] = c < F ? x[i] * sigmoid(logit[over ? w : c]) : x[i];
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_selectivity_backward: dlogit[j] = s_j (1 - s_j) (sum_{b, (w, c) in j} dxg x + l1 / J).
// Threads: one SL_THREADS block per gate j; the gate's B * M members (M = W bars of feature j, or
// F features of bar j) strided per thread in order, then the block's tree. Reads 8 B W F bytes in
// all; writes J floats.
extern "C" __global__ void cudarl_selectivity_backward(const float* __restrict__ x, const float* __restrict__ dxg,
                                                       const float* __restrict__ logit, float* __restrict__ dlogit,
                                                       int B, int W, int C, int F, int over, float l1) {
  __shared__ float sh[SL_THREADS];
  const int j = blockIdx.x;
  const int J = over ? W : F;
  const int M = over ? F : W;
  const long long total = (long long)B * M;
  float acc = 0.f;
  for (long long t = threadIdx.x; t < total; t += SL_THREADS) {
    const long long b = t / M;
    const int m = (int)(t % M);
    const long long i = (b * W + (over ? j : m)) * C + (over ? m : j);
    acc += dxg[i] * x[i];
  }
  const float s = cudarl::block_sum(acc, sh, SL_THREADS);
  if (threadIdx.x == 0) {
    const float g = sigmoid(logit[j]);
    dlogit[j] = g * (1.f - g) * (s + l1 / (float)J);
  }
}

// ---------------------------------------------------------------------------------------------
// The gate folded into the first layer's weight (an encoder whose first Linear reads the whole input row,
// W1 [W C, H] with row r for input column r): x' W1 = x (diag(s_ext) W1), s_ext[r] the gate of column r
// (1 on the position columns).
//
// cudarl_selectivity_fold: wg[r, k] = s_ext[r] w[r, k]; the position rows copied. Threads: grid-stride, one
// element each (the gate's sigmoid per element: J logits, all in cache). Reads 4 W C H bytes (+ the logits);
// writes 4 W C H.
extern "C" __global__ void cudarl_selectivity_fold(const float* __restrict__ w, const float* __restrict__ logit,
                                                   float* __restrict__ wg, int W, int C, int F, int over, int H) {
  const long long n = (long long)W * C * H;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const int r = (int)(i / H);
    const int c = r % C;
    wg[i] = c < F ? sigmoid(logit[over ? r / C : c]) * w[i] : w[i];
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_selectivity_fold_backward: from R = dL/d(wg) (the first layer's dW GEMM over the ungated input,
// in dw), in place dw[r, :] = s_ext[r] R[r, :] (dL/dW1; the position rows left as they are) and
// dlogit[j] = s_j (1 - s_j) (sum_{r in j} sum_k w[r, k] R[r, k] + l1 / J). Threads: one SL_THREADS block per
// gate j; its M H members (M = W rows of feature j, or F rows of bar j; member t = (m, k), m = t / H)
// strided per thread in order, each read (R, then w) before the same thread writes it scaled, then the
// block's tree. Reads 8 W F H bytes in all; writes 4 W F H + J floats. No atomics.
extern "C" __global__ void cudarl_selectivity_fold_backward(const float* __restrict__ w,
                                                            const float* __restrict__ logit, float* dw,
                                                            float* __restrict__ dlogit, int W, int C, int F,
                                                            int over, int H, float l1) {
  __shared__ float sh[SL_THREADS];
  const int j = blockIdx.x;
  const int J = over ? W : F;
  const int M = over ? F : W;
  const float g = sigmoid(logit[j]);
  const long long total = (long long)M * H;
  float acc = 0.f;
  for (long long t = threadIdx.x; t < total; t += SL_THREADS) {
    const int m = (int)(t / H);
    const int k = (int)(t % H);
    const long long i = (long long)(over ? j * C + m : m * C + j) * H + k;
    const float r = dw[i];
    acc += w[i] * r;
    dw[i] = g * r;
  }
  const float s = cudarl::block_sum(acc, sh, SL_THREADS);
  if (threadIdx.x == 0) dlogit[j] = g * (1.f - g) * (s + l1 / (float)J);
}
