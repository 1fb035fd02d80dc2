// PopArt (van Hasselt et al. 2016, "Learning values across many orders of magnitude"), fitted
// to a fixed atom/quantile support. Twin: cudarl/reference/popart.py. Launchers: cudarl/ops/popart.py.
//
// state: float32 [8] = {mu, sigma, mu_prev, sigma_prev, m1, m2, decay, scale}
//   m1, m2: EMAs of E[y], E[y^2] from zero; decay = prod (1 - beta_t); mu = m1 / (1 - decay),
//   sigma = sqrt(max(m2 / (1 - decay) - mu^2, sigma_min^2)) (bias-corrected like Adam);
//   scale: support units per standard deviation. The normalised coordinate is
//   y_hat = (y - mu) / s with s = sigma / scale.
// beta is read from device memory (a schedule may move it between replays). No atomics.
#include <cudarl/reduce.cuh>

#define PA_MU 0
#define PA_SIGMA 1
#define PA_MU_PREV 2
#define PA_SIGMA_PREV 3
#define PA_M1 4
#define PA_M2 5
#define PA_DECAY 6
#define PA_SCALE 7
#define PA_REDUCE_THREADS 256

// ---------------------------------------------------------------------------------------------
// cudarl_popart_update: move the statistics with one batch of return-space TD targets y [B].
// One block of PA_REDUCE_THREADS: strided per-thread sums then a shared tree (fixed order);
// thread 0 writes the state. Reads B floats + 9; writes 8 floats.
extern "C" __global__ void cudarl_popart_update(const float* __restrict__ y, float* __restrict__ state,
                                                const float* __restrict__ beta, int B, float sigma_min) {
  __shared__ float s1[PA_REDUCE_THREADS];
  __shared__ float s2[PA_REDUCE_THREADS];
  const int t = threadIdx.x;
  float a1 = 0.f, a2 = 0.f;
  for (int i = t; i < B; i += PA_REDUCE_THREADS) { const float v = y[i]; a1 += v; a2 += v * v; }
  s1[t] = a1; s2[t] = a2;
  cudarl::block_tree_sum(s1, PA_REDUCE_THREADS);  // the same tree for each: sums as in one fused loop
  cudarl::block_tree_sum(s2, PA_REDUCE_THREADS);
  if (t == 0) {
    const float bt = beta[0];
    const float mean = s1[0] / (float)B, mean2 = s2[0] / (float)B;
    state[PA_MU_PREV] = state[PA_MU];
    state[PA_SIGMA_PREV] = state[PA_SIGMA];
    const float m1 = (1.f - bt) * state[PA_M1] + bt * mean;
    const float m2 = (1.f - bt) * state[PA_M2] + bt * mean2;
    const float decay = state[PA_DECAY] * (1.f - bt);
    const float c = 1.f - decay;
    const float mu = m1 / c;
    const float var = fmaxf(m2 / c - mu * mu, sigma_min * sigma_min);
    state[PA_M1] = m1;
    state[PA_M2] = m2;
    state[PA_DECAY] = decay;
    state[PA_MU] = mu;
    state[PA_SIGMA] = sqrtf(var);
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_popart_rescale: preserve sigma~ (W h + b) + mu across the last update.
//   W <- W sigma_prev / sigma;  b <- (s_prev b + mu_prev - mu) / s   (s = sigma / scale)
// Threads: one per element of W (those with index < n_out also do b). Reads/writes W and b once.
extern "C" __global__ void cudarl_popart_rescale(float* __restrict__ W, float* __restrict__ bias,
                                                 const float* __restrict__ state, int n_out, int n_in) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long n = (long long)n_out * n_in;
  const float scale = state[PA_SCALE];
  const float s = state[PA_SIGMA] / scale, s_prev = state[PA_SIGMA_PREV] / scale;
  if (i < n) W[i] = W[i] * (s_prev / s);
  if (i < n_out) bias[i] = (s_prev * bias[i] + state[PA_MU_PREV] - state[PA_MU]) / s;
}

// ---------------------------------------------------------------------------------------------
// cudarl_popart_normalize: out = (x - mu) / s (inverse = 0) or out = s x + mu (inverse = 1).
// Threads: one per element. Reads n + 3 floats; writes n.
extern "C" __global__ void cudarl_popart_normalize(const float* __restrict__ x, const float* __restrict__ state,
                                                   float* __restrict__ out, long long n, int inverse) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = state[PA_SIGMA] / state[PA_SCALE], mu = state[PA_MU];
  out[i] = inverse ? s * x[i] + mu : (x[i] - mu) / s;
}

// ---------------------------------------------------------------------------------------------
// cudarl_popart_normalize_rewards: rewards for a target in normalised coordinates.
//   (r + d (s z + mu) - mu) / s = (r - (1 - d) mu) / s + d z,  so  r~ = (r - (1 - d) mu) / s
// and the discount is unchanged: feed r~ to the C51 projection or the quantile targets.
// Threads: one per sample. Reads 2B + 3 floats; writes B.
extern "C" __global__ void cudarl_popart_normalize_rewards(const float* __restrict__ r_t, const float* __restrict__ discount_t,
                                                           const float* __restrict__ state, float* __restrict__ out, int B) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B) return;
  const float s = state[PA_SIGMA] / state[PA_SCALE], mu = state[PA_MU];
  out[i] = (r_t[i] - (1.f - discount_t[i]) * mu) / s;
}

// ---------------------------------------------------------------------------------------------
// cudarl_popart_td_targets: return-space TD targets y = r + d (s v_hat + mu) from normalised
// next-state values v_hat [B] (E_p[z] for C51, the quantile mean for IQN/QR). One per sample.
extern "C" __global__ void cudarl_popart_td_targets(const float* __restrict__ r_t, const float* __restrict__ discount_t,
                                                    const float* __restrict__ v_hat, const float* __restrict__ state,
                                                    float* __restrict__ out, int B) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B) return;
  const float s = state[PA_SIGMA] / state[PA_SCALE], mu = state[PA_MU];
  out[i] = r_t[i] + discount_t[i] * (s * v_hat[i] + mu);
}
