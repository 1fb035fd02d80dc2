// Causal intervention on feature groups that should not matter (agent.aux = ["causal"]).
// Twin: cudarl/reference/causal.py (the equations and the interventions). Launchers: cudarl/ops/causal.py.
// intervene (grid-stride over elements), penalty_c51 / penalty_quantile (a warp per (b, a)), reduce
// (one block, fixed order). No atomics; the group of a step is counter[0] % G (a device counter,
// moved by reduce, so a graph replay rotates through the groups).

#include <cudarl/reduce.cuh>
#include <cudarl/softmax.cuh>

#define CI_WARP 32
#define CI_THREADS 256

// ---------------------------------------------------------------------------------------------
// cudarl_causal_intervene: out[r, w, c] = x[s(r), w, c] off the group's columns; on them
//   mode 0 (swap): x[s((r + 1) % R), w, c]; mode 1 (offset): x[s(r), w, c] + offset,
// where s(r) = floor(r Bx / R) picks the sub-batch's rows of x (auxgrad.spread: out has R rows, x has Bx >= R;
// R == Bx is every row, s(r) = r). Reading x through s folds the sub-batch's gather into this launch (one node
// fewer on causal's chain). g = counter[0] % G, mask [G, C] int32, mode [G] int32. Threads: grid-stride, one
// element of out each. Reads about 4 R*W*C bytes; writes the same.
extern "C" __global__ void cudarl_causal_intervene(const float* __restrict__ x, float* __restrict__ out,
                                                   const int* __restrict__ mask, const int* __restrict__ mode,
                                                   const long long* __restrict__ counter, int R, int Bx, int W, int C,
                                                   int G, float offset) {
  const int g = (int)(counter[0] % (long long)G);
  const int md = mode[g];
  const long long row = (long long)W * C;
  const long long n = (long long)R * row;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / row, j = i - r * row;
    const int c = (int)(j % C);
    long long src = r * Bx / R;
    if (mask[(long long)g * C + c] && md != 1) src = ((r + 1) % R) * Bx / R;  // swap: the next sub-batch row
    const float v = x[src * row + j];
    out[i] = (mask[(long long)g * C + c] && md == 1) ? v + offset : v;
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_causal_penalty_c51: Q' = sum_k softmax(logits_c[b, a])_k z_k, d[b, a] = Q' - q[b, a],
//   grad[b, a, k] = (2 w / (B A)) d p_k (z_k - Q'). Threads: one warp per (b, a) row.
// Reads 2K + 1 floats a row; writes K + 1.
extern "C" __global__ void cudarl_causal_penalty_c51(const float* __restrict__ logits_c, const float* __restrict__ q,
                                                     const float* __restrict__ support, float* __restrict__ d,
                                                     float* __restrict__ grad, int B, int A, int K, float weight) {
  const int lane = threadIdx.x % CI_WARP;
  const int r = blockIdx.x * (blockDim.x / CI_WARP) + threadIdx.x / CI_WARP;
  if (r >= B * A) return;
  const float* x = logits_c + (long long)r * K;
  float acc = 0.f;
  cudarl::warp_softmax_visit(x, K, lane, [&](int k, float, float pk) { acc += pk * support[k]; });
  const float qc = cudarl::warp_sum(acc);
  const float diff = qc - q[r];
  if (lane == 0) d[r] = diff;
  const float scale = 2.f * weight / (float)(B * A) * diff;
  float* out = grad + (long long)r * K;
  cudarl::warp_softmax_visit(x, K, lane, [&](int k, float, float pk) { out[k] = scale * pk * (support[k] - qc); });
}

// ---------------------------------------------------------------------------------------------
// cudarl_causal_penalty_quantile: theta_c [B, N, A]; Q'[b, a] = (1/N) sum_n theta_c[b, n, a],
//   d = Q' - q[b, a], grad[b, n, a] = (2 w / (B A)) d / N. Threads: one warp per (b, a), lanes over n.
// Reads N + 1 floats a row; writes N + 1.
extern "C" __global__ void cudarl_causal_penalty_quantile(const float* __restrict__ theta_c,
                                                          const float* __restrict__ q, float* __restrict__ d,
                                                          float* __restrict__ grad, int B, int N, int A,
                                                          float weight) {
  const int lane = threadIdx.x % CI_WARP;
  const int r = blockIdx.x * (blockDim.x / CI_WARP) + threadIdx.x / CI_WARP;
  if (r >= B * A) return;
  const int b = r / A, a = r % A;
  const float* th = theta_c + (long long)b * N * A + a;
  float acc = 0.f;
  for (int n = lane; n < N; n += CI_WARP) acc += th[(long long)n * A];
  const float qc = cudarl::warp_sum(acc) / (float)N;
  const float diff = qc - q[r];
  if (lane == 0) d[r] = diff;
  const float v = 2.f * weight / (float)(B * A) * diff / (float)N;
  float* out = grad + (long long)b * N * A + a;
  for (int n = lane; n < N; n += CI_WARP) out[(long long)n * A] = v;
}

// ---------------------------------------------------------------------------------------------
// cudarl_causal_reduce: g = counter[0] % G; state[0] = w mean d^2, state[1] = g,
//   state[2 + g] = mean |d| (other groups keep theirs); then counter[0] += 1.
// Threads: one CI_THREADS block (rows strided in order, then a tree). Reads R floats; writes 3.
extern "C" __global__ void cudarl_causal_reduce(const float* __restrict__ d, float* __restrict__ state,
                                                long long* __restrict__ counter, int R, int G, float weight) {
  __shared__ float sh[CI_THREADS];
  float sq = 0.f, ab = 0.f;
  for (int r = threadIdx.x; r < R; r += CI_THREADS) {
    const float v = d[r];
    sq += v * v;
    ab += fabsf(v);
  }
  sq = cudarl::block_sum(sq, sh, CI_THREADS);
  ab = cudarl::block_sum(ab, sh, CI_THREADS);
  if (threadIdx.x != 0) return;
  const long long c = counter[0];
  const int g = (int)(c % (long long)G);
  state[0] = weight * sq / (float)R;
  state[1] = (float)g;
  state[2 + g] = ab / (float)R;
  counter[0] = c + 1;
}
