// PopArt (van Hasselt et al. 2016, "Learning values across many orders of magnitude"), fitted
// to a fixed atom/quantile support. Twin: cudarl/reference/popart.py. Launchers: cudarl/ops/popart.py.
//
// state: float32 [8] = {mu, sigma, mu_prev, sigma_prev, m1, m2, decay, scale}; the statistics'
// math is in <cudarl/popart.cuh> (shared with the fused C51 targets in c51.cu):
//   m1, m2: EMAs of E[y], E[y^2] from zero; decay = prod (1 - beta_t); mu = m1 / (1 - decay),
//   sigma = sqrt(max(m2 / (1 - decay) - mu^2, sigma_min^2)) (bias-corrected like Adam);
//   scale: support units per standard deviation. The normalised coordinate is
//   y_hat = (y - mu) / s with s = sigma / scale.
// beta is read from device memory (a schedule may move it between replays). No atomics.
//
// The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 4):
// every kernel takes blockIdx.y as the member mb. Its state is state + mb * STATE_SIZE ([P, 8]) and
// beta + mb ([P]); the per-sample arrays (y, r_t, discount_t, v_hat, out: [B]) advance by mb * s_b,
// rescale's W and bias (views of one flat parameter row) by mb * s_w, normalize's x and out by mb * s_x.
// The x grid, the block, each thread's work and every reduction's order are the single launch's, so
// member mb gets the bits of a single launch on its rows; one member (gridDim.y = 1, mb = 0: every
// offset zero) is the single launch. sigma_min is one value for every member of a launch.
#include <cudarl/popart.cuh>

namespace pa = cudarl::popart;

// ---------------------------------------------------------------------------------------------
// cudarl_popart_update: move the statistics with one batch of return-space TD targets y [B].
// One block of pa::kReduceThreads: strided per-thread sums then a shared tree (fixed order);
// thread 0 writes the state; grid.y = members. Reads B floats + 9; writes 7 floats (a member).
extern "C" __global__ void cudarl_popart_update(const float* __restrict__ y, float* state,
                                                const float* __restrict__ beta, int B, float sigma_min,
                                                long long s_b) {
  __shared__ float s1[pa::kReduceThreads];
  __shared__ float s2[pa::kReduceThreads];
  const long long mb = blockIdx.y;
  y += mb * s_b;
  state += mb * pa::STATE_SIZE;
  beta += mb;
  const pa::Stats old = pa::load(state);  // before the barriers below
  float sum, sum2;
  pa::batch_moments(y, B, s1, s2, sum, sum2);
  if (threadIdx.x == 0) pa::store(state, old, pa::updated(old, beta[0], sum, sum2, B, sigma_min));
}

// ---------------------------------------------------------------------------------------------
// cudarl_popart_update_normalize_rewards: update (as cudarl_popart_update, from y [B]) and then
// the normalised rewards out = (r - (1 - d) mu') / s' with the UPDATED statistics, in one launch.
// One block of pa::kReduceThreads: every thread reads the old state before the reduction's
// barriers and computes the same new statistics; thread 0 writes the state; thread t writes
// out[i] for i = t, t + pa::kReduceThreads, ... y may be r_t (IQN's statistics follow the
// rewards); out must not overlap the inputs; grid.y = members. Reads 3B floats + 9; writes B + 7
// floats (a member).
extern "C" __global__ void cudarl_popart_update_normalize_rewards(const float* __restrict__ y, const float* __restrict__ r_t,
                                                                  const float* __restrict__ discount_t, float* state,
                                                                  const float* __restrict__ beta, float* __restrict__ out, int B,
                                                                  float sigma_min, long long s_b) {
  __shared__ float s1[pa::kReduceThreads];
  __shared__ float s2[pa::kReduceThreads];
  const long long mb = blockIdx.y;
  y += mb * s_b;
  r_t += mb * s_b;
  discount_t += mb * s_b;
  out += mb * s_b;
  state += mb * pa::STATE_SIZE;
  beta += mb;
  const pa::Stats old = pa::load(state);  // before the barriers below
  float sum, sum2;
  pa::batch_moments(y, B, s1, s2, sum, sum2);
  const pa::Stats st = pa::updated(old, beta[0], sum, sum2, B, sigma_min);
  if (threadIdx.x == 0) pa::store(state, old, st);
  const float s = st.sigma / st.scale;
  for (int i = threadIdx.x; i < B; i += pa::kReduceThreads) out[i] = pa::normalized_reward(r_t[i], discount_t[i], st.mu, s);
}

// ---------------------------------------------------------------------------------------------
// cudarl_popart_rescale: preserve sigma~ (h W + b) + mu across the last update, for a last layer
// as cudarl.nn.Linear stores it, W [n_in, n_out] and b [n_out] (one factor for every weight, so the
// layout only decides which n_out floats are the bias):
//   W <- W sigma_prev / sigma;  b <- (s_prev b + mu_prev - mu) / s   (s = sigma / scale)
// When the statistics did not move (frozen, agent.popart_warmup) W and b are left as they are: the
// affine map is the identity, and (s b) / s would round b. Threads: one per element of W (those
// with index < n_out also do b); grid.y = members (W and bias s_w apart: rows of stacked parameters).
// Reads/writes W and b once.
extern "C" __global__ void cudarl_popart_rescale(float* __restrict__ W, float* __restrict__ bias,
                                                 const float* __restrict__ state, int n_in, int n_out, long long s_w) {
  const long long mb = blockIdx.y;
  W += mb * s_w;
  bias += mb * s_w;
  state += mb * pa::STATE_SIZE;
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long n = (long long)n_in * n_out;
  const float scale = state[pa::SCALE];
  const float s = state[pa::SIGMA] / scale, s_prev = state[pa::SIGMA_PREV] / scale;
  if (s == s_prev && state[pa::MU] == state[pa::MU_PREV]) return;
  if (i < n) W[i] = W[i] * (s_prev / s);
  if (i < n_out) bias[i] = (s_prev * bias[i] + state[pa::MU_PREV] - state[pa::MU]) / s;
}

// ---------------------------------------------------------------------------------------------
// cudarl_popart_normalize: out = (x - mu) / s (inverse = 0) or out = s x + mu (inverse = 1).
// Threads: one per element; grid.y = members (x and out s_x apart). Reads n + 3 floats; writes n.
extern "C" __global__ void cudarl_popart_normalize(const float* __restrict__ x, const float* __restrict__ state,
                                                   float* __restrict__ out, long long n, int inverse, long long s_x) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const long long mb = blockIdx.y;
  x += mb * s_x;
  out += mb * s_x;
  state += mb * pa::STATE_SIZE;
  const float s = state[pa::SIGMA] / state[pa::SCALE], mu = state[pa::MU];
  out[i] = inverse ? s * x[i] + mu : (x[i] - mu) / s;
}

// ---------------------------------------------------------------------------------------------
// cudarl_popart_normalize_rewards: rewards for a target in normalised coordinates.
//   (r + d (s z + mu) - mu) / s = (r - (1 - d) mu) / s + d z,  so  r~ = (r - (1 - d) mu) / s
// and the discount is unchanged: feed r~ to the C51 projection or the quantile targets.
// Threads: one per sample; grid.y = members. Reads 2B + 3 floats; writes B.
extern "C" __global__ void cudarl_popart_normalize_rewards(const float* __restrict__ r_t, const float* __restrict__ discount_t,
                                                           const float* __restrict__ state, float* __restrict__ out, int B,
                                                           long long s_b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B) return;
  const long long mb = blockIdx.y;
  r_t += mb * s_b;
  discount_t += mb * s_b;
  out += mb * s_b;
  state += mb * pa::STATE_SIZE;
  const float s = state[pa::SIGMA] / state[pa::SCALE], mu = state[pa::MU];
  out[i] = pa::normalized_reward(r_t[i], discount_t[i], mu, s);
}

// ---------------------------------------------------------------------------------------------
// cudarl_popart_td_targets: return-space TD targets y = r + d (s v_hat + mu) from normalised
// next-state values v_hat [B] (E_p[z] for C51, the quantile mean for IQN/QR). One per sample;
// grid.y = members.
extern "C" __global__ void cudarl_popart_td_targets(const float* __restrict__ r_t, const float* __restrict__ discount_t,
                                                    const float* __restrict__ v_hat, const float* __restrict__ state,
                                                    float* __restrict__ out, int B, long long s_b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B) return;
  const long long mb = blockIdx.y;
  r_t += mb * s_b;
  discount_t += mb * s_b;
  v_hat += mb * s_b;
  out += mb * s_b;
  state += mb * pa::STATE_SIZE;
  const float s = state[pa::SIGMA] / state[pa::SCALE], mu = state[pa::MU];
  out[i] = pa::td_target(r_t[i], discount_t[i], v_hat[i], mu, s);
}
