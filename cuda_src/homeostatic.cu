// Homeostatic regulariser on C51 atom utilisation (agent.aux = ["homeostatic"]).
// Twin: cudarl/reference/homeostatic.py (the equations). Launchers: cudarl/ops/homeostatic.py.
// Four launches, no atomics, every reduction in one fixed order: probs (a warp a row), mass (a
// block an atom, rows strided then a tree), control (one block), grad (a warp a row).

#include <cudarl/reduce.cuh>
#include <cudarl/softmax.cuh>

#define HS_WARP 32
#define HS_THREADS 256
#define HS_TINY 1e-30f

// ---------------------------------------------------------------------------------------------
// cudarl_homeostatic_probs: p[r, :] = softmax(logits[r, :]). Threads: one warp per row.
// Reads R*K floats; writes R*K.
extern "C" __global__ void cudarl_homeostatic_probs(const float* __restrict__ logits, float* __restrict__ p, int R,
                                                    int K) {
  const int lane = threadIdx.x % HS_WARP;
  const int r = blockIdx.x * (blockDim.x / HS_WARP) + threadIdx.x / HS_WARP;
  if (r >= R) return;
  const float* x = logits + (long long)r * K;
  float* out = p + (long long)r * K;
  cudarl::warp_softmax_visit(x, K, lane, [&](int k, float, float pk) { out[k] = pk; });
}

// ---------------------------------------------------------------------------------------------
// cudarl_homeostatic_mass: m[k] = (1/R) sum_r p[r, k]. Threads: one HS_THREADS block per atom k,
// rows r = t, t + HS_THREADS, ... summed in order per thread, then the block's tree.
// Reads R*K floats; writes K.
extern "C" __global__ void cudarl_homeostatic_mass(const float* __restrict__ p, float* __restrict__ m, int R, int K) {
  __shared__ float sh[HS_THREADS];
  const int k = blockIdx.x;
  float acc = 0.f;
  for (int r = threadIdx.x; r < R; r += HS_THREADS) acc += p[(long long)r * K + k];
  const float s = cudarl::block_sum(acc, sh, HS_THREADS);
  if (threadIdx.x == 0) m[k] = s / (float)R;
}

// ---------------------------------------------------------------------------------------------
// cudarl_homeostatic_control: H = -sum_k m_k log m_k, u = exp(H)/K, loss = w (u - u*)^2,
// g_k = 2 w (u - u*) u (-log m_k - 1); state = [loss, u, H]. Threads: one HS_THREADS block.
// Reads K floats; writes K + 3.
extern "C" __global__ void cudarl_homeostatic_control(const float* __restrict__ m, float* __restrict__ g,
                                                      float* __restrict__ state, int K, float target, float weight) {
  __shared__ float sh[HS_THREADS];
  float acc = 0.f;
  for (int k = threadIdx.x; k < K; k += HS_THREADS) {
    const float mk = m[k];
    acc -= mk * logf(fmaxf(mk, HS_TINY));
  }
  const float H = cudarl::block_sum(acc, sh, HS_THREADS);
  const float u = expf(H) / (float)K;
  const float err = u - target;
  const float coef = 2.f * weight * err * u;
  for (int k = threadIdx.x; k < K; k += HS_THREADS) g[k] = coef * (-logf(fmaxf(m[k], HS_TINY)) - 1.f);
  if (threadIdx.x == 0) {
    state[0] = weight * err * err;
    state[1] = u;
    state[2] = H;
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_homeostatic_grad: grad[r, j] (+)= (1/R) p[r, j] (g_j - sum_k p[r, k] g_k).
// Threads: one warp per row; each element is one lane's (accumulate adds without a race).
// Reads 2*R*K + K floats (3*R*K with accumulate); writes R*K.
extern "C" __global__ void cudarl_homeostatic_grad(const float* __restrict__ p, const float* __restrict__ g,
                                                   float* __restrict__ grad, int R, int K, int accumulate) {
  const int lane = threadIdx.x % HS_WARP;
  const int r = blockIdx.x * (blockDim.x / HS_WARP) + threadIdx.x / HS_WARP;
  if (r >= R) return;
  const float* pr = p + (long long)r * K;
  float* out = grad + (long long)r * K;
  float s = 0.f;
  for (int k = lane; k < K; k += HS_WARP) s += pr[k] * g[k];
  s = cudarl::warp_sum(s);
  const float inv_r = 1.f / (float)R;
  for (int k = lane; k < K; k += HS_WARP) {
    const float v = pr[k] * (g[k] - s) * inv_r;
    out[k] = accumulate ? out[k] + v : v;
  }
}
