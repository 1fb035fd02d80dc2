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
//
// The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 5b):
// reset, step, record_step and act take blockIdx.y as the member mb: P members' N envs each. Each row
// family advances by mb times its stride argument (elements): the per-env vectors (the state's t,
// start, steps_left, position, hold, count; reward, done, actions, scale) by sn; the state rows by sr;
// record_step's observation windows by so, its transition vectors (action, reward, done, discount) by
// sm and its transition state rows (obs, next_obs) by st4; act's Q rows by sq; each device scalar
// (seed, gamma, epsilon) by 1: [P] arrays. The Philox key is the member's seed[mb] (a device scalar,
// the env's own), so a member draws what the env alone draws whatever P or its index. The market
// data (ret, levels, features, sign) is one copy for every member. The x grid, the block and each
// thread's work are the single launch's, so member mb gets the bits of a single launch on its rows;
// one member (gridDim.y = 1, mb = 0: every offset zero) is the single launch. The by-value constants
// (t_begin, n_starts, episode_len, hold_cap, the cost rate, the shapes) are one value for every member
// of a launch; step_members and record_step_members take each member's cost rate and hold cap as [P]
// arrays and its returns and levels as rows. record (the unfused oracle, no draws) has no member axis.
#include <cudarl/act.cuh>
#include <cudarl/philox.cuh>
#include <cudarl/window.cuh>

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
// Thread mapping: one thread per env (blockIdx.y the member). Reads 8 bytes (count) per env; writes
// 20 + 16 bytes per env.
extern "C" __global__ void cudarl_env_reset(int* __restrict__ t, int* __restrict__ start, int* __restrict__ steps_left,
                                            float* __restrict__ position, int* __restrict__ hold,
                                            const u64* __restrict__ count, float* __restrict__ rows, int n_envs,
                                            int t_begin, int n_starts, int episode_len, int hold_cap, int stagger,
                                            const u64* __restrict__ seed, long long sn, long long sr) {
  const long long gi = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (gi >= n_envs) return;
  const int i = (int)gi;
  const long long mb = blockIdx.y, o = mb * sn;
  t += o;
  start += o;
  steps_left += o;
  position += o;
  hold += o;
  count += o;
  rows += mb * sr;
  const uint4 blk = cudarl::philox_block(seed[mb], count[i], kStreamReset, (u32)(i >> 1));
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

// One env's step from its state before it (registers): the new state, the reward, whether the
// episode ended (and was reset). The math of cudarl_env_step; record_step runs it too.
struct StepOut {
  int t, start, steps_left, hold;
  float position, reward;
  u64 count;
  bool ended;
};

__device__ __forceinline__ StepOut step_env(int i, int a, int t0, int s0, int left0, float prev, int hold0, u64 count0,
                                            float scale_i, const float* __restrict__ ret,
                                            const float* __restrict__ levels, int t_begin, int n_starts,
                                            int episode_len, float rate, u64 seed) {
  const float p = __fmul_rn(levels[a], scale_i);
  StepOut o;
  o.reward = bar_reward(prev, p, ret[t0], rate);
  o.hold = (p == prev) ? hold0 + 1 : 1;
  o.t = t0 + 1;
  o.steps_left = left0 - 1;
  o.start = s0;
  o.position = p;
  o.count = count0 + 1;
  o.ended = (o.steps_left == 0);
  if (o.ended) {
    const uint4 blk = cudarl::philox_block(seed, o.count, kStreamEpisode, (u32)(i >> 2));
    o.start = t_begin + below(lane_of(blk, (u32)(i & 3)), n_starts);
    o.t = o.start;
    o.steps_left = episode_len;
    o.position = 0.0f;
    o.hold = 0;
  }
  return o;
}

// Write env i's step: its state, reward, done and its 16-byte state row.
__device__ __forceinline__ void store_step(const StepOut& o, int i, int* __restrict__ t, int* __restrict__ start,
                                           int* __restrict__ steps_left, float* __restrict__ position,
                                           int* __restrict__ hold, u64* __restrict__ count, float* __restrict__ rows,
                                           float* __restrict__ reward, float* __restrict__ done, int hold_cap) {
  t[i] = o.t;
  start[i] = o.start;
  steps_left[i] = o.steps_left;
  position[i] = o.position;
  hold[i] = o.hold;
  count[i] = o.count;
  reward[i] = o.reward;
  done[i] = o.ended ? 1.0f : 0.0f;
  write_state_row(rows + (long long)i * kStateDim, o.t, false, o.position, hold_feature(o.hold, hold_cap));
}

// The member's slice of env step's arrays, as cudarl_env_step and cudarl_env_record_step name them:
// m = member * sn elements into each [P, N] array, mb * sr floats into the state rows. A macro, not a
// function taking the pointers by reference: that form left the registers as they were but let the
// compiler reorder the kernels' integer code (the PTX differed); this one gives the same PTX.
#define ENV_MEMBER_STEP_ARRAYS(mb, m, sr) \
  do {                                    \
    t += (m);                             \
    start += (m);                         \
    steps_left += (m);                    \
    position += (m);                      \
    hold += (m);                          \
    count += (m);                         \
    reward += (m);                        \
    done += (m);                          \
    actions += (m);                       \
    scale += (m);                         \
    rows += (mb) * (sr);                  \
  } while (0)

// step: move to the target position, earn the reward, advance a bar, reset ended episodes.
// Thread mapping: one thread per env (blockIdx.y the member). Reads per env: the state (28 bytes),
// action, scale, ret[t], levels[a]; writes the state, reward, done and the 16-byte state row.
__device__ __forceinline__ void step_impl(int* __restrict__ t, int* __restrict__ start, int* __restrict__ steps_left,
                                          float* __restrict__ position, int* __restrict__ hold,
                                          u64* __restrict__ count, float* __restrict__ rows, float* __restrict__ reward,
                                          float* __restrict__ done, const int* __restrict__ actions,
                                          const float* __restrict__ scale, const float* __restrict__ ret,
                                          const float* __restrict__ levels, int n_envs, int n_actions, int t_begin,
                                          int n_starts, int episode_len, int hold_cap, float rate,
                                          const u64* __restrict__ seed, long long sn, long long sr) {
  const long long gi = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (gi >= n_envs) return;
  const int i = (int)gi;
  const long long mb = blockIdx.y, m = mb * sn;
  ENV_MEMBER_STEP_ARRAYS(mb, m, sr);
  const StepOut o = step_env(i, clamp_action(actions[i], n_actions), t[i], start[i], steps_left[i], position[i],
                             hold[i], count[i], scale[i], ret, levels, t_begin, n_starts, episode_len, rate, seed[mb]);
  store_step(o, i, t, start, steps_left, position, hold, count, rows, reward, done, hold_cap);
}

extern "C" __global__ void cudarl_env_step(int* __restrict__ t, int* __restrict__ start, int* __restrict__ steps_left,
                                           float* __restrict__ position, int* __restrict__ hold,
                                           u64* __restrict__ count, float* __restrict__ rows,
                                           float* __restrict__ reward, float* __restrict__ done,
                                           const int* __restrict__ actions, const float* __restrict__ scale,
                                           const float* __restrict__ ret, const float* __restrict__ levels,
                                           int n_envs, int n_actions, int t_begin, int n_starts, int episode_len,
                                           int hold_cap, float rate, const u64* __restrict__ seed, long long sn,
                                           long long sr) {
  step_impl(t, start, steps_left, position, hold, count, rows, reward, done, actions, scale, ret, levels, n_envs,
            n_actions, t_begin, n_starts, episode_len, hold_cap, rate, seed, sn, sr);
}

// step_members: step whose members each have their own costs and reward options: rates [P] (float,
// step's by-value rate) and hold_caps [P] (int, its hold_cap), member mb reading element mb, and the
// market's returns (ret: the member's fill) and position levels as [P, T] and [P, A] rows (s_ret, s_lv
// their member strides; 0: one array for every member): the bits of step launched alone with its values.
extern "C" __global__ void cudarl_env_step_members(int* __restrict__ t, int* __restrict__ start,
                                                   int* __restrict__ steps_left, float* __restrict__ position,
                                                   int* __restrict__ hold, u64* __restrict__ count,
                                                   float* __restrict__ rows, float* __restrict__ reward,
                                                   float* __restrict__ done, const int* __restrict__ actions,
                                                   const float* __restrict__ scale, const float* __restrict__ ret,
                                                   const float* __restrict__ levels, int n_envs, int n_actions,
                                                   int t_begin, int n_starts, int episode_len,
                                                   const int* __restrict__ hold_caps, const float* __restrict__ rates,
                                                   const u64* __restrict__ seed, long long sn, long long sr,
                                                   long long s_ret, long long s_lv) {
  const long long mb = blockIdx.y;
  step_impl(t, start, steps_left, position, hold, count, rows, reward, done, actions, scale, ret + mb * s_ret,
            levels + mb * s_lv, n_envs, n_actions, t_begin, n_starts, episode_len, hold_caps[mb], rates[mb], seed, sn,
            sr);
}

// Row group g (of n_groups) of env i's transition: group 0 real, 1 .. A-1 counterfactual action
// (a + g) % A (when counterfactual), the last the directional mirror (when mirror): return-sign
// columns times sign[], positions and the market return negated, action A-1-a, reward computed in
// the mirrored market; its state rows carry the mirror flag (the window gather negates the
// return-sign columns). From env i's state before the step (registers). Writes row g * n_envs + i;
// returns its done (1 when the episode ends with this step).
__device__ __forceinline__ float record_row(float* __restrict__ obs_out, int* __restrict__ action_out,
                                            float* __restrict__ reward_out, float* __restrict__ next_obs_out,
                                            float* __restrict__ done_out, int g, int n_groups, int i, int n_envs,
                                            int a_real, int t0, int h, int left0, float position_i, float scale_i,
                                            float ret_t0, const float* __restrict__ levels, int n_actions,
                                            int hold_cap, float rate, int mirror) {
  const bool mirrored = mirror && g == n_groups - 1;
  const int a = mirrored ? n_actions - 1 - a_real : (a_real + g) % n_actions;
  const float p = __fmul_rn(levels[a], scale_i);
  const float prev = mirrored ? -position_i : position_i;
  const float r_t = mirrored ? -ret_t0 : ret_t0;
  const int h_next = (p == prev) ? h + 1 : 1;
  const long long row = (long long)g * n_envs + i;
  const float d = left0 == 1 ? 1.0f : 0.0f;
  action_out[row] = a;
  reward_out[row] = bar_reward(prev, p, r_t, rate);
  done_out[row] = d;
  write_state_row(obs_out + row * kStateDim, t0, mirrored, prev, hold_feature(h, hold_cap));
  write_state_row(next_obs_out + row * kStateDim, t0 + 1, mirrored, p, hold_feature(h_next, hold_cap));
  return d;
}

__device__ __forceinline__ int n_row_groups(int n_actions, int counterfactual, int mirror) {
  return 1 + (counterfactual ? n_actions - 1 : 0) + (mirror ? 1 : 0);
}

// record: the transitions of the coming step, read from the state before step() runs (record_row).
// Thread mapping: one thread per row (g, i), g = row / N. Reads per row the state, ret[t],
// levels[a]; writes 2 state rows (32 bytes) + 12 bytes.
extern "C" __global__ void cudarl_env_record(float* __restrict__ obs_out, int* __restrict__ action_out,
                                             float* __restrict__ reward_out, float* __restrict__ next_obs_out,
                                             float* __restrict__ done_out, const int* __restrict__ t,
                                             const int* __restrict__ steps_left, const float* __restrict__ position,
                                             const int* __restrict__ hold, const int* __restrict__ actions,
                                             const float* __restrict__ scale, const float* __restrict__ ret,
                                             const float* __restrict__ levels, int n_envs, int n_actions,
                                             int hold_cap, float rate, int counterfactual, int mirror) {
  const int n_groups = n_row_groups(n_actions, counterfactual, mirror);
  const long long gw = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (gw >= (long long)n_envs * n_groups) return;
  const int g = (int)(gw / n_envs), i = (int)(gw % n_envs);
  const int t0 = t[i];
  record_row(obs_out, action_out, reward_out, next_obs_out, done_out, g, n_groups, i, n_envs,
             clamp_action(actions[i], n_actions), t0, hold[i], steps_left[i], position[i], scale[i], ret[t0], levels,
             n_actions, hold_cap, rate, mirror);
}

// record_step: the collect step's env work in one launch (it was four: record, step, the window
// gather of the next observation, agent.discount). For env i, from its state before the step:
//   record_row for every row group g (the bits of cudarl_env_record), and
//   discount_out[row] = gamma[0] * (1 - done_out[row])  (the bits of cudarl_agent_discount);
//   step_env / store_step (the bits of cudarl_env_step);
//   obs[i] = the window of the new state row (cudarl::window_value: the bits of cudarl_window_gather).
// Thread mapping: a warp per env (blockDim a multiple of 32; blockIdx.y the member). Every lane reads
// env i's state and computes its step (the same values); __syncwarp orders those reads before lane 0
// writes the state.
// Lane g writes row group g (grid of groups strided by 32); lanes stride over the window's
// window * (F + 2) floats, coalesced. Reads ~40 bytes of state per env, the window's features;
// writes M rows of 44 + 4 bytes, the state (36 bytes) and the window.
//
// The body of record_step and record_step_members, one text for both (rate and hold_cap: by-value in
// both, record_step's arguments, record_step_members' rates[blockIdx.y] and hold_caps[blockIdx.y]). A macro: moved
// into an inline function the body kept its arithmetic but the compiler reordered record_step's address
// code (its PTX differed, nvcc 13.0); the macro leaves record_step's text, and so its PTX, as it was.
#define RECORD_STEP_BODY \
  const int lane = threadIdx.x & 31;                                                                                  \
  const long long gi = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;                                       \
  if (gi >= n_envs) return;  /* the whole warp: its lanes share gi */                                                 \
  const int i = (int)gi;                                                                                              \
  {  /* the member's rows and scalars (member 0: the pointers as given) */                                            \
    const long long mb = blockIdx.y, m = mb * sn;                                                                     \
    obs_out += mb * st4;                                                                                              \
    next_obs_out += mb * st4;                                                                                         \
    action_out += mb * sm;                                                                                            \
    reward_out += mb * sm;                                                                                            \
    done_out += mb * sm;                                                                                              \
    discount_out += mb * sm;                                                                                          \
    gamma += mb;                                                                                                      \
    seed += mb;                                                                                                       \
    ENV_MEMBER_STEP_ARRAYS(mb, m, sr);                                                                                \
    obs += mb * so;                                                                                                   \
  }                                                                                                                   \
  const int a_real = clamp_action(actions[i], n_actions);                                                             \
  const int t0 = t[i], s0 = start[i], left0 = steps_left[i], h0 = hold[i];                                            \
  const float prev = position[i], sc = scale[i];                                                                      \
  const u64 c0 = count[i];                                                                                            \
  __syncwarp();  /* every lane has read the state before lane 0 overwrites it */                                      \
  const int n_groups = n_row_groups(n_actions, counterfactual, mirror);                                               \
  const float g_disc = gamma[0];                                                                                      \
  const float ret_t0 = ret[t0];                                                                                       \
  for (int g = lane; g < n_groups; g += 32) {                                                                         \
    const float d = record_row(obs_out, action_out, reward_out, next_obs_out, done_out, g, n_groups, i, n_envs,       \
                               a_real, t0, h0, left0, prev, sc, ret_t0, levels, n_actions, hold_cap, rate, mirror);   \
    discount_out[(long long)g * n_envs + i] = __fmul_rn(g_disc, __fsub_rn(1.0f, d));                                  \
  }                                                                                                                   \
  const StepOut o =                                                                                                   \
      step_env(i, a_real, t0, s0, left0, prev, h0, c0, sc, ret, levels, t_begin, n_starts, episode_len, rate,         \
               seed[0]);                                                                                              \
  if (lane == 0) store_step(o, i, t, start, steps_left, position, hold, count, rows, reward, done, hold_cap);         \
  const float bar = (float)o.t, hold_f = hold_feature(o.hold, hold_cap); /* store_step's row */                       \
  const int bar_width = n_features + 2, row_width = window * bar_width;                                               \
  float* __restrict__ out = obs + (long long)i * row_width;                                                           \
  for (int e = lane; e < row_width; e += 32) {                                                                        \
    const int w = e / bar_width, col = e - w * bar_width;                                                             \
    out[e] = cudarl::window_value(bar, 0.0f, o.position, hold_f, features, sign, w, col, window, n_features, n_bars); \
  }

extern "C" __global__ void cudarl_env_record_step(
    float* __restrict__ obs_out, int* __restrict__ action_out, float* __restrict__ reward_out,
    float* __restrict__ next_obs_out, float* __restrict__ done_out, float* __restrict__ discount_out,
    const float* __restrict__ gamma, int* __restrict__ t, int* __restrict__ start, int* __restrict__ steps_left,
    float* __restrict__ position, int* __restrict__ hold, u64* __restrict__ count, float* __restrict__ rows,
    float* __restrict__ reward, float* __restrict__ done, float* __restrict__ obs, const int* __restrict__ actions,
    const float* __restrict__ scale, const float* __restrict__ ret, const float* __restrict__ levels,
    const float* __restrict__ features, const float* __restrict__ sign, int n_envs, int n_actions, int t_begin,
    int n_starts, int episode_len, int hold_cap, float rate, const u64* __restrict__ seed, int counterfactual,
    int mirror, int window, int n_features, long long n_bars, long long sn, long long sr, long long so, long long sm,
    long long st4) {
  RECORD_STEP_BODY
}

// record_step_members: record_step whose members each have their own costs and reward options: rates
// [P] (float, record_step's by-value rate: env.cost_bps + env.slippage_bps + agent.train_cost_bps) and
// hold_caps [P] (int, its hold_cap), member mb reading element mb, and the market's returns (ret: the
// member's env.fill) and position levels (env.levels) as [P, T] and [P, A] rows (s_ret, s_lv their member
// strides; 0: one array for every member): the bits of record_step launched alone with its values.
extern "C" __global__ void cudarl_env_record_step_members(
    float* __restrict__ obs_out, int* __restrict__ action_out, float* __restrict__ reward_out,
    float* __restrict__ next_obs_out, float* __restrict__ done_out, float* __restrict__ discount_out,
    const float* __restrict__ gamma, int* __restrict__ t, int* __restrict__ start, int* __restrict__ steps_left,
    float* __restrict__ position, int* __restrict__ hold, u64* __restrict__ count, float* __restrict__ rows,
    float* __restrict__ reward, float* __restrict__ done, float* __restrict__ obs, const int* __restrict__ actions,
    const float* __restrict__ scale, const float* __restrict__ ret, const float* __restrict__ levels,
    const float* __restrict__ features, const float* __restrict__ sign, int n_envs, int n_actions, int t_begin,
    int n_starts, int episode_len, const int* __restrict__ hold_caps, const float* __restrict__ rates,
    const u64* __restrict__ seed, int counterfactual, int mirror, int window, int n_features, long long n_bars,
    long long sn, long long sr, long long so, long long sm, long long st4, long long s_ret, long long s_lv) {
  const float rate = rates[blockIdx.y];
  const int hold_cap = hold_caps[blockIdx.y];
  ret += blockIdx.y * s_ret;
  levels += blockIdx.y * s_lv;
  RECORD_STEP_BODY
}

#undef RECORD_STEP_BODY
#undef ENV_MEMBER_STEP_ARRAYS

// act: epsilon-greedy actions (cudarl::epsilon_greedy, act.cuh: the rule agent.cu's fused act
// kernels apply too). Thread mapping: one thread per env (blockIdx.y the member). Reads 4A bytes of
// Q, the env's counter (8 bytes), epsilon and the seed (device memory so a replay sees updates);
// writes 4 bytes.
extern "C" __global__ void cudarl_env_act(int* __restrict__ actions, const float* __restrict__ q,
                                          const float* __restrict__ epsilon, const u64* __restrict__ count,
                                          int n_envs, int n_actions, const u64* __restrict__ seed, long long sn,
                                          long long sq) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_envs) return;
  const long long mb = blockIdx.y;
  actions += mb * sn;
  count += mb * sn;
  q += mb * sq;
  actions[i] = cudarl::epsilon_greedy(q + i * n_actions, n_actions, epsilon[mb], seed[mb], count[i], i);
}
