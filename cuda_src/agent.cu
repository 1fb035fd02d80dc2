// agent: the small glue of the collect step. Twin: cudarl/reference/agent.py.
// Launchers: cudarl/ops/agent.py.
//
// The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 5b):
// the fused act kernels, epsilon, publish and publish_row take blockIdx.y as the member mb. Each row
// family advances by mb times its stride argument (elements): the per-env vectors (actions,
// env_count) by sn; q by sq; the head's output (logits, va, theta) by sl; the support by sz (0: one
// support for every member); publish_row's values by sv (its ring, [P, slots * n] C-contiguous, and
// publish's, [P, 2 * slots], by their own sizes); each device scalar (eps, count, arrivals, seed,
// loss, grad_norm, step) by 1: [P] arrays. The Philox key is the member's seed[mb] (the env's own, a
// device scalar), so a member draws what the agent alone draws whatever P or its index. The last-block
// ticket is per member (each counts its member's gridDim.x blocks). The x grid, the block and each
// thread's work and order are the single launch's, so member mb gets the bits of a single launch on
// its rows; one member (gridDim.y = 1, mb = 0: every offset zero) is the single launch. The by-value
// constants (the schedule's start, end and steps, the risk mode, alpha and lam, the shapes) are one
// value for every member of a launch; act_c51_dueling_members takes each member's epsilon schedule as
// [P] arrays (ACT_SCHEDULE_TABLE_PARAMS).
#include <cudarl/act.cuh>
#include <cudarl/units.cuh>
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
#if CUDARL_UNIT_IS(quantile_mean)
extern "C" __global__ void cudarl_agent_quantile_mean(float* __restrict__ q, const float* __restrict__ theta,
                                                      int B, int N, int A) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B * A) return;
  q[i] = quantile_mean_at(theta, i / A, i % A, N, A);
}
#endif  // quantile_mean

// discount: out[i] = gamma * (1 - done[i]), gamma read from device memory (a device scalar the
// host may move between replays). One thread per row; reads 4n+4 bytes, writes 4n.
#if CUDARL_UNIT_IS(discount)
extern "C" __global__ void cudarl_agent_discount(float* __restrict__ out, const float* __restrict__ done,
                                                 const float* __restrict__ gamma, long long n) {
  const float g = *gamma;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = g * (1.0f - done[i]);
}
#endif  // discount

// epsilon: the linear exploration schedule on the device. With c = *count:
//   eps = start + (end - start) * min(c, steps) / steps;  then *count = c + 1.
// One thread a member (block (0, mb): eps and count [P]); computed in double and rounded once, like
// the twin (cudarl::epsilon_at, act.cuh).
#if CUDARL_UNIT_IS(epsilon)
extern "C" __global__ void cudarl_agent_epsilon(float* __restrict__ eps, long long* __restrict__ count,
                                                double start, double end, long long steps) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  eps += blockIdx.y;
  count += blockIdx.y;
  const long long c = *count;
  *eps = cudarl::epsilon_at(c, start, end, steps);
  *count = c + 1;
}
#endif  // epsilon

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
// and the ticket counter (advance_epsilon), the schedule's constants, the envs' Philox seed (a device
// scalar), and the member strides of the per-env vectors, q and the head's output.
#define ACT_SCHEDULE_PARAMS                                                                            \
  float *__restrict__ eps_out, long long *__restrict__ count, unsigned int *__restrict__ arrivals, \
      double start, double end, long long steps, const unsigned long long *__restrict__ seed, long long sn, \
      long long sq, long long sl

// ACT_SCHEDULE_PARAMS with each member's schedule constants as [P] arrays (the act kernels' _members
// variants: members with their own epsilon schedules).
#define ACT_SCHEDULE_TABLE_PARAMS                                                                            \
  float *__restrict__ eps_out, long long *__restrict__ count, unsigned int *__restrict__ arrivals,         \
      const double *__restrict__ start, const double *__restrict__ end, const long long *__restrict__ steps, \
      const unsigned long long *__restrict__ seed, long long sn, long long sq, long long sl

// The member's rows and scalars (mb = blockIdx.y), then its schedule: c = *count, eps = epsilon_at(c).
// Every fused act kernel starts with it (head: its head's output pointer); the Philox key *seed is
// read where an action is chosen (not held in registers across the Q loop).
#define ACT_MEMBER(head)                                          \
  const long long mb = blockIdx.y;                                \
  actions += mb * sn;                                             \
  env_count += mb * sn;                                           \
  q += mb * sq;                                                   \
  head += mb * sl;                                                \
  eps_out += mb;                                                  \
  count += mb;                                                    \
  arrivals += mb;                                                 \
  const long long c = *count;                                     \
  const float eps = cudarl::epsilon_at(c, start, end, steps);     \
  seed += mb

// One env's C51 act from its logits (logit(a, k), a pure function): q[i, a] = sum_k softmax(logits[i,
// a])_k z_k (warp_softmax_visit_at and the statement of qstats.per_sample: the same bits), then
// actions[i] = epsilon_greedy(q[i], eps, env_count[i]) (env.act's rule and Philox draws). A warp:
// lanes over atoms; lane 0 writes q[i] and chooses.
template <class Logit>
__device__ __forceinline__ void act_c51_env(int* __restrict__ actions, float* __restrict__ q,
                                            const float* __restrict__ support,
                                            const unsigned long long* __restrict__ env_count, long long i, int A,
                                            int K, int lane, float eps, const unsigned long long* __restrict__ seed,
                                            Logit&& logit) {
  for (int a = 0; a < A; ++a) {
    float qa = 0.f;
    cudarl::warp_softmax_visit_at([&](int k) { return logit(a, k); }, K, lane,
                                  [&](int k, float, float p) { qa += p * support[k]; });
    qa = cudarl::warp_sum(qa);
    if (lane == 0) q[i * A + a] = qa;
  }
  if (lane == 0) actions[i] = cudarl::epsilon_greedy(q + i * A, A, eps, *seed, env_count[i], i);
}

// act_c51: a C51 agent's act phase after the online forward, in one launch (it was three:
// qstats.per_sample, epsilon, env.act). With c = *count and eps = epsilon_at(c): act_c51_env over
// logits [n, A, K], then advance_epsilon. Thread mapping: a warp per env. Reads A*K + K floats and
// 8 bytes per env, 8 bytes of count; writes 4A + 4 bytes.
#if CUDARL_UNIT_IS(act_c51)
extern "C" __global__ void cudarl_agent_act_c51(int* __restrict__ actions, float* __restrict__ q,
                                                const float* __restrict__ logits, const float* __restrict__ support,
                                                const unsigned long long* __restrict__ env_count, int n, int A, int K,
                                                long long sz, ACT_SCHEDULE_PARAMS) {
  ACT_MEMBER(logits);
  support += mb * sz;
  const int lane = threadIdx.x & 31;
  const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (i < n) {  // whole warps: blockDim is a multiple of 32
    const float* row = logits + i * A * K;
    act_c51_env(actions, q, support, env_count, i, A, K, lane, eps, seed, [&](int a, int k) { return row[a * K + k]; });
  }
  advance_epsilon(eps, c, eps_out, count, arrivals);
}
#endif  // act_c51

// act_c51_dueling: act_c51 from the dueling head's raw output va [n, (1 + A) K] (V, then Adv), the
// combine done on the fly: logit(a, k) = dueling_logit(va[i], dueling_mean(va[i], k), a, k), the
// bits of nn.dueling_forward (dueling.cuh), so no logits tensor and no dueling launch (the act
// phase was the dueling kernel, then act_c51). Thread mapping: a warp per env. Reads (1 + A) K + K
// floats (each up to 3A times, from L1) and 8 bytes per env; writes 4A + 4 bytes.
__device__ __forceinline__ void act_c51_dueling_impl(int* __restrict__ actions, float* __restrict__ q,
                                                     const float* __restrict__ va, const float* __restrict__ support,
                                                     const unsigned long long* __restrict__ env_count, int n, int A,
                                                     int K, long long sz, ACT_SCHEDULE_PARAMS) {
  ACT_MEMBER(va);
  support += mb * sz;
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

#if CUDARL_UNIT_IS(act_c51_dueling)
extern "C" __global__ void cudarl_agent_act_c51_dueling(int* __restrict__ actions, float* __restrict__ q,
                                                        const float* __restrict__ va,
                                                        const float* __restrict__ support,
                                                        const unsigned long long* __restrict__ env_count, int n, int A,
                                                        int K, long long sz, ACT_SCHEDULE_PARAMS) {
  act_c51_dueling_impl(actions, q, va, support, env_count, n, A, K, sz, eps_out, count, arrivals, start, end, steps,
                       seed, sn, sq, sl);
}
#endif  // act_c51_dueling

// act_c51_dueling_members: act_c51_dueling whose members each run their own epsilon schedule: start,
// end (double) and steps (long long) are [P] arrays, member mb reading element mb (act_c51_dueling's
// by-value types), so member mb gets the bits of act_c51_dueling launched alone with its schedule.
// Reads 24 bytes a member more.
#if CUDARL_UNIT_IS(act_c51_dueling_members)
extern "C" __global__ void cudarl_agent_act_c51_dueling_members(int* __restrict__ actions, float* __restrict__ q,
                                                                const float* __restrict__ va,
                                                                const float* __restrict__ support,
                                                                const unsigned long long* __restrict__ env_count,
                                                                int n, int A, int K, long long sz,
                                                                ACT_SCHEDULE_TABLE_PARAMS) {
  const long long mb = blockIdx.y;
  act_c51_dueling_impl(actions, q, va, support, env_count, n, A, K, sz, eps_out, count, arrivals, start[mb], end[mb],
                       steps[mb], seed, sn, sq, sl);
}
#endif  // act_c51_dueling_members

// act_iqn: an IQN agent's act phase after the online forward, in one launch (it was three:
// quantile_mean, epsilon, env.act): q[i, a] = quantile_mean_at(theta, i, a) (the bits of
// quantile_mean), actions[i] = epsilon_greedy(q[i], eps, env_count[i]), then advance_epsilon.
// Thread mapping: a thread per env. Reads N*A floats and 8 bytes per env; writes 4A + 4 bytes.
#if CUDARL_UNIT_IS(act_iqn)
extern "C" __global__ void cudarl_agent_act_iqn(int* __restrict__ actions, float* __restrict__ q,
                                                const float* __restrict__ theta,
                                                const unsigned long long* __restrict__ env_count, int n, int N, int A,
                                                ACT_SCHEDULE_PARAMS) {
  ACT_MEMBER(theta);
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    for (int a = 0; a < A; ++a) q[i * A + a] = quantile_mean_at(theta, i, a, N, A);
    actions[i] = cudarl::epsilon_greedy(q + i * A, A, eps, *seed, env_count[i], i);
  }
  advance_epsilon(eps, c, eps_out, count, arrivals);
}
#endif  // act_iqn

// --- risk-sensitive acting (agent.act_by: cudarl.config.ACT_BY) -----------------------------------
// mode 1 (cvar): the mean of the lower alpha tail of the return distribution; mode 2 (mean_std): its
// mean minus lam standard deviations. (Mode 0, the mean, is the kernels above, untouched.)
#define RISK_CVAR 1
#define RISK_MEAN_STD 2

// A C51 row's risk measure, a warp over its K atoms (ascending support z), on every lane. The softmax
// p_k = exp(x_k - m - log sum_j exp(x_j - m)) (warp_softmax_visit's statement), then
//   cvar:     (1/alpha) sum_k z_k clamp(alpha - F_k, 0, p_k),  F_k = p_0 + ... + p_{k-1} (a warp scan per
//             chunk of 32 atoms, carried across chunks): the boundary atom counts with the part of its
//             mass below alpha;
//   mean_std: mu - lam sqrt(sum_k p_k (z_k - mu)^2),  mu = sum_k p_k z_k.
// Call with all 32 lanes.
__device__ __forceinline__ float c51_risk_at(const float* __restrict__ x, const float* __restrict__ z, int K, int lane,
                                             int mode, float alpha, float lam) {
  float mx = __int_as_float((int)0xff800000u);  // -inf
  for (int k = lane; k < K; k += 32) mx = fmaxf(mx, x[k]);
  mx = cudarl::warp_max(mx);
  float s = 0.f;
  for (int k = lane; k < K; k += 32) s += expf(x[k] - mx);
  const float log_s = logf(cudarl::warp_sum(s));
  if (mode == RISK_CVAR) {
    float carry = 0.f, acc = 0.f;
    for (int base = 0; base < K; base += 32) {
      const int k = base + lane;
      const float p = k < K ? expf(x[k] - mx - log_s) : 0.f;
      float incl = p;  // inclusive scan over the chunk's lanes
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      float excl = __shfl_up_sync(0xffffffffu, incl, 1);
      if (lane == 0) excl = 0.f;
      if (k < K) acc += z[k] * fminf(fmaxf(alpha - (carry + excl), 0.f), p);
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    return cudarl::warp_sum(acc) / alpha;
  }
  float mu = 0.f;
  for (int k = lane; k < K; k += 32) mu += expf(x[k] - mx - log_s) * z[k];
  mu = cudarl::warp_sum(mu);
  float var = 0.f;
  for (int k = lane; k < K; k += 32) {
    const float d = z[k] - mu;
    var += expf(x[k] - mx - log_s) * (d * d);
  }
  return mu - lam * sqrtf(cudarl::warp_sum(var));
}

// A quantile row's risk measure over theta[b, 0..N-1, a] (one thread):
//   cvar:     sum_n w_n theta_n / (alpha N),  w_n = clamp(alpha N - n, 0, 1): quantile n stands for the
//             fractions [n/N, (n+1)/N) (QR-DQN's fixed midpoints), the part of them below alpha;
//   mean_std: mu - lam sqrt(sum_n (theta_n - mu)^2 / N),  mu = quantile_mean_at (summed in order).
__device__ __forceinline__ float quantile_risk_at(const float* __restrict__ theta, long long b, int a, int N, int A,
                                                  int mode, float alpha, float lam) {
  if (mode == RISK_CVAR) {
    const float an = alpha * (float)N;
    float s = 0.f;
    for (int n = 0; n < N; ++n) s += fminf(fmaxf(an - (float)n, 0.f), 1.f) * theta[(b * N + n) * A + a];
    return s / an;
  }
  const float mu = quantile_mean_at(theta, b, a, N, A);
  float var = 0.f;
  for (int n = 0; n < N; ++n) {
    const float d = theta[(b * N + n) * A + a] - mu;
    var += d * d;
  }
  return mu - lam * sqrtf(var / (float)N);
}

// c51_risk: q[i, a] = c51_risk_at(logits[i, a]) (mode 1 or 2), the values evaluation and a policy act
// on. A warp per row i, lanes over atoms. Reads A*K + K floats a row, writes 4A bytes.
#if CUDARL_UNIT_IS(c51_risk)
extern "C" __global__ void cudarl_agent_c51_risk(float* __restrict__ q, const float* __restrict__ logits,
                                                 const float* __restrict__ support, int n, int A, int K, int mode,
                                                 float alpha, float lam) {
  const int lane = threadIdx.x & 31;
  const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (i >= n) return;  // whole warps leave together
  for (int a = 0; a < A; ++a) {
    const float v = c51_risk_at(logits + (i * A + a) * K, support, K, lane, mode, alpha, lam);
    if (lane == 0) q[i * A + a] = v;
  }
}
#endif  // c51_risk

// quantile_risk: q[b, a] = quantile_risk_at(theta, b, a) (mode 1 or 2). One thread per (b, a); reads
// N floats, writes 4 bytes.
#if CUDARL_UNIT_IS(quantile_risk)
extern "C" __global__ void cudarl_agent_quantile_risk(float* __restrict__ q, const float* __restrict__ theta, int B,
                                                      int N, int A, int mode, float alpha, float lam) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B * A) return;
  q[i] = quantile_risk_at(theta, i / A, i % A, N, A, mode, alpha, lam);
}
#endif  // quantile_risk

// cvar_taus: tau[i] = alpha * tau[i], IQN's acting fractions drawn uniform in [0, 1) mapped into
// [0, alpha) (the CVaR distortion of Dabney et al. 2018): the mean of the quantiles at them is a sample
// estimate of CVaR_alpha. Grid-stride; reads and writes 4 bytes an element.
#if CUDARL_UNIT_IS(cvar_taus)
extern "C" __global__ void cudarl_agent_cvar_taus(float* __restrict__ tau, float alpha, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    tau[i] = alpha * tau[i];
}
#endif  // cvar_taus

// act_c51_risk: act_c51 with q = c51_risk's (mode 1 or 2): the same bits as c51_risk, then
// epsilon_greedy and advance_epsilon as act_c51. A warp per env.
#if CUDARL_UNIT_IS(act_c51_risk)
extern "C" __global__ void cudarl_agent_act_c51_risk(int* __restrict__ actions, float* __restrict__ q,
                                                     const float* __restrict__ logits,
                                                     const float* __restrict__ support,
                                                     const unsigned long long* __restrict__ env_count, int n, int A,
                                                     int K, int mode, float alpha, float lam, long long sz,
                                                     ACT_SCHEDULE_PARAMS) {
  ACT_MEMBER(logits);
  support += mb * sz;
  const int lane = threadIdx.x & 31;
  const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (i < n) {
    for (int a = 0; a < A; ++a) {
      const float v = c51_risk_at(logits + (i * A + a) * K, support, K, lane, mode, alpha, lam);
      if (lane == 0) q[i * A + a] = v;
    }
    if (lane == 0) actions[i] = cudarl::epsilon_greedy(q + i * A, A, eps, *seed, env_count[i], i);
  }
  advance_epsilon(eps, c, eps_out, count, arrivals);
}
#endif  // act_c51_risk

// act_quantile_risk: act_iqn with q = quantile_risk's (mode 1 or 2). A thread per env.
#if CUDARL_UNIT_IS(act_quantile_risk)
extern "C" __global__ void cudarl_agent_act_quantile_risk(int* __restrict__ actions, float* __restrict__ q,
                                                          const float* __restrict__ theta,
                                                          const unsigned long long* __restrict__ env_count, int n,
                                                          int N, int A, int mode, float alpha, float lam,
                                                          ACT_SCHEDULE_PARAMS) {
  ACT_MEMBER(theta);
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    for (int a = 0; a < A; ++a) q[i * A + a] = quantile_risk_at(theta, i, a, N, A, mode, alpha, lam);
    actions[i] = cudarl::epsilon_greedy(q + i * A, A, eps, *seed, env_count[i], i);
  }
  advance_epsilon(eps, c, eps_out, count, arrivals);
}
#endif  // act_quantile_risk

// publish: copy this step's loss and gradient norm into slot (*step % slots) of a pinned ring
// (mapped host memory), so the host reads step t - 1 from one slot while step t writes another.
// One thread a member (block (0, mb): its ring [2 * slots] of a C-contiguous [P, 2 * slots], loss,
// grad_norm and step [P]); reads 16 bytes, writes 8 bytes over the bus.
#if CUDARL_UNIT_IS(publish)
extern "C" __global__ void cudarl_agent_publish(float* __restrict__ ring, const float* __restrict__ loss,
                                                const float* __restrict__ grad_norm, const long long* __restrict__ step,
                                                int slots) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const long long mb = blockIdx.y;
  ring += mb * 2 * slots;
  loss += mb;
  grad_norm += mb;
  step += mb;
  const long long s = *step % slots;
  ring[2 * s] = *loss;
  ring[2 * s + 1] = *grad_norm;
}
#endif  // publish

// publish_row: copy this step's n observables (cudarl.stats.StepStats: the Q statistics, the plan
// head's, the offline regularisers' losses) into slot (*step % slots) of a pinned ring, as publish
// does for the loss. One block a member (block (0, mb): its ring [slots * n] of a C-contiguous
// [P, slots * n], its values sv apart, its step), a thread per value; reads 4n + 8 bytes, writes 4n
// over the bus.
#if CUDARL_UNIT_IS(publish_row)
extern "C" __global__ void cudarl_agent_publish_row(float* __restrict__ ring, const float* __restrict__ values, int n,
                                                    const long long* __restrict__ step, int slots, long long sv) {
  const long long mb = blockIdx.y;
  ring += mb * slots * n;
  values += mb * sv;
  step += mb;
  const long long s = *step % slots;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ring[s * n + i] = values[i];
}
#endif  // publish_row
