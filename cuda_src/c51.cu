// C51 (Bellemare et al. 2017) with double-DQN selection: the train step's targets and loss fused into
// one launch from the dueling head's raw output (cudarl_c51_targets_loss[_popart]_<variant>), and the
// n-step return. Twin: cudarl/reference/c51.py. Launchers: cudarl/ops/c51.py.
//
// Layout: va [B, (1 + A) K] row-major (V, then Adv [A, K]), support [K] uniform (z_k = v_min + k dz),
// actions int32 [B]. Every per-sample op maps ONE WARP TO ONE SAMPLE (cudarl/c51_rows.cuh, the rows
// shared with the unfused chain). The fused kernels' oracle is that chain, cuda_src/c51_chain.cu: the
// dueling combine, cudarl_c51_chain_targets (or next_probs_td + project_popart with PopArt),
// cudarl_c51_chain_loss and the dueling backward in a row, whose bits they must give.
//
// The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 4):
// targets_loss[_popart]_<variant> and n_step take blockIdx.y as the member mb. Each row family
// advances by mb times its stride argument, in elements: s_va the va rows and dva ([B, (1 + A) K]),
// s_bk probs and target ([B, K]), s_b the per-sample arrays ([B]: actions, weights, r_t, discount_t,
// a_star, loss_per, priority, y, r_norm; n_step's r_t, discount_t), s_z the support ([K]; 0: one
// support for every member), s_n n_step's rewards and terminal ([B, n]); each device scalar (loss,
// gamma, beta, the counters done and barrier) by mb and a PopArt state (and its scratch) by
// mb * STATE_SIZE: [P] and [P, 8] arrays. The x grid, the block, each thread's work and every
// reduction's order are the single launch's, so member mb gets the bits of a single launch on its
// rows. One member (gridDim.y = 1, mb = 0: every offset zero) is the single launch. The by-value
// constants (B, A, K, kind, scale, sigma_min, n) are one value for every member of a launch.

#include <cudarl/c51_rows.cuh>
#include <cudarl/dueling.cuh>
#include <cudarl/popart.cuh>
#include <cudarl/reduce.cuh>
#include <cudarl/units.cuh>

using namespace cudarl::c51;  // NOLINT: the rows shared with the chain (cudarl/c51_rows.cuh)

namespace {

using cudarl::warp_max;
using cudarl::warp_sum;

// A share in a float4 of a warp's stage (l as its bits, lo, hi).
__device__ __forceinline__ void stage_share(float4* stage, int j, const Share& sh) {
  stage[j] = make_float4(__int_as_float(sh.l), sh.lo, sh.hi, 0.f);
}

// Adds share s4 to the sums of target atoms ia and ib (if it lands there).
__device__ __forceinline__ void add_share(const float4& s4, int ia, int ib, float& acc_a, float& acc_b) {
  const int l = __float_as_int(s4.x);
  if (l == ia) acc_a += s4.y;
  else if (l + 1 == ia) acc_a += s4.z;
  if (l == ib) acc_b += s4.y;
  else if (l + 1 == ib) acc_b += s4.z;
}

// The staged projection's sums for target atoms ia and ib: the shares of j = 0..K-1, in order.
// Four shares are read before any is added: the loads overlap instead of each waiting on the one
// before (ncu at af237d7: one shared-load latency per j when the compiler reused one register).
__device__ __forceinline__ void staged_sums(const float4* stage, int K, int ia, int ib, float& acc_a, float& acc_b) {
  acc_a = 0.f;
  acc_b = 0.f;
  int j = 0;
  for (; j + 4 <= K; j += 4) {
    const float4 s0 = stage[j], s1 = stage[j + 1], s2 = stage[j + 2], s3 = stage[j + 3];
    add_share(s0, ia, ib, acc_a, acc_b);
    add_share(s1, ia, ib, acc_a, acc_b);
    add_share(s2, ia, ib, acc_a, acc_b);
    add_share(s3, ia, ib, acc_a, acc_b);
  }
  for (; j < K; ++j) add_share(stage[j], ia, ib, acc_a, acc_b);
}

// staged_sums' sum for one target atom i, visiting only the j whose share can land on i. Requires
// l_j nondecreasing in j (staged_monotone): then the j with l_j in {i - 1, i} (the only ones
// add_share adds to atom i) are one run, from the first j with l_j >= i - 1 (a binary search)
// up to the first with l_j > i, and the run adds them in staged_sums' order: the same additions
// of the same values, so the same bits, in about log2 K + 3 shared loads instead of K.
__device__ __forceinline__ float staged_sum_run(const float4* stage, int K, int i) {
  int lo = 0, hi = K;  // the first j with l_j >= i - 1
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (__float_as_int(stage[mid].x) < i - 1) lo = mid + 1;
    else hi = mid;
  }
  float acc = 0.f;
  for (int j = lo; j < K; ++j) {
    const float4 s4 = stage[j];
    const int l = __float_as_int(s4.x);
    if (l > i) break;
    if (l == i) acc += s4.y;
    else if (l + 1 == i) acc += s4.z;
  }
  return acc;
}

// Is l_j nondecreasing over the staged j < K (K <= 64; every lane gets the answer)? It is whenever
// d >= 0 and the support increases (tz, then g, then floor are monotone in z_j), so for every
// C51 target; a negative discount (or any other order) takes staged_sums instead.
__device__ __forceinline__ bool staged_monotone(const float4* stage, int K, int lane) {
  bool ok = true;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int j = lane + C51_WARP * c;
    if (j + 1 < K) ok = ok && __float_as_int(stage[j].x) <= __float_as_int(stage[j + 1].x);
  }
  return __all_sync(0xffffffffu, ok);
}

// project_row with the shares staged in shared memory instead of shuffled: lane j % 32 computes
// source atom j's share once into stage[j] = (l_j, lo_j, hi_j) (float4s: the warp's own K-entry
// scratch, 16-byte aligned), then every lane walks j = 0..K-1 with broadcast reads, adding the
// shares that land on its atoms i = lane + 64 c and i + 32 into two sums. The same shares, added in
// the same j order, as project_row: the same bits, at one shared load per j and lane instead of
// three shuffles per j for each 32 atoms (the shuffles were the SM's bottleneck, ncu at c58292e).
__device__ __forceinline__ void project_row_staged(const float* p, float r, float d, const float* support, float* out,
                                                   int K, int lane, float4* stage) {
  const float v_min = support[0], v_max = support[K - 1];
  const float dz = (v_max - v_min) / (float)(K - 1);
  if (!isfinite(r) || !isfinite(d)) {
    for (int i = lane; i < K; i += C51_WARP) out[i] = __int_as_float(0x7fc00000);
    return;
  }
  for (int j = lane; j < K; j += C51_WARP) stage_share(stage, j, share_of(p, r, d, support, j, K, v_min, v_max, dz));
  __syncwarp();
  for (int i0 = 0; i0 < K; i0 += 2 * C51_WARP) {
    const int ia = i0 + lane, ib = ia + C51_WARP;
    float acc_a, acc_b;
    staged_sums(stage, K, ia, ib, acc_a, acc_b);
    if (ia < K) out[ia] = acc_a;
    if (ib < K) out[ib] = acc_b;
  }
  __syncwarp();  // every lane is done with stage before the caller reuses it
}

}  // namespace

namespace pa = cudarl::popart;

// ---------------------------------------------------------------------------------------------
// cudarl_c51_targets_loss_<variant> (no PopArt) and cudarl_c51_targets_loss_popart_<variant>: the
// train step's targets and loss in ONE launch, from the dueling head's raw output va [B, (1 + A) K]
// (V, then Adv [A, K]) of the online net at s_t (va_tm1) and s_{t+1} (va_online_tp1) and the target
// net at s_{t+1}:
//   logits = dueling combine of va (cudarl/dueling.cuh: cudarl_nn_dueling_forward's rounding)
//   a*, probs, [y, PopArt update, r_norm], target m   as cudarl_c51_chain_targets / next_probs_td +
//                                                       project_popart
//   loss_per, priority, loss[0]                        as cudarl_c51_chain_loss
//   dva [B, (1 + A) K] = dL/dva                        as cudarl_nn_dueling_backward of the loss's
//                                                       dL/dlogits (which is not stored)
// Every output has the bits of that chain of five launches (dueling_forward x2, the targets
// pair, loss, dueling_backward), with no logits or dlogits buffers in memory: the combined rows
// live in registers (the register path, K <= 64 and A <= 8) or in shared memory per warp (the
// generic path). Four to five graph nodes fewer on the step's critical path.
//
// Variants: each path is a kernel of its own, in a compile unit of its own, so a start-up compiles
// only the one it launches, in a fraction of the time the kernel holding every path took
// (docs/perf-notes.md): _regs3 (A <= 3), _regs4 (A == 4) and _regs8 (A <= 8), the register path for
// K <= 64 atoms and at most that many actions, and _generic (any A and K). The launcher
// (cudarl/ops/c51.py tl_variant) picks the one for A and K that a single kernel once picked at run
// time; a register variant must not be launched with more actions or atoms than it holds.
//
// Threads: blocks of 4 warps (128 threads: twice the SMs of 8-warp blocks at B = 512), one warp per
// sample, samples b = warp, warp + 4 * gridDim.x, ... (any grid covers any B). With PopArt every y
// must exist before any sample is projected: the y pass, then cudarl::grid_barrier(barrier), then
// every block reduces y in project_popart's order (pa::batch_moments_half: so every block holds the
// same new statistics; block 0 stores them), then the projection and loss pass. The grid is at most
// one block per SM (the launcher), so every block is resident; the launch leaves *barrier and *done
// at 0 (last_block resets them). phase 1 then phase 2 is the same work in two launches with no
// barrier (phase 1: pass 1, and the statistics copied to state_prev; phase 2: the rest, the old
// statistics from state_prev), the same bits, for a GPU shared with other processes (MPS), where
// a launch's blocks cannot count on being resident together (run.grid_barrier = false); phase 0
// is the one launch. The projection stages its shares in shared memory
// (project_row_staged: the same bits as project_row).
// Members (gridDim.y = P): each member's gridDim.x blocks run the above on its rows with its own
// counters (done[mb], barrier[mb]: the barrier waits for the member's gridDim.x blocks), so with
// PopArt's grid barrier all gridDim.x * P blocks must be resident: the launcher keeps them at most
// kernels.resident_grid_limit(). The grid does not change a bit of the results (a sample's work is
// one warp's wherever it runs; every reduction has a fixed order).
// Shared memory: 4 warps x (max(A, 4) + 1) K floats, rounded up to float4s (dynamic; past 48 KiB
// the launcher opts in) + 256 + 2 * 128 floats.
// Reads 3 (1 + A) K + K + 4 floats per sample (+ 2B by the last block, + B per block with
// PopArt); writes (1 + A) K + 2 K + 4 floats per sample and 1 (+ 8 with PopArt).
#define C51_TL_WARPS 4
static_assert(C51_TL_WARPS * C51_WARP * 2 == pa::kReduceThreads, "batch_moments_half needs half a reduce block");

namespace {

// The combined logits of action a at the lane's atoms of one va row, into x [K].
__device__ __forceinline__ void dueling_row(const float* va, int a, float* x, int A, int K, int lane) {
  for (int k = lane; k < K; k += C51_WARP) x[k] = cudarl::dueling_logit(va, cudarl::dueling_mean(va, A, K, k), a, K, k);
}

// With PopArt, between the passes: wait for every block's y (phase 0), then every block reduces y in
// project_popart's order (pa::batch_moments_half: every block the same new statistics); block 0
// stores them. Returns the new statistics.
__device__ __forceinline__ pa::Stats tl_popart_stats(const float* y, int B, const pa::Stats& old, const float* beta,
                                                     float sigma_min, int phase, unsigned int* barrier, float* s1,
                                                     float* s2, float* state_out) {
  if (phase == 0) cudarl::grid_barrier(barrier);
  float sum, sum2;
  pa::batch_moments_half(y, B, s1, s2, sum, sum2);
  const pa::Stats st = pa::updated(old, beta[0], sum, sum2, B, sigma_min);
  if (blockIdx.x == 0 && threadIdx.x == 0) pa::store(state_out, old, st);
  return st;
}

// The end of the launch: the last block sums the batch mean (cudarl_c51_chain_loss's order) and sets the
// barrier back to 0 (every block is past it by then).
__device__ __forceinline__ void tl_finish(bool popart, int phase, const float* loss_per, const float* weights, int B,
                                          float scale, float* part, float* loss, unsigned int* done,
                                          unsigned int* barrier) {
  if (cudarl::last_block(done)) {
    if (popart && phase == 0 && threadIdx.x == 0) *barrier = 0u;
    const float sum = cudarl::block_weighted_sum<C51_MEAN_SLOTS>(loss_per, weights, B, part);
    if (threadIdx.x == 0) loss[0] = scale * sum;
  }
}

// ---- the register path (K <= 64, A <= MAXA) ------------------------------------------------------
// Lane l owns atoms l and l + 32 (the generic path's k = lane, lane + 32 loops, in that order); a
// sample's three va rows, its probabilities and its target live in registers, loaded by one round of
// independent loads, and the loss's softmax of the chosen action (which needs no target) is done
// before the PopArt barrier, not after. The generic path reads va again for every action and atom
// and waits on each load (ncu at cc5acbb: 21 us, its warps stalled on global loads and short
// dependent chains, one warp a scheduler). Every rounding is the generic path's in the same order:
// the same bits (tests/parity/test_c51.py runs both paths against the launch chain).
#define C51_TLR_MAXK 64

struct TlArgs {  // targets_loss_body's arguments, as one value for the register path
  const float* va_tm1;
  const float* va_online_tp1;
  const float* va_target_tp1;
  const int* actions;
  const float* weights;
  const float* support;
  const float* r_t;
  const float* discount_t;
  const float* beta;
  float* state_out;
  float* y;
  float* r_norm;
  float* probs;
  int* a_star;
  float* target;
  float* loss_per;
  float* priority;
  float* dva;
  float* loss;
  unsigned int* done;
  unsigned int* barrier;
  int B, A, K, kind;
  float scale, sigma_min;
  int phase;
};

template <int MAXA>
struct TlRow {  // one va row [(1 + A) K] at the lane's atoms j = 0, 1 (k = lane + 32 j)
  float v[2];
  float adv[2][MAXA];
};

// An atom past K holds 1s: every value computed from it stays normal, so no IEEE division on it
// takes the slow path (a zero or denormal operand does; ncu at af237d7: ~200 instructions a warp in
// that path, most on atoms that do not exist). Nothing from such an atom is added or stored.
template <int MAXA>
__device__ __forceinline__ void tlr_load(const float* __restrict__ va, int A, int K, int lane, TlRow<MAXA>& r) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int k = lane + C51_WARP * j;
    const bool ok = k < K;
    r.v[j] = ok ? va[k] : 1.f;
#pragma unroll
    for (int a = 0; a < MAXA; ++a) r.adv[j][a] = ok && a < A ? va[(1 + a) * K + k] : 1.f;
  }
}

// x[a] = the register array's element a (a runtime index, uniform across the warp).
template <int MAXA>
__device__ __forceinline__ float tlr_pick(const float (&x)[MAXA], int a) {
  float v = x[0];
#pragma unroll
  for (int u = 1; u < MAXA; ++u)
    if (u == a) v = x[u];
  return v;
}

// The dueling logit of action a at the lane's atom j (dueling.cuh's roundings).
template <int MAXA>
__device__ __forceinline__ float tlr_logit(const TlRow<MAXA>& r, int j, int a, int A) {
  return (r.v[j] + tlr_pick(r.adv[j], a)) - cudarl::dueling_mean_regs(r.adv[j], A);  // dueling_combine's order
}

// row_softmax_stats of the row whose lane atoms are x0, x1 (ok0, ok1: they exist); also returns the
// lane's exp(x - m), 1 where the atom does not exist (a normal dividend). Branch-free (ncu at
// a2653d2: this path's warps waited on instruction fetch after every short branch): exp is computed
// for every lane and the sums add only existing atoms, in the generic path's order.
__device__ __forceinline__ void tlr_softmax_stats(float x0, float x1, bool ok0, bool ok1, float& m, float& s,
                                                  float& e0, float& e1) {
  float mx = fmaxf(C51_NEG_INF, ok0 ? x0 : C51_NEG_INF);
  mx = fmaxf(mx, ok1 ? x1 : C51_NEG_INF);
  m = warp_max(mx);
  e0 = expf(x0 - m);
  e1 = expf(x1 - m);
  float acc = 0.f;
  if (ok0) acc += e0;
  if (ok1) acc += e1;
  s = warp_sum(acc);
  e0 = ok0 ? e0 : 1.f;
  e1 = ok1 ? e1 : 1.f;
}

// select_action on the online row at s' (every action's reductions interleaved; the actions past A
// are reduced too, on tlr_load's padding, and never chosen: no branch around a shuffle).
template <int MAXA>
__device__ __forceinline__ int tlr_select(const TlRow<MAXA>& on, float z0, float z1, bool ok0, bool ok1, int A) {
  float x[2][MAXA], m[MAXA], s[MAXA], acc[MAXA];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float mean = cudarl::dueling_mean_regs(on.adv[j], A);
#pragma unroll
    for (int a = 0; a < MAXA; ++a) x[j][a] = cudarl::dueling_combine(on.v[j], on.adv[j][a], mean);
  }
#pragma unroll
  for (int a = 0; a < MAXA; ++a) {
    m[a] = fmaxf(C51_NEG_INF, ok0 ? x[0][a] : C51_NEG_INF);
    m[a] = fmaxf(m[a], ok1 ? x[1][a] : C51_NEG_INF);
  }
#pragma unroll
  for (int a = 0; a < MAXA; ++a) m[a] = warp_max(m[a]);
#pragma unroll
  for (int a = 0; a < MAXA; ++a) {
    x[0][a] = expf(x[0][a] - m[a]);  // x now holds exp(x - m)
    x[1][a] = expf(x[1][a] - m[a]);
    s[a] = 0.f;
    if (ok0) s[a] += x[0][a];
    if (ok1) s[a] += x[1][a];
  }
#pragma unroll
  for (int a = 0; a < MAXA; ++a) s[a] = warp_sum(s[a]);
#pragma unroll
  for (int a = 0; a < MAXA; ++a) {
    const float q0 = (ok0 ? x[0][a] : 1.f) / s[a], q1 = (ok1 ? x[1][a] : 1.f) / s[a];
    acc[a] = 0.f;
    if (ok0) acc[a] += q0 * z0;
    if (ok1) acc[a] += q1 * z1;
  }
#pragma unroll
  for (int a = 0; a < MAXA; ++a) acc[a] = warp_sum(acc[a]);
  int best = 0;
  float best_q = acc[0];
#pragma unroll
  for (int a = 1; a < MAXA; ++a)
    if (a < A && acc[a] > best_q) {
      best_q = acc[a];
      best = a;
    }
  return best;
}

// The loss's part that needs no target: the chosen action's logits at s and their softmax.
struct TlLoss {
  int act;
  float w, x0, x1, mx, log_s;
};

template <int MAXA>
__device__ __forceinline__ TlLoss tlr_loss_prep(const float* va_tm1_b, int act, float w, int A, int K, int lane,
                                                bool ok0, bool ok1) {
  TlLoss L{act, w, 0.f, 0.f, 0.f, 0.f};
  TlRow<MAXA> r;
  tlr_load(va_tm1_b, A, K, lane, r);  // an action outside [0, A) picks row 0: computed, never used
  L.x0 = tlr_logit(r, 0, act, A);
  L.x1 = tlr_logit(r, 1, act, A);
  float s, e0, e1;
  tlr_softmax_stats(L.x0, L.x1, ok0, ok1, L.mx, s, e0, e1);
  L.log_s = logf(s);
  return L;
}

// loss_row_x (or loss_row_bad_action) and dueling_backward_atom with the target m0, m1 at the
// lane's atoms: writes dva_b [(1 + A) K], *loss_b, *prio_b.
template <int MAXA>
__device__ __forceinline__ void tlr_loss(const TlLoss& L, float m0, float m1, bool ok0, bool ok1, float* dva_b,
                                         float* loss_b, float* prio_b, int B, int A, int K, int kind, int lane) {
  const bool bad = L.act < 0 || L.act >= A;  // uniform across the warp
  const float lg0 = logf(m0 > 0.f ? m0 : 1.f), lg1 = logf(m1 > 0.f ? m1 : 1.f);
  float ce = 0.f, msum = 0.f, mlogm = 0.f;
  if (ok0) {
    ce -= m0 * (L.x0 - L.mx - L.log_s);
    msum += m0;
    if (m0 > 0.f) mlogm += m0 * lg0;
  }
  if (ok1) {
    ce -= m1 * (L.x1 - L.mx - L.log_s);
    msum += m1;
    if (m1 > 0.f) mlogm += m1 * lg1;
  }
  ce = warp_sum(ce);
  msum = warp_sum(msum);
  mlogm = warp_sum(mlogm);
  const float scale = L.w / (float)B;
  const float e0 = expf(L.x0 - L.mx - L.log_s), e1 = expf(L.x1 - L.mx - L.log_s);
  float g[2] = {0.f, 0.f};
  if (ok0 && !bad) g[0] = scale * (e0 * msum - m0);
  if (ok1 && !bad) g[1] = scale * (e1 * msum - m1);
  if (lane == 0) {
    *loss_b = bad ? C51_NAN : ce;
    *prio_b = bad ? C51_NAN : kind == 0 ? ce : fmaxf(ce + mlogm, 0.f);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int k = lane + C51_WARP * j;
    float d[MAXA], dadv[MAXA], dv;
#pragma unroll
    for (int a = 0; a < MAXA; ++a) d[a] = k >= K ? 1.f : a == L.act ? g[j] : 0.f;
    cudarl::dueling_backward_regs(d, A, dv, dadv);
    if (k < K) dva_b[k] = dv;
#pragma unroll
    for (int a = 0; a < MAXA; ++a)
      if (a < A && k < K) dva_b[(1 + a) * K + k] = dadv[a];
  }
}

template <bool kPopArt, int MAXA>
__device__ __forceinline__ void targets_loss_regs(const TlArgs& t, const pa::Stats& old, float4* stage, float* part,
                                                  float* s1, float* s2) {
  const int lane = threadIdx.x % C51_WARP, warp = threadIdx.x / C51_WARP;
  const int A = t.A, K = t.K, B = t.B, row = (1 + A) * K;
  const bool ok0 = lane < K, ok1 = lane + C51_WARP < K;
  const float z0 = t.support[ok0 ? lane : K - 1], z1 = t.support[ok1 ? lane + C51_WARP : K - 1];
  const float v_min = t.support[0], v_max = t.support[K - 1];
  const float dz = (v_max - v_min) / (float)(K - 1);
  const int first = blockIdx.x * C51_TL_WARPS + warp, stride = gridDim.x * C51_TL_WARPS;
  // the warp's first sample keeps its probabilities, r and d in registers from pass 1 to pass 2
  float p_first[2] = {0.f, 0.f}, r_first = 0.f, d_first = 0.f;

  // pass 1: a*, probs (and y)
  for (int b = first; b < B && t.phase != 2; b += stride) {
    TlRow<MAXA> on, tg;
    tlr_load(t.va_online_tp1 + (long long)b * row, A, K, lane, on);
    tlr_load(t.va_target_tp1 + (long long)b * row, A, K, lane, tg);
    const float r = t.r_t[b], d = t.discount_t[b];
    const int best = tlr_select(on, z0, z1, ok0, ok1, A);
    float m, s, e0, e1;
    tlr_softmax_stats(tlr_logit(tg, 0, best, A), tlr_logit(tg, 1, best, A), ok0, ok1, m, s, e0, e1);
    const float q0 = e0 / s, q1 = e1 / s;
    float* pb = t.probs + (long long)b * K;
    if (ok0) pb[lane] = q0;
    if (ok1) pb[lane + C51_WARP] = q1;
    if (kPopArt) {
      float pz = 0.f;
      if (ok0) pz += q0 * z0;
      if (ok1) pz += q1 * z1;
      const float v = warp_sum(pz);
      if (lane == 0) t.y[b] = pa::td_target(r, d, v, old.mu, old.sigma / old.scale);
    }
    if (lane == 0) t.a_star[b] = best;
    if (b == first) {
      p_first[0] = q0;
      p_first[1] = q1;
      r_first = r;
      d_first = d;
    }
  }
  if (t.phase == 1) return;  // the two-launch form's first launch: the second reads y
  // the first sample's loss softmax, while other blocks finish pass 1
  TlLoss L_first{};
  if (first < B)
    L_first = tlr_loss_prep<MAXA>(t.va_tm1 + (long long)first * row, t.actions[first], t.weights[first], A, K, lane,
                                  ok0, ok1);
  pa::Stats st{};
  if (kPopArt) st = tl_popart_stats(t.y, B, old, t.beta, t.sigma_min, t.phase, t.barrier, s1, s2, t.state_out);

  // pass 2: the projection, the loss and dL/dva
  for (int b = first; b < B; b += stride) {
    const bool cached = b == first && t.phase == 0;
    float q0 = p_first[0], q1 = p_first[1], rn = r_first, d = d_first;
    if (!cached) {
      const float* pb = t.probs + (long long)b * K;
      q0 = ok0 ? pb[lane] : 0.f;
      q1 = ok1 ? pb[lane + C51_WARP] : 0.f;
      rn = t.r_t[b];
      d = t.discount_t[b];
    }
    const TlLoss L = b == first ? L_first
                                : tlr_loss_prep<MAXA>(t.va_tm1 + (long long)b * row, t.actions[b], t.weights[b], A, K,
                                                      lane, ok0, ok1);
    if (kPopArt) {
      rn = pa::normalized_reward(rn, d, st.mu, st.sigma / st.scale);
      if (lane == 0) t.r_norm[b] = rn;
    }
    float m0, m1;
    if (!isfinite(rn) || !isfinite(d)) {
      m0 = m1 = __int_as_float(0x7fc00000);
    } else {
      const Share h0 = share_at(q0, rn, d, z0, K, v_min, v_max, dz), h1 = share_at(q1, rn, d, z1, K, v_min, v_max, dz);
      if (ok0) stage_share(stage, lane, h0);
      if (ok1) stage_share(stage, lane + C51_WARP, h1);
      __syncwarp();
      if (staged_monotone(stage, K, lane)) {  // every C51 target: a run of shares an atom (same bits)
        m0 = staged_sum_run(stage, K, lane);
        m1 = ok1 ? staged_sum_run(stage, K, lane + C51_WARP) : 0.f;  // m1 is read only where ok1
      } else {
        staged_sums(stage, K, lane, lane + C51_WARP, m0, m1);
      }
      __syncwarp();  // every lane is done with stage before the next sample
    }
    float* mb = t.target + (long long)b * K;
    if (ok0) mb[lane] = m0;
    if (ok1) mb[lane + C51_WARP] = m1;
    tlr_loss<MAXA>(L, m0, m1, ok0, ok1, t.dva + (long long)b * row, t.loss_per + b, t.priority + b, B, A, K, t.kind,
                   lane);
  }
  tl_finish(kPopArt, t.phase, t.loss_per, t.weights, B, t.scale, part, t.loss, t.done, t.barrier);
}

// MAXA > 0: the register path for at most MAXA actions (the launcher's choice: A <= MAXA, K <=
// C51_TLR_MAXK); MAXA == 0: the generic path. Only the chosen path is compiled.
template <bool kPopArt, int MAXA>
__device__ __forceinline__ void targets_loss_body(
    const float* __restrict__ va_tm1, const float* __restrict__ va_online_tp1, const float* __restrict__ va_target_tp1,
    const int* __restrict__ actions, const float* __restrict__ weights, const float* __restrict__ support,
    const float* __restrict__ r_t, const float* __restrict__ discount_t, const float* state, const float* beta,
    float* state_out, float* y, float* r_norm, float* __restrict__ probs, int* __restrict__ a_star,
    float* __restrict__ target, float* __restrict__ loss_per, float* __restrict__ priority, float* __restrict__ dva,
    float* __restrict__ loss, unsigned int* done, unsigned int* barrier, float* state_prev, int B, int A, int K,
    int kind, float scale, float sigma_min, int phase, long long s_va, long long s_bk, long long s_b, long long s_z) {
  {  // the member's rows and scalars (member 0: the pointers as given; PopArt's only with PopArt)
    const long long mb = blockIdx.y;
    va_tm1 += mb * s_va;
    va_online_tp1 += mb * s_va;
    va_target_tp1 += mb * s_va;
    dva += mb * s_va;
    probs += mb * s_bk;
    target += mb * s_bk;
    actions += mb * s_b;
    weights += mb * s_b;
    r_t += mb * s_b;
    discount_t += mb * s_b;
    a_star += mb * s_b;
    loss_per += mb * s_b;
    priority += mb * s_b;
    support += mb * s_z;
    loss += mb;
    done += mb;
    if (kPopArt) {
      y += mb * s_b;
      r_norm += mb * s_b;
      state += mb * pa::STATE_SIZE;
      state_out += mb * pa::STATE_SIZE;
      state_prev += mb * pa::STATE_SIZE;
      beta += mb;
      barrier += mb;
    }
  }
  extern __shared__ float4 c51_tl_smem[];
  __shared__ float part[C51_MEAN_SLOTS];
  __shared__ float s1[pa::kReduceThreads / 2];
  __shared__ float s2[pa::kReduceThreads / 2];
  const int warp = threadIdx.x / C51_WARP;
  // per warp, in float4s: [max(A, 4) K floats: the online logits at s', then the projection's
  // shares, then dL/dlogits] [K floats: the target row a*, then the online row a]
  const int big = (A > 4 ? A : 4) * K, per_warp4 = (big + K + 3) / 4;
  float4* stage = c51_tl_smem + (long long)warp * per_warp4;
  pa::Stats old{};
  if (kPopArt) old = pa::load(phase == 2 ? state_prev : state);  // every block, before block 0 stores the new ones
  if (kPopArt && phase == 1 && blockIdx.x == 0 && threadIdx.x < pa::STATE_SIZE) state_prev[threadIdx.x] = state[threadIdx.x];
  if constexpr (MAXA > 0) {
    const TlArgs t{va_tm1, va_online_tp1, va_target_tp1, actions, weights, support, r_t, discount_t, beta, state_out, y,
                   r_norm, probs, a_star, target, loss_per, priority, dva, loss, done, barrier, B, A, K, kind, scale,
                   sigma_min, phase};
    targets_loss_regs<kPopArt, MAXA>(t, old, stage, part, s1, s2);
  } else {
    const int lane = threadIdx.x % C51_WARP, row = (1 + A) * K;
    float* logits = reinterpret_cast<float*>(stage);
    float* x = logits + big;
    const int first = blockIdx.x * C51_TL_WARPS + warp, stride = gridDim.x * C51_TL_WARPS;
    // the generic path. pass 1: a*, probs (and y)
    for (int b = first; b < B && phase != 2; b += stride) {
      const float* vo = va_online_tp1 + (long long)b * row;
      for (int a = 0; a < A; ++a) dueling_row(vo, a, logits + a * K, A, K, lane);
      __syncwarp();
      const int best = select_action(logits, support, A, K, lane);
      dueling_row(va_target_tp1 + (long long)b * row, best, x, A, K, lane);
      __syncwarp();
      float pz;
      probs_row(x, support, probs + (long long)b * K, K, lane, pz);
      if (kPopArt) {
        const float v = warp_sum(pz);
        if (lane == 0) y[b] = pa::td_target(r_t[b], discount_t[b], v, old.mu, old.sigma / old.scale);
      }
      if (lane == 0) a_star[b] = best;
      __syncwarp();  // every lane's probs and x reads are done before the next sample overwrites x
    }
    if (phase == 1) return;  // the two-launch form's first launch: the second reads y
    pa::Stats st{};
    if (kPopArt) st = tl_popart_stats(y, B, old, beta, sigma_min, phase, barrier, s1, s2, state_out);

    // pass 2: the projection, the loss and dL/dva
    for (int b = first; b < B; b += stride) {
      const float d = discount_t[b];
      float rn = r_t[b];
      if (kPopArt) {
        rn = pa::normalized_reward(rn, d, st.mu, st.sigma / st.scale);
        if (lane == 0) r_norm[b] = rn;
      }
      float* m = target + (long long)b * K;
      project_row_staged(probs + (long long)b * K, rn, d, support, m, K, lane, stage);
      const int act = actions[b];
      if (act < 0 || act >= A) {
        loss_row_bad_action(logits, loss_per + b, priority + b, A, K, lane);
      } else {
        dueling_row(va_tm1 + (long long)b * row, act, x, A, K, lane);
        __syncwarp();
        loss_row_x(x, act, m, weights[b], logits, loss_per + b, priority + b, B, A, K, kind, lane);
      }
      __syncwarp();
      for (int k = lane; k < K; k += C51_WARP) cudarl::dueling_backward_atom(logits, dva + (long long)b * row, A, K, k);
      __syncwarp();
    }
    tl_finish(kPopArt, phase, loss_per, weights, B, scale, part, loss, done, barrier);
  }
}

}  // namespace

// The targets_loss kernels use cudarl::last_block, whose flag is a function-static __shared__
// variable: used by several kernels, it stays a module-level variable in the whole family. A unit
// compile holds one of them, and NVVM would move the flag into that kernel, which lays out its shared
// memory otherwise (other address arithmetic, the same results). This kernel, never launched, keeps
// the flag shared in every unit, so each kernel's machine code is the whole family's, byte for byte
// (tests/unit/test_compile_units.py).
#ifdef CUDARL_UNIT
namespace {
__global__ void unit_keeps_last_block_shared(unsigned int* done) { cudarl::last_block(done); }
}  // namespace
#endif

// The variants of each op (see the banner above) take the same parameters and differ only in the
// path they compile: targets_loss_body's MAXA (0: the generic path).
#define C51_TL_PARAMS                                                                                               \
  const float *__restrict__ va_tm1, const float *__restrict__ va_online_tp1, const float *__restrict__ va_target_tp1, \
      const int *__restrict__ actions, const float *__restrict__ weights, const float *__restrict__ support,          \
      const float *__restrict__ r_t, const float *__restrict__ discount_t, float *__restrict__ probs,                 \
      int *__restrict__ a_star, float *__restrict__ target, float *__restrict__ loss_per,                            \
      float *__restrict__ priority, float *__restrict__ dva, float *__restrict__ loss, unsigned int *__restrict__ done, \
      int B, int A, int K, int kind, float scale, long long s_va, long long s_bk, long long s_b, long long s_z
#define C51_TL_BODY(MAXA)                                                                                             \
  targets_loss_body<false, MAXA>(va_tm1, va_online_tp1, va_target_tp1, actions, weights, support, r_t, discount_t,     \
                                 nullptr, nullptr, nullptr, nullptr, nullptr, probs, a_star, target, loss_per, priority, \
                                 dva, loss, done, nullptr, nullptr, B, A, K, kind, scale, 0.f, 0, s_va, s_bk, s_b, \
                                 s_z)
#define C51_TL_POPART_PARAMS                                                                                        \
  const float *__restrict__ va_tm1, const float *__restrict__ va_online_tp1, const float *__restrict__ va_target_tp1, \
      const int *__restrict__ actions, const float *__restrict__ weights, const float *__restrict__ support,          \
      const float *__restrict__ r_t, const float *__restrict__ discount_t, float *state, const float *__restrict__ beta, \
      float *__restrict__ y, float *__restrict__ r_norm, float *__restrict__ probs, int *__restrict__ a_star,        \
      float *__restrict__ target, float *__restrict__ loss_per, float *__restrict__ priority, float *__restrict__ dva, \
      float *__restrict__ loss, unsigned int *__restrict__ done, unsigned int *__restrict__ barrier,                 \
      float *__restrict__ state_prev, int B, int A, int K, int kind, float scale, float sigma_min, int phase,        \
      long long s_va, long long s_bk, long long s_b, long long s_z
#define C51_TL_POPART_BODY(MAXA)                                                                                      \
  targets_loss_body<true, MAXA>(va_tm1, va_online_tp1, va_target_tp1, actions, weights, support, r_t, discount_t,      \
                                state, beta, state, y, r_norm, probs, a_star, target, loss_per, priority, dva, loss, done, \
                                barrier, state_prev, B, A, K, kind, scale, sigma_min, phase, s_va, s_bk, s_b, s_z)

#if CUDARL_UNIT_IS(targets_loss_regs3)
extern "C" __global__ void cudarl_c51_targets_loss_regs3(C51_TL_PARAMS) { C51_TL_BODY(3); }
#endif  // targets_loss_regs3

#if CUDARL_UNIT_IS(targets_loss_regs4)
extern "C" __global__ void cudarl_c51_targets_loss_regs4(C51_TL_PARAMS) { C51_TL_BODY(4); }
#endif  // targets_loss_regs4

#if CUDARL_UNIT_IS(targets_loss_regs8)
extern "C" __global__ void cudarl_c51_targets_loss_regs8(C51_TL_PARAMS) { C51_TL_BODY(8); }
#endif  // targets_loss_regs8

#if CUDARL_UNIT_IS(targets_loss_generic)
extern "C" __global__ void cudarl_c51_targets_loss_generic(C51_TL_PARAMS) { C51_TL_BODY(0); }
#endif  // targets_loss_generic

#if CUDARL_UNIT_IS(targets_loss_popart_regs3)
extern "C" __global__ void cudarl_c51_targets_loss_popart_regs3(C51_TL_POPART_PARAMS) { C51_TL_POPART_BODY(3); }
#endif  // targets_loss_popart_regs3

#if CUDARL_UNIT_IS(targets_loss_popart_regs4)
extern "C" __global__ void cudarl_c51_targets_loss_popart_regs4(C51_TL_POPART_PARAMS) { C51_TL_POPART_BODY(4); }
#endif  // targets_loss_popart_regs4

#if CUDARL_UNIT_IS(targets_loss_popart_regs8)
extern "C" __global__ void cudarl_c51_targets_loss_popart_regs8(C51_TL_POPART_PARAMS) { C51_TL_POPART_BODY(8); }
#endif  // targets_loss_popart_regs8

#if CUDARL_UNIT_IS(targets_loss_popart_generic)
extern "C" __global__ void cudarl_c51_targets_loss_popart_generic(C51_TL_POPART_PARAMS) { C51_TL_POPART_BODY(0); }
#endif  // targets_loss_popart_generic

#if CUDARL_UNIT_IS(n_step)
// ---------------------------------------------------------------------------------------------
// cudarl_c51_n_step: n-step reward and bootstrap discount of each sample.
//   R_b = sum_{i<n} gamma^i r_{b,i} prod_{j<i} (1 - term_{b,j}),  d_b = gamma^n prod_{j<n} (1 - term_{b,j})
// gamma is read from device memory (a schedule, or the adaptive-gamma controller, moves it).
// Threads: one per sample, summing i = 0..n-1 in order; grid.y = members (rewards and terminal s_n
// apart, r_t and discount_t s_b, gamma [P]). Reads 2n + 1 floats; writes 2.
extern "C" __global__ void cudarl_c51_n_step(const float* __restrict__ rewards, const float* __restrict__ terminal,
                                             const float* __restrict__ gamma, float* __restrict__ r_t,
                                             float* __restrict__ discount_t, int B, int n, long long s_n,
                                             long long s_b) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const long long mb = blockIdx.y;
  rewards += mb * s_n;
  terminal += mb * s_n;
  r_t += mb * s_b;
  discount_t += mb * s_b;
  const float gm = gamma[mb];
  float ret = 0.f, g = 1.f, alive = 1.f;
  for (int i = 0; i < n; ++i) {
    ret += g * alive * rewards[(long long)b * n + i];
    alive *= 1.f - terminal[(long long)b * n + i];
    g *= gm;
  }
  r_t[b] = ret;
  discount_t[b] = g * alive;
}
#endif  // n_step
