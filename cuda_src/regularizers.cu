// Offline-RL regulariser: discrete CQL (Kumar et al. 2020) for C51 and quantile heads (agent.cql_alpha).
// Twin: cudarl/reference/regularizers.py. Launchers: cudarl/ops/regularizers.py.
// One warp per sample for the CQL ops (A <= 32: lane a holds Q_a); xor-butterfly reductions;
// no atomics. accumulate = 1 adds into grad (each element is owned by one lane: no race).

#include <cudarl/reduce.cuh>

#define RG_WARP 32
#define RG_FULL 0xffffffffu
#define RG_NEG_INF __int_as_float((int)0xff800000u)
#define RG_THREADS 256

namespace {
using cudarl::warp_max;
using cudarl::warp_sum;
__device__ __forceinline__ void softmax_stats(const float* x, int K, int lane, float& m, float& log_s) {
  float mx = RG_NEG_INF;
  for (int k = lane; k < K; k += RG_WARP) mx = fmaxf(mx, x[k]);
  m = warp_max(mx);
  float s = 0.f;
  for (int k = lane; k < K; k += RG_WARP) s += expf(x[k] - m);
  log_s = logf(warp_sum(s));
}
// lse over lanes < A of my_q, the same in every lane
__device__ __forceinline__ float lanes_logsumexp(float my_q, int lane, int A) {
  const float m = warp_max(lane < A ? my_q : RG_NEG_INF);
  const float s = warp_sum(lane < A ? expf(my_q - m) : 0.f);
  return m + logf(s);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// cudarl_regularizers_cql_c51: Q_a = sum_k p_ak z_k, p_a = softmax(logits[b, a]);
//   cql_b = logsumexp_a Q_a - Q_{a_b};  grad[b,a,k] (+)= (alpha / B)(pi_a - 1{a = a_b}) p_ak (z_k - Q_a),
//   pi = softmax_a(Q). Threads: one warp per sample. Reads 2*A*K + K floats; writes A*K + 1.
extern "C" __global__ void cudarl_regularizers_cql_c51(const float* __restrict__ logits, const int* __restrict__ actions,
                                                       const float* __restrict__ support, float* __restrict__ cql_per,
                                                       float* __restrict__ grad, int B, int A, int K, float alpha,
                                                       int accumulate) {
  const int lane = threadIdx.x % RG_WARP;
  const int b = blockIdx.x * (blockDim.x / RG_WARP) + threadIdx.x / RG_WARP;
  if (b >= B) return;
  const int act = actions[b];
  if (act < 0 || act >= A) { if (lane == 0) cql_per[b] = __int_as_float((int)0x7fffffffu); return; }
  float my_q = 0.f;
  for (int a = 0; a < A; ++a) {
    const float* x = logits + ((long long)b * A + a) * K;
    float m, log_s;
    softmax_stats(x, K, lane, m, log_s);
    float acc = 0.f;
    for (int k = lane; k < K; k += RG_WARP) acc += expf(x[k] - m - log_s) * support[k];
    const float q = warp_sum(acc);
    if (lane == a) my_q = q;
  }
  const float lse = lanes_logsumexp(my_q, lane, A);
  const float q_data = __shfl_sync(RG_FULL, my_q, act);
  const float scale = alpha / (float)B;
  for (int a = 0; a < A; ++a) {
    const float qa = __shfl_sync(RG_FULL, my_q, a);
    const float coef = scale * (expf(qa - lse) - (a == act ? 1.f : 0.f));
    const float* x = logits + ((long long)b * A + a) * K;
    float m, log_s;
    softmax_stats(x, K, lane, m, log_s);
    float* g = grad + ((long long)b * A + a) * K;
    for (int k = lane; k < K; k += RG_WARP) {
      const float v = coef * expf(x[k] - m - log_s) * (support[k] - qa);
      g[k] = accumulate ? g[k] + v : v;
    }
  }
  if (lane == 0) cql_per[b] = lse - q_data;
}

// ---------------------------------------------------------------------------------------------
// cudarl_regularizers_cql_quantile: theta [B, N, A] (the IQN head's layout), Q_a = (1/N) sum_i theta[b,i,a];
//   cql_b = logsumexp_a Q_a - Q_{a_b};  grad[b,i,a] (+)= (alpha / B)(pi_a - 1{a = a_b}) / N.
// Threads: one warp per sample; lane a holds Q_a and its coefficient. Q_a sums column a with
// stride A (the A passes share the sample's cache lines); the gradient is written over the
// flat index k = i*A + a (coalesced), each lane fetching coefficient k % A by a shuffle in a
// warp-uniform loop. Reads N*A floats; writes N*A + 1.
extern "C" __global__ void cudarl_regularizers_cql_quantile(const float* __restrict__ theta, const int* __restrict__ actions,
                                                            float* __restrict__ cql_per, float* __restrict__ grad,
                                                            int B, int A, int N, float alpha, int accumulate) {
  const int lane = threadIdx.x % RG_WARP;
  const int b = blockIdx.x * (blockDim.x / RG_WARP) + threadIdx.x / RG_WARP;
  if (b >= B) return;
  const int act = actions[b];
  if (act < 0 || act >= A) { if (lane == 0) cql_per[b] = __int_as_float((int)0x7fffffffu); return; }
  const long long NA = (long long)N * A;
  const float* x = theta + (long long)b * NA;
  float my_q = 0.f;
  for (int a = 0; a < A; ++a) {
    float acc = 0.f;
    for (int i = lane; i < N; i += RG_WARP) acc += x[(long long)i * A + a];
    const float q = warp_sum(acc) / (float)N;
    if (lane == a) my_q = q;
  }
  const float lse = lanes_logsumexp(my_q, lane, A);
  const float q_data = __shfl_sync(RG_FULL, my_q, act);
  // lanes >= A compute an unused coefficient from my_q = 0
  const float my_coef = alpha / (float)B * (expf(my_q - lse) - (lane == act ? 1.f : 0.f)) / (float)N;
  float* g = grad + (long long)b * NA;
  for (long long base = 0; base < NA; base += RG_WARP) {  // same trip count in every lane: the shuffle is convergent
    const long long k = base + lane;
    const float v = __shfl_sync(RG_FULL, my_coef, (int)(k % A));
    if (k < NA) g[k] = accumulate ? g[k] + v : v;
  }
  if (lane == 0) cql_per[b] = lse - q_data;
}

// ---------------------------------------------------------------------------------------------
// cudarl_regularizers_mean: out[0] = scale * sum_i x_i, one block of RG_THREADS, fixed order.
extern "C" __global__ void cudarl_regularizers_mean(const float* __restrict__ x, float* __restrict__ out, int n, float scale) {
  __shared__ float part[RG_THREADS];
  const int t = threadIdx.x;
  float acc = 0.f;
  for (int i = t; i < n; i += RG_THREADS) acc += x[i];
  part[t] = acc;
  cudarl::block_tree_sum(part, RG_THREADS);
  if (t == 0) out[0] = scale * part[0];
}
