// agent: the small glue of the collect step. Twin: cudarl/reference/agent.py.
// Launchers: cudarl/ops/agent.py.
#include <cudarl/act.cuh>
#include <cudarl/dueling.cuh>
#include <cudarl/softmax.cuh>

// The mean over n = 0..N-1 of theta[b, n, a], summed in that order (the twin's sequential sum).
__device__ __forceinline__ float quantile_mean_at(const float* __restrict__ theta, long long b, int a, int N, int A) {
  float s = 0.0f;
  for (int n = 0; n < N; ++n) s += theta[(b * N + n) * A + a];
  return s / (float)N;
}

// quantile_mean: q[b, a] = (1/N) sum_n theta[b, n, a], the expected Q of IQN quantiles, summed
// in order n = 0..N-1 (so the float32 result matches the twin's sequential sum). One thread per
// (b, a). Reads B*N*A floats, writes B*A.
extern "C" __global__ void cudarl_agent_quantile_mean(float* __restrict__ q, const float* __restrict__ theta,
                                                      int B, int N, int A) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B * A) return;
  q[i] = quantile_mean_at(theta, i / A, i % A, N, A);
}

// discount: out[i] = gamma * (1 - done[i]), gamma read from device memory (a device scalar the
// host may move between replays). One thread per row; reads 4n+4 bytes, writes 4n.
extern "C" __global__ void cudarl_agent_discount(float* __restrict__ out, const float* __restrict__ done,
                                                 const float* __restrict__ gamma, long long n) {
  const float g = *gamma;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = g * (1.0f - done[i]);
}

// epsilon: the linear exploration schedule on the device. With c = *count:
//   eps = start + (end - start) * min(c, steps) / steps;  then *count = c + 1.
// One thread; computed in double and rounded once, like the twin (cudarl::epsilon_at, act.cuh).
extern "C" __global__ void cudarl_agent_epsilon(float* __restrict__ eps, long long* __restrict__ count,
                                                double start, double end, long long steps) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const long long c = *count;
  *eps = cudarl::epsilon_at(c, start, end, steps);
  *count = c + 1;
}

// The tail of the fused act kernels: the block that arrives last (cudarl::last_block on the
// integer ticket *arrivals, 0 at launch and left 0) advances the epsilon schedule, *eps_out = eps
// and *count = c + 1, what the epsilon kernel does; every block read *count before its ticket.
// Call from every thread of every block.
__device__ __forceinline__ void advance_epsilon(float eps, long long c, float* __restrict__ eps_out,
                                                long long* __restrict__ count, unsigned int* __restrict__ arrivals) {
  if (cudarl::last_block(arrivals) && threadIdx.x == 0) {
    *eps_out = eps;
    *count = c + 1;
  }
}

// The parameters every fused act kernel ends with: the epsilon schedule's output, its step counter
// and the ticket counter (advance_epsilon), the schedule's constants, the envs' Philox seed.
#define ACT_SCHEDULE_PARAMS                                                                            \
  float *__restrict__ eps_out, long long *__restrict__ count, unsigned int *__restrict__ arrivals, \
      double start, double end, long long steps, unsigned long long seed

// One env's C51 act from its logits (logit(a, k), a pure function): q[i, a] = sum_k softmax(logits[i,
// a])_k z_k (warp_softmax_visit_at and the statement of qstats.per_sample: the same bits), then
// actions[i] = epsilon_greedy(q[i], eps, env_count[i]) (env.act's rule and Philox draws). A warp:
// lanes over atoms; lane 0 writes q[i] and chooses.
template <class Logit>
__device__ __forceinline__ void act_c51_env(int* __restrict__ actions, float* __restrict__ q,
                                            const float* __restrict__ support,
                                            const unsigned long long* __restrict__ env_count, long long i, int A,
                                            int K, int lane, float eps, unsigned long long seed, Logit&& logit) {
  for (int a = 0; a < A; ++a) {
    float qa = 0.f;
    cudarl::warp_softmax_visit_at([&](int k) { return logit(a, k); }, K, lane,
                                  [&](int k, float, float p) { qa += p * support[k]; });
    qa = cudarl::warp_sum(qa);
    if (lane == 0) q[i * A + a] = qa;
  }
  if (lane == 0) actions[i] = cudarl::epsilon_greedy(q + i * A, A, eps, seed, env_count[i], i);
}

// act_c51: a C51 agent's act phase after the online forward, in one launch (it was three:
// qstats.per_sample, epsilon, env.act). With c = *count and eps = epsilon_at(c): act_c51_env over
// logits [n, A, K], then advance_epsilon. Thread mapping: a warp per env. Reads A*K + K floats and
// 8 bytes per env, 8 bytes of count; writes 4A + 4 bytes.
extern "C" __global__ void cudarl_agent_act_c51(int* __restrict__ actions, float* __restrict__ q,
                                                const float* __restrict__ logits, const float* __restrict__ support,
                                                const unsigned long long* __restrict__ env_count, int n, int A, int K,
                                                ACT_SCHEDULE_PARAMS) {
  const long long c = *count;
  const float eps = cudarl::epsilon_at(c, start, end, steps);
  const int lane = threadIdx.x & 31;
  const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (i < n) {  // whole warps: blockDim is a multiple of 32
    const float* row = logits + i * A * K;
    act_c51_env(actions, q, support, env_count, i, A, K, lane, eps, seed, [&](int a, int k) { return row[a * K + k]; });
  }
  advance_epsilon(eps, c, eps_out, count, arrivals);
}

// act_c51_dueling: act_c51 from the dueling head's raw output va [n, (1 + A) K] (V, then Adv), the
// combine done on the fly: logit(a, k) = dueling_logit(va[i], dueling_mean(va[i], k), a, k), the
// bits of nn.dueling_forward (dueling.cuh), so no logits tensor and no dueling launch (the act
// phase was the dueling kernel, then act_c51). Thread mapping: a warp per env. Reads (1 + A) K + K
// floats (each up to 3A times, from L1) and 8 bytes per env; writes 4A + 4 bytes.
extern "C" __global__ void cudarl_agent_act_c51_dueling(int* __restrict__ actions, float* __restrict__ q,
                                                        const float* __restrict__ va,
                                                        const float* __restrict__ support,
                                                        const unsigned long long* __restrict__ env_count, int n, int A,
                                                        int K, ACT_SCHEDULE_PARAMS) {
  const long long c = *count;
  const float eps = cudarl::epsilon_at(c, start, end, steps);
  const int lane = threadIdx.x & 31;
  const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (i < n) {  // whole warps: blockDim is a multiple of 32
    const float* row = va + i * (1 + A) * K;
    act_c51_env(actions, q, support, env_count, i, A, K, lane, eps, seed, [&](int a, int k) {
      return cudarl::dueling_logit(row, cudarl::dueling_mean(row, A, K, k), a, K, k);
    });
  }
  advance_epsilon(eps, c, eps_out, count, arrivals);
}

// act_iqn: an IQN agent's act phase after the online forward, in one launch (it was three:
// quantile_mean, epsilon, env.act): q[i, a] = quantile_mean_at(theta, i, a) (the bits of
// quantile_mean), actions[i] = epsilon_greedy(q[i], eps, env_count[i]), then advance_epsilon.
// Thread mapping: a thread per env. Reads N*A floats and 8 bytes per env; writes 4A + 4 bytes.
extern "C" __global__ void cudarl_agent_act_iqn(int* __restrict__ actions, float* __restrict__ q,
                                                const float* __restrict__ theta,
                                                const unsigned long long* __restrict__ env_count, int n, int N, int A,
                                                ACT_SCHEDULE_PARAMS) {
  const long long c = *count;
  const float eps = cudarl::epsilon_at(c, start, end, steps);
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    for (int a = 0; a < A; ++a) q[i * A + a] = quantile_mean_at(theta, i, a, N, A);
    actions[i] = cudarl::epsilon_greedy(q + i * A, A, eps, seed, env_count[i], i);
  }
  advance_epsilon(eps, c, eps_out, count, arrivals);
}

// publish: copy this step's loss and gradient norm into slot (*step % slots) of a pinned ring
// (mapped host memory), so the host reads step t - 1 from one slot while step t writes another.
// One thread; reads 16 bytes, writes 8 bytes over the bus.
extern "C" __global__ void cudarl_agent_publish(float* __restrict__ ring, const float* __restrict__ loss,
                                                const float* __restrict__ grad_norm, const long long* __restrict__ step,
                                                int slots) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const long long s = *step % slots;
  ring[2 * s] = *loss;
  ring[2 * s + 1] = *grad_norm;
}

// publish_row: copy this step's n observables (cudarl.stats.StepStats: the Q statistics, the plan
// head's, the offline regularisers' losses) into slot (*step % slots) of a pinned ring, as publish
// does for the loss. One block, a thread per value; reads 4n + 8 bytes, writes 4n over the bus.
extern "C" __global__ void cudarl_agent_publish_row(float* __restrict__ ring, const float* __restrict__ values, int n,
                                                    const long long* __restrict__ step, int slots) {
  const long long s = *step % slots;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ring[s * n + i] = values[i];
}
