// env: N trading environments stepping together, their transitions, and epsilon-greedy acting.
// Twin: cudarl/reference/env.py (the semantics are documented there and in docs/env.md).
// Launchers: cudarl/ops/env.py.
//
// State is struct-of-arrays, all [N]: t (i32), start (i32), steps_left (i32), position (f32),
// hold (i32), count (u64, the env's own step counter and Philox counter). Observations are kept by
// reference, as float32 state rows [rows, 4]: the bar t, the mirror flag, the position,
// min(hold, hold_cap) / hold_cap (cudarl/reference/window.py; the window kernel gathers the features).
//
// Float arithmetic uses __fmul_rn / __fsub_rn / __fdiv_rn so nvcc cannot contract a multiply and
// a subtract into an FMA: each kernel matches the NumPy twin bit for bit. No atomics anywhere.
#include <cudarl/act.cuh>
#include <cudarl/philox.cuh>

using cudarl::below;
using cudarl::lane_of;
using cudarl::u32;
using cudarl::u64;

namespace {

constexpr u32 kStreamReset = 0x656E7630u;    // "env0": reset(), draws 2i and 2i+1
constexpr u32 kStreamEpisode = 0x656E7631u;  // "env1": episode end in step(), draw i
// "env2", act()'s stream, is cudarl::kStreamAct (act.cuh): the fused act kernels draw it too.
constexpr int kStateDim = 4;  // cudarl.reference.window.STATE_DIM

// cudarl.costs.bar_net_return in float32: p * ret - rate * |p - prev|, rounded op by op.
__device__ __forceinline__ float bar_reward(float prev, float p, float ret, float rate) {
  return __fsub_rn(__fmul_rn(p, ret), __fmul_rn(rate, fabsf(__fsub_rn(p, prev))));
}

__device__ __forceinline__ float hold_feature(int hold, int hold_cap) {
  return __fdiv_rn((float)min(hold, hold_cap), (float)hold_cap);
}

__device__ __forceinline__ int clamp_action(int a, int n_actions) { return a < 0 ? 0 : (a >= n_actions ? n_actions - 1 : a); }

// One state row: the bar (an exact float32 integer below 2**24), the mirror flag, the position, the hold fraction.
__device__ __forceinline__ void write_state_row(float* __restrict__ dst, int bar, bool mirror, float position,
                                                float hold_f) {
  dst[0] = (float)bar;
  dst[1] = mirror ? 1.0f : 0.0f;
  dst[2] = position;
  dst[3] = hold_f;
}

}  // namespace

// reset: every env starts a new episode and writes its observation's state row.
// Thread mapping: one thread per env. Reads 8 bytes (count) per env; writes 20 + 16 bytes per env.
extern "C" __global__ void cudarl_env_reset(int* __restrict__ t, int* __restrict__ start, int* __restrict__ steps_left,
                                            float* __restrict__ position, int* __restrict__ hold,
                                            const u64* __restrict__ count, float* __restrict__ rows, int n_envs,
                                            int t_begin, int n_starts, int episode_len, int hold_cap, int stagger,
                                            u64 seed) {
  const long long gi = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (gi >= n_envs) return;
  const int i = (int)gi;
  const uint4 blk = cudarl::philox_block(seed, count[i], kStreamReset, (u32)(i >> 1));
  const u32 k = 2u * (u32)(i & 1);
  const int s = t_begin + below(lane_of(blk, k), n_starts);
  const int len = stagger ? 1 + below(lane_of(blk, k + 1), episode_len) : episode_len;
  t[i] = s;
  start[i] = s;
  steps_left[i] = len;
  position[i] = 0.0f;
  hold[i] = 0;
  write_state_row(rows + (long long)i * kStateDim, s, false, 0.0f, hold_feature(0, hold_cap));
}

// step: move to the target position, earn the reward, advance a bar, reset ended episodes.
// Thread mapping: one thread per env. Reads per env: the state (28 bytes), action, scale, ret[t],
// levels[a]; writes the state, reward, done and the 16-byte state row.
extern "C" __global__ void cudarl_env_step(int* __restrict__ t, int* __restrict__ start, int* __restrict__ steps_left,
                                           float* __restrict__ position, int* __restrict__ hold,
                                           u64* __restrict__ count, float* __restrict__ rows,
                                           float* __restrict__ reward, float* __restrict__ done,
                                           const int* __restrict__ actions, const float* __restrict__ scale,
                                           const float* __restrict__ ret, const float* __restrict__ levels,
                                           int n_envs, int n_actions, int t_begin, int n_starts, int episode_len,
                                           int hold_cap, float rate, u64 seed) {
  const long long gi = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (gi >= n_envs) return;
  const int i = (int)gi;
  const int a = clamp_action(actions[i], n_actions);
  const float prev = position[i];
  const float p = __fmul_rn(levels[a], scale[i]);
  const int t0 = t[i];
  const float r = bar_reward(prev, p, ret[t0], rate);
  int h = (p == prev) ? hold[i] + 1 : 1;
  int t1 = t0 + 1;
  int left = steps_left[i] - 1;
  int s = start[i];
  float p1 = p;
  const u64 c = count[i] + 1;
  const bool ended = (left == 0);
  if (ended) {
    const uint4 blk = cudarl::philox_block(seed, c, kStreamEpisode, (u32)(i >> 2));
    s = t_begin + below(lane_of(blk, (u32)(i & 3)), n_starts);
    t1 = s;
    left = episode_len;
    p1 = 0.0f;
    h = 0;
  }
  t[i] = t1;
  start[i] = s;
  steps_left[i] = left;
  position[i] = p1;
  hold[i] = h;
  count[i] = c;
  reward[i] = r;
  done[i] = ended ? 1.0f : 0.0f;
  write_state_row(rows + (long long)i * kStateDim, t1, false, p1, hold_feature(h, hold_cap));
}

// record: the transitions of the coming step, read from the state before step() runs.
// Row g * N + i is group g of env i: 0 real, 1 .. A-1 counterfactual action (a + g) % A (when
// counterfactual != 0), last the directional mirror (when mirror != 0): return-sign columns
// times sign[], positions and the market return negated, action A-1-a, reward computed in the
// mirrored market; its state rows carry the mirror flag (the window gather negates the return-sign
// columns). Thread mapping: one thread per row (g, i), g = row / N. Reads per row the state,
// ret[t], levels[a]; writes 2 state rows (32 bytes) + 12 bytes.
extern "C" __global__ void cudarl_env_record(float* __restrict__ obs_out, int* __restrict__ action_out,
                                             float* __restrict__ reward_out, float* __restrict__ next_obs_out,
                                             float* __restrict__ done_out, const int* __restrict__ t,
                                             const int* __restrict__ steps_left, const float* __restrict__ position,
                                             const int* __restrict__ hold, const int* __restrict__ actions,
                                             const float* __restrict__ scale, const float* __restrict__ ret,
                                             const float* __restrict__ levels, int n_envs, int n_actions,
                                             int hold_cap, float rate, int counterfactual, int mirror) {
  const int n_groups = 1 + (counterfactual ? n_actions - 1 : 0) + (mirror ? 1 : 0);
  const long long gw = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (gw >= (long long)n_envs * n_groups) return;
  const int g = (int)(gw / n_envs), i = (int)(gw % n_envs);
  const bool mirrored = mirror && g == n_groups - 1;
  const int a_real = clamp_action(actions[i], n_actions);
  const int a = mirrored ? n_actions - 1 - a_real : (a_real + g) % n_actions;
  const int t0 = t[i], h = hold[i];
  const float p = __fmul_rn(levels[a], scale[i]);
  const float prev = mirrored ? -position[i] : position[i];
  const float r_t = mirrored ? -ret[t0] : ret[t0];
  const int h_next = (p == prev) ? h + 1 : 1;
  const long long row = (long long)g * n_envs + i;
  action_out[row] = a;
  reward_out[row] = bar_reward(prev, p, r_t, rate);
  done_out[row] = steps_left[i] == 1 ? 1.0f : 0.0f;
  write_state_row(obs_out + row * kStateDim, t0, mirrored, prev, hold_feature(h, hold_cap));
  write_state_row(next_obs_out + row * kStateDim, t0 + 1, mirrored, p, hold_feature(h_next, hold_cap));
}

// act: epsilon-greedy actions (cudarl::epsilon_greedy, act.cuh: the rule agent.cu's fused act
// kernels apply too). Thread mapping: one thread per env. Reads 4A bytes of Q, the env's counter
// (8 bytes) and epsilon (4 bytes, device memory so a replay sees updates); writes 4 bytes.
extern "C" __global__ void cudarl_env_act(int* __restrict__ actions, const float* __restrict__ q,
                                          const float* __restrict__ epsilon, const u64* __restrict__ count,
                                          int n_envs, int n_actions, u64 seed) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_envs) return;
  actions[i] = cudarl::epsilon_greedy(q + i * n_actions, n_actions, *epsilon, seed, count[i], i);
}
