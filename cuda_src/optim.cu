// Optimiser kernels over flat parameter buffers.
// Twin: cudarl/reference/optim.py. Launchers: cudarl/ops/optim.py. Tests: tests/parity/test_optim.py.
//
// Device scalars (step, lr, bias corrections, clip scale, tau) are 1-element buffers: the
// schedule kernels advance counters on the device, so a replayed graph sees the new values.
// The gradient norm is a two-stage, fixed-order reduction in double: bitwise reproducible.
// clip_adam_soft does grad_norm, adam_update_soft and the publish of (loss, norm) in one launch
// (a grid barrier between the partials and the update), with the bits of the three; without the
// barrier in two (grad_norm_publish: the norm, its last block publishing; then adam_update_soft).
//
// The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 3):
// grad_norm_partial, grad_norm_finalize, grad_norm, grad_norm_publish, lr_schedule, adam_update,
// adam_update_soft, clip_adam_soft, tau_schedule and soft_update take blockIdx.y as the member mb. The
// element buffers (g, p, m, v, mask, target, online) are [P, s] rows: each advances by mb * s elements (the argument
// s, one stride for all of them); the partials by mb * GN_BLOCKS, a ring by mb * 2 * slots, and each
// device scalar (step, lr, m_scale, bc1, bc2, clip/scale, norm, tau, count, loss, the counters done
// and barrier) by mb: [P] arrays. The x grid, the block and each thread's work and reduction order
// are the single launch's, so member mb gets the bits of a single launch on its rows. One member
// (gridDim.y = 1, mb = 0: every offset zero) is the single launch. The by-value constants (betas,
// eps, wd, max_norm) are one value for every member of a launch; the _members kernels (lr_schedule,
// tau_schedule, grad_norm, grad_norm_publish, adam_update, adam_update_soft, clip_adam_soft) take each
// member's as [P] arrays of the by-value types (members whose optimiser settings differ: docs/perf-notes.md, "The agent axis, in
// stages", 6c).
#include <cudarl/philox.cuh>
#include <cudarl/reduce.cuh>
#include <cudarl/units.cuh>
#include <cudarl/vaccine.cuh>

typedef long long i64;

#define GN_BLOCKS 512
#define GN_THREADS 256
#define PI_D 3.141592653589793
static_assert(GN_BLOCKS == 2 * GN_THREADS, "spectral_backward folds the partials in two");

namespace {

__device__ double schedule_lr(i64 s, int kind, double lr_max, double lr_min, i64 warmup, i64 period, i64 mult,
                              bool* restart) {
  *restart = false;
  if (s < warmup) return lr_max * (double)(s + 1) / (double)warmup;
  s -= warmup;
  if (kind == 0) return lr_max;
  if (kind == 1) {
    const i64 t = s < period ? s : period;
    return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + cos(PI_D * (double)t / (double)period));
  }
  i64 ti = period, tcur = s, i = 0;
  while (tcur >= ti) { tcur -= ti; ti *= mult; ++i; }
  *restart = (tcur == 0 && i > 0);
  return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + cos(PI_D * (double)tcur / (double)ti));
}

}  // namespace

// ---- grad_norm_partial ----------------------------------------------------------------------
// grid = (GN_BLOCKS / F, members), block = GN_THREADS, F = GN_BLOCKS / gridDim.x in 1 .. GN_FOLD
// (the launchers take F = GN_FOLD; any power of two up to it gives the same bits). The bits are
// those of GN_BLOCKS "virtual blocks": thread t of virtual block k sums g[i]^2 in double over
// i = k*256 + t + j*GN_BLOCKS*256 (j ascending), then the pairs of block_tree_sum(., GN_THREADS)
// -> partial[k]. Block x runs virtual blocks k = x*F + f, f < F, side by side: thread t keeps F
// sums (F independent loads in flight, where one block a virtual block had one, ~1 element a
// thread at P = 64), levels 128, 64, 32 of the F trees share one __syncthreads() each, and warp f
// does tree f's levels 16 .. 1 in registers (cudarl::warp_tree_sum). The launch's fixed costs (a
// block's start, its barriers, grad_norm's ticket) are paid once for F virtual blocks: ncu at
// a75a02b, P = 64, F = 1: 78.3 us for 37 MB, Stall Barrier on top.
// Reads 4*n bytes, writes 8*GN_BLOCKS (a member).
#define GN_FOLD 8
static_assert(GN_FOLD * 32 <= GN_THREADS, "a warp for each virtual block's last levels");
static_assert(GN_BLOCKS % GN_FOLD == 0, "the launchers' grid, GN_BLOCKS / GN_FOLD, covers every virtual block");
namespace {

// sh: GN_FOLD * GN_THREADS doubles. Call from every thread of the block.
__device__ __forceinline__ void gn_block_partial(const float* g, double* partial, i64 n, double* sh) {
  const int t = (int)threadIdx.x, F = GN_BLOCKS / (int)gridDim.x;
  const i64 span = (i64)GN_BLOCKS * GN_THREADS;
  double acc[GN_FOLD];
#pragma unroll
  for (int f = 0; f < GN_FOLD; ++f) acc[f] = 0.0;
  // virtual block k's element j is i0 + f*256 with i0 = x*F*256 + t + j*span: i0 >= n ends them all
  for (i64 i0 = (i64)blockIdx.x * F * GN_THREADS + t; i0 < n; i0 += span) {
#pragma unroll
    for (int f = 0; f < GN_FOLD; ++f) {
      const i64 i = i0 + (i64)f * GN_THREADS;
      if (f < F && i < n) {
        const double x = (double)g[i];
        acc[f] += x * x;
      }
    }
  }
#pragma unroll
  for (int f = 0; f < GN_FOLD; ++f)
    if (f < F) sh[f * GN_THREADS + t] = acc[f];
  for (int o = GN_THREADS / 2; o >= 32; o >>= 1) {  // block_tree_sum's shared levels, F trees at once
    __syncthreads();
    if (t < o)
      for (int f = 0; f < F; ++f) sh[f * GN_THREADS + t] += sh[f * GN_THREADS + t + o];
  }
  __syncthreads();
  const int w = t >> 5, lane = t & 31;
  if (w < F) {
    const double v = cudarl::warp_tree_sum(sh[w * GN_THREADS + lane]);
    if (lane == 0) partial[blockIdx.x * F + w] = v;
  }
}

// norm = sqrt(total); scale = max_norm / (norm + 1e-6) when that is below 1 and max_norm > 0, else 1.
__device__ __forceinline__ void gn_norm_scale(double total, float max_norm, float* norm, float* scale) {
  const double nd = sqrt(total);
  *norm = (float)nd;
  const double denom = nd + 1e-6;
  *scale = (max_norm > 0.f && denom > (double)max_norm) ? (float)((double)max_norm / denom) : 1.f;
}

// gn_norm_scale into norm[0] and scale[0].
__device__ __forceinline__ void gn_finish(double total, float* norm, float* scale, float max_norm) {
  float nf, sf;
  gn_norm_scale(total, max_norm, &nf, &sf);
  norm[0] = nf;
  scale[0] = sf;
}

}  // namespace

static_assert(GN_THREADS == 256, "tree_gn spells out the levels of a 256-slot tree");

namespace {

// The pairs of cudarl::block_tree_sum(s, GN_THREADS) over s[0 .. GN_THREADS), in this thread's slot
// t: levels 128 and 64 in shared memory, level 32 and the levels 16 .. 1 in registers of the first
// warp (lane t adds lane t + o: the tree's pair, and IEEE + is commutative), so three
// __syncthreads instead of nine and the same bits. The sum is returned in t == 0 (other threads
// get partial sums or 0). Call from every thread of the block (threads with t >= GN_THREADS only
// synchronise); before s is written again, __syncthreads (the first warp reads s[0 .. 64) last).
__device__ __forceinline__ double tree_gn(double* s, int t) {
  for (int o = GN_THREADS / 2; o > 32; o >>= 1) {
    __syncthreads();
    if (t < o) s[t] += s[t + o];
  }
  __syncthreads();
  double x = 0.0;
  if (t < 32) {
    x = s[t] + s[t + 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(cudarl::kFullWarp, x, o);
  }
  return x;
}

}  // namespace

// grad_norm_partial: gn_block_partial's GN_FOLD virtual blocks a block (the two-launch grad_norm's first):
// 32,768 one-element blocks at P = 64 were bound by their trees' barriers (docs/perf-notes.md, grad_norm_members at 453 GB/s).
#if CUDARL_UNIT_IS(grad_norm)
extern "C" __global__ __launch_bounds__(GN_THREADS) void cudarl_optim_grad_norm_partial(const float* g, double* partial, i64 n,
                                                                                       i64 s) {
  __shared__ double sh[GN_FOLD * GN_THREADS];
  const i64 mb = blockIdx.y;  // the member
  gn_block_partial(g + mb * s, partial + mb * GN_BLOCKS, n, sh);
}
#endif  // grad_norm

// ---- grad_norm_finalize ---------------------------------------------------------------------
// One block of GN_BLOCKS threads per member: fixed tree over the partials, then gn_finish.
// Reads 8*GN_BLOCKS bytes, writes 8 (a member).
#if CUDARL_UNIT_IS(grad_norm)
extern "C" __global__ __launch_bounds__(GN_BLOCKS) void cudarl_optim_grad_norm_finalize(const double* partial, float* norm,
                                                                                       float* scale, float max_norm) {
  __shared__ double sh[GN_BLOCKS];
  const int mb = blockIdx.y;
  partial += (i64)mb * GN_BLOCKS;
  norm += mb;
  scale += mb;
  sh[threadIdx.x] = partial[threadIdx.x];
  cudarl::block_tree_sum(sh, GN_BLOCKS);
  if (threadIdx.x == 0) gn_finish(sh[0], norm, scale, max_norm);
}
#endif  // grad_norm

// ---- grad_norm (both stages, one launch) ------------------------------------------------------
// grid = GN_BLOCKS / GN_FOLD, block = GN_THREADS: grad_norm_partial's blocks, then the block that finishes
// last (cudarl::last_block on the ticket *done, 0 at launch and left 0) reduces the partials as
// grad_norm_finalize does: thread t adds partial[t] and partial[t + GN_THREADS], which is the
// first level of finalize's GN_BLOCKS-slot tree, and the tree goes on over GN_THREADS slots: the
// same bits as the two launches, one graph node fewer on the train step's chain.
// Reads 4*n + 8*GN_BLOCKS bytes, writes 8*GN_BLOCKS + 8.
// The body of grad_norm, grad_norm_members, grad_norm_publish and grad_norm_publish_members, one text for
// all four (max_norm: by-value in grad_norm and grad_norm_publish, max_norms[blockIdx.y] in the _members
// kernels; PUBLISH: what thread 0 of the last block does after gn_finish, empty in grad_norm): a macro, so
// grad_norm's text and PTX stay as they were.
#define GRAD_NORM_BODY(PUBLISH) \
  __shared__ double sh[GN_FOLD * GN_THREADS];                                             \
  const i64 mb = blockIdx.y;                                                              \
  g += mb * s;                                                                            \
  partial += mb * GN_BLOCKS;                                                              \
  norm += mb;                                                                             \
  scale += mb;                                                                            \
  done += mb;  /* a ticket per member: last_block counts the member's gridDim.x blocks */ \
  gn_block_partial(g, partial, n, sh);                                                    \
  if (cudarl::last_block(done)) {                                                         \
    const int t = (int)threadIdx.x;                                                       \
    sh[t] = cudarl::load_l2(partial + t) + cudarl::load_l2(partial + t + GN_THREADS);     \
    cudarl::block_tree_sum(sh, GN_THREADS);                                               \
    if (t == 0) {                                                                         \
      gn_finish(sh[0], norm, scale, max_norm);                                            \
      PUBLISH                                                                             \
    }                                                                                     \
  }

#if CUDARL_UNIT_IS(grad_norm)
extern "C" __global__ __launch_bounds__(GN_THREADS) void cudarl_optim_grad_norm(const float* g, double* partial, float* norm,
                                                                               float* scale, float max_norm,
                                                                               unsigned int* done, i64 n, i64 s) {
  GRAD_NORM_BODY()
}
#endif  // grad_norm

// grad_norm_members: grad_norm whose members each clip at their own norm (max_norms [P], float as
// grad_norm's by-value max_norm; member mb reads max_norms[mb]): the bits of grad_norm launched alone with it.
#if CUDARL_UNIT_IS(grad_norm)
extern "C" __global__ __launch_bounds__(GN_THREADS) void cudarl_optim_grad_norm_members(const float* g, double* partial,
                                                                                       float* norm, float* scale,
                                                                                       const float* max_norms,
                                                                                       unsigned int* done, i64 n,
                                                                                       i64 s) {
  const float max_norm = max_norms[blockIdx.y];
  GRAD_NORM_BODY()
}
#endif  // grad_norm

// ---- grad_norm_publish ------------------------------------------------------------------------
// grad_norm whose last block also publishes: thread 0, after writing norm[0] and scale[0], writes
// ring[2 sl] = loss[0] and ring[2 sl + 1] = norm[0], sl = step[0] % slots (cudarl_agent_publish's
// store; step is Adam's counter, already advanced by lr_schedule). The first of clip_adam_soft's two
// launches without a grid barrier (the second: adam_update_soft with clip = scale): the norm in
// grad_norm's last-block order, which is clip_adam_soft's (partial[t] + partial[t + 256], then the
// 256-slot tree: tree_gn and block_tree_sum(., 256) add the same pairs), so the same bits as the
// one launch and as the three (grad_norm, adam_update_soft, publish). Members: ring [P, 2 * slots]
// (row mb), loss and step [P], as clip_adam_soft's. Reads 4*n + 8*GN_BLOCKS + 12 bytes, writes
// 8*GN_BLOCKS + 16 (a member).
#define GN_PUBLISH \
  {                                                                                 \
    const i64 sl = step[mb] % slots;                                                \
    float* r = ring + mb * 2 * (i64)slots;                                          \
    r[2 * sl] = loss[mb];                                                           \
    r[2 * sl + 1] = norm[0];                                                        \
  }

#if CUDARL_UNIT_IS(grad_norm)
extern "C" __global__ __launch_bounds__(GN_THREADS) void cudarl_optim_grad_norm_publish(
    const float* g, double* partial, float* norm, float* scale, float max_norm, unsigned int* done, i64 n, i64 s,
    float* ring, const float* loss, const i64* step, int slots) {
  GRAD_NORM_BODY(GN_PUBLISH)
}
#endif  // grad_norm

// grad_norm_publish_members: grad_norm_publish whose members each clip at their own norm (max_norms [P], as
// grad_norm_members'): the bits of grad_norm_publish launched alone with it.
#if CUDARL_UNIT_IS(grad_norm)
extern "C" __global__ __launch_bounds__(GN_THREADS) void cudarl_optim_grad_norm_publish_members(
    const float* g, double* partial, float* norm, float* scale, const float* max_norms, unsigned int* done, i64 n,
    i64 s, float* ring, const float* loss, const i64* step, int slots) {
  const float max_norm = max_norms[blockIdx.y];
  GRAD_NORM_BODY(GN_PUBLISH)
}
#endif  // grad_norm

#undef GN_PUBLISH
#undef GRAD_NORM_BODY

// ---- lr_schedule ------------------------------------------------------------------------------
// One thread per member (block (0, mb)): step += 1 (t = step), lr = schedule(t - 1), m_scale (warm restarts), bias
// corrections bc1 = 1 - beta1^t, bc2 = 1 - beta2^t, all in double, rounded once.
namespace {

// The schedule of one member's scalars (step, lr, m_scale, bc1, bc2 at its slot), from its constants: the one
// statement of lr_schedule and lr_schedule_members.
__device__ __forceinline__ void lr_schedule_one(i64* step, float* lr, float* m_scale, float* bc1, float* bc2, int kind,
                                                float lr_max, float lr_min, i64 warmup, i64 period, i64 mult,
                                                float restart_m_scale, float beta1, float beta2) {
  const i64 t = step[0] + 1;
  step[0] = t;
  bool restart;
  lr[0] = (float)schedule_lr(t - 1, kind, (double)lr_max, (double)lr_min, warmup, period, mult, &restart);
  m_scale[0] = restart ? restart_m_scale : 1.f;
  bc1[0] = (float)(1.0 - pow((double)beta1, (double)t));
  bc2[0] = (float)(1.0 - pow((double)beta2, (double)t));
}

}  // namespace

#if CUDARL_UNIT_IS(lr_schedule)
extern "C" __global__ void cudarl_optim_lr_schedule(i64* step, float* lr, float* m_scale, float* bc1, float* bc2,
                                                    int kind, float lr_max, float lr_min, i64 warmup, i64 period, i64 mult,
                                                    float restart_m_scale, float beta1, float beta2) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const int mb = blockIdx.y;
  lr_schedule_one(step + mb, lr + mb, m_scale + mb, bc1 + mb, bc2 + mb, kind, lr_max, lr_min, warmup, period, mult,
                  restart_m_scale, beta1, beta2);
}
#endif  // lr_schedule

// ---- lr_schedule_members ----------------------------------------------------------------------
// lr_schedule with each member's own schedule: kind, lr_max, lr_min, warmup, period, mult and
// restart_m_scale, and Adam's beta1 and beta2 (the bias corrections') are [P] arrays (lr_schedule's
// by-value types), member mb reading element mb, so its scalars get the bits of lr_schedule launched alone
// with its values. Reads 44 bytes a member, writes 24.
#if CUDARL_UNIT_IS(lr_schedule_members)
extern "C" __global__ void cudarl_optim_lr_schedule_members(i64* step, float* lr, float* m_scale, float* bc1,
                                                            float* bc2, const int* kind, const float* lr_max,
                                                            const float* lr_min, const i64* warmup, const i64* period,
                                                            const i64* mult, const float* restart_m_scale,
                                                            const float* beta1, const float* beta2) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const int mb = blockIdx.y;
  lr_schedule_one(step + mb, lr + mb, m_scale + mb, bc1 + mb, bc2 + mb, kind[mb], lr_max[mb], lr_min[mb], warmup[mb],
                  period[mb], mult[mb], restart_m_scale[mb], beta1[mb], beta2[mb]);
}
#endif  // lr_schedule_members

// ---- adam_update ------------------------------------------------------------------------------
// One thread per element, grid-stride. g' = clip*g; m = b1*(m_scale*m) + (1-b1)*g';
// v = b2*v + (1-b2)*g'^2; p -= lr*wd*p where mask; p -= lr*(m/bc1)/(sqrt(v/bc2) + eps).
// Reads 16*n + n bytes (+20 of scalars), writes 12*n.
namespace {

// The arithmetic of one element on values in registers: g, m, v, p the element's gradient, moments
// and parameter (m, v updated in place), decay whether wd applies (wd != 0 and its mask byte);
// returns the new p. The one statement of the update (adam_elem, and clip_adam_soft's element
// loaded before its grid barrier), with every rounding spelled out:
//   gi = g*cl;  m = beta1*(ms*m) + (1-beta1)*gi;  v = beta2*v + (1-beta2)*gi^2;
//   p -= lr*wd*p (decay);  p -= lr*((m/c1) / (sqrt(v/c2) + eps)).
// Left to the compiler, which product is fused into an fma depends on the code around it: moving
// the loads of adam_elem into registers turned m's fma(1-beta1, gi, beta1*(ms*m)) into
// fma(ms*m, beta1, (1-beta1)*gi) (nvcc 13.0, sm_90 PTX), and ptxas fuses the two p steps on its
// own. The intrinsics below are the fmas nvcc 13.0 chose for adam_update and adam_update_soft
// before they were spelled out (their SASS at c3cfe6c), so those kernels keep their bits, and
// every kernel that calls this rounds alike whatever surrounds it (.rn operations are never
// contracted, by NVVM or by ptxas).
__device__ __forceinline__ float adam_math(float g, float& m, float& v, float p, bool decay, float lr_, float ms,
                                           float c1, float c2, float cl, float beta1, float beta2, float eps, float wd) {
  const float gi = __fmul_rn(g, cl);
  const float mi = __fmaf_rn(1.f - beta1, gi, __fmul_rn(beta1, __fmul_rn(ms, m)));
  const float vi = __fmaf_rn(beta2, v, __fmul_rn(1.f - beta2, __fmul_rn(gi, gi)));
  m = mi;
  v = vi;
  if (decay) p = __fmaf_rn(-__fmul_rn(lr_, wd), p, p);
  const float step = __fdiv_rn(__fdiv_rn(mi, c1), __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, c2)), eps));
  return __fmaf_rn(-lr_, step, p);
}

// The soft update of one target element toward the online value o: tau*o + (1 - tau)*target with
// u = 1 - tau, its rounding spelled out (__fmaf_rn of the tau product onto the rounded (1 - tau)
// product), so soft_update, adam_update_soft and clip_adam_soft give the same bits.
__device__ __forceinline__ float soft_elem(float tau, float u, float o, float target) {
  return __fmaf_rn(tau, o, __fmul_rn(u, target));
}

// Element i of the update from its gradient gi; returns the new p[i] (also stored).
__device__ __forceinline__ float adam_elem_g(float* p, float gi, float* m, float* v, const unsigned char* mask, i64 i,
                                             float lr_, float ms, float c1, float c2, float cl, float beta1,
                                             float beta2, float eps, float wd) {
  float mi = m[i], vi = v[i];
  const float pi = adam_math(gi, mi, vi, p[i], wd != 0.f && mask[i], lr_, ms, c1, c2, cl, beta1, beta2, eps, wd);
  m[i] = mi;
  v[i] = vi;
  p[i] = pi;
  return pi;
}

// Element i of the update (its gradient g[i]); returns the new p[i] (also stored).
__device__ __forceinline__ float adam_elem(float* p, const float* g, float* m, float* v, const unsigned char* mask, i64 i,
                                           float lr_, float ms, float c1, float c2, float cl, float beta1, float beta2,
                                           float eps, float wd) {
  return adam_elem_g(p, g[i], m, v, mask, i, lr_, ms, c1, c2, cl, beta1, beta2, eps, wd);
}

// Element i of the flat gradient as clip_adam_soft_vaccine reads it: Gradient Vaccine's apply_plus on the fly,
// f = g[i] + plus[i] where i < stop (causal's gradient; stop = 0 without it), then f + c (f - aux[i]) on
// [lo, hi) (cudarl::vaccine_elem, vaccine.cu's text): the bits vaccine's apply would have stored in g[i].
__device__ __forceinline__ float vaccine_grad(const float* g, const float* plus, const float* aux, float c, i64 i,
                                              i64 lo, i64 hi, i64 stop) {
  float f = g[i];
  if (i < stop) f = f + plus[i];
  return (i >= lo && i < hi) ? cudarl::vaccine_elem(f, aux[i], c) : f;
}

}  // namespace

// The parameters of cudarl_optim_adam_update, passed as one value (cudarl.signatures reads them here).
struct AdamUpdateArgs {
  float* p;
  const float* g;
  float* m;
  float* v;
  const unsigned char* mask;
  i64 n;
  i64 s;
  const float* lr;
  const float* m_scale;
  const float* bc1;
  const float* bc2;
  const float* clip;
  float beta1;
  float beta2;
  float eps;
  float wd;
};

__device__ __forceinline__ void adam_update_impl(float* p, const float* g, float* m, float* v, const unsigned char* mask,
                                                 i64 n, const float* lr, const float* m_scale, const float* bc1,
                                                 const float* bc2, const float* clip, float beta1, float beta2,
                                                 float eps, float wd) {
  const float lr_ = lr[0], ms = m_scale[0], c1 = bc1[0], c2 = bc2[0], cl = clip[0];
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    adam_elem(p, g, m, v, mask, i, lr_, ms, c1, c2, cl, beta1, beta2, eps, wd);
}

#if CUDARL_UNIT_IS(adam_update)
extern "C" __global__ void cudarl_optim_adam_update(const AdamUpdateArgs a) {
  const i64 mb = blockIdx.y, o = mb * a.s;
  adam_update_impl(a.p + o, a.g + o, a.m + o, a.v + o, a.mask + o, a.n, a.lr + mb, a.m_scale + mb, a.bc1 + mb,
                   a.bc2 + mb, a.clip + mb, a.beta1, a.beta2, a.eps, a.wd);
}
#endif  // adam_update

// adam_update_members: adam_update whose members each have their own beta1, beta2, eps and wd ([P] arrays
// of adam_update's by-value float; member mb reads element mb): the bits of adam_update alone with them.
// The parameters of cudarl_optim_adam_update_members, passed as one value (cudarl.signatures reads them here).
struct AdamUpdateMembersArgs {
  float* p;
  const float* g;
  float* m;
  float* v;
  const unsigned char* mask;
  i64 n;
  i64 s;
  const float* lr;
  const float* m_scale;
  const float* bc1;
  const float* bc2;
  const float* clip;
  const float* beta1;
  const float* beta2;
  const float* eps;
  const float* wd;
};

#if CUDARL_UNIT_IS(adam_update_members)
extern "C" __global__ void cudarl_optim_adam_update_members(const AdamUpdateMembersArgs a) {
  const i64 mb = blockIdx.y, o = mb * a.s;
  adam_update_impl(a.p + o, a.g + o, a.m + o, a.v + o, a.mask + o, a.n, a.lr + mb, a.m_scale + mb, a.bc1 + mb,
                   a.bc2 + mb, a.clip + mb, a.beta1[mb], a.beta2[mb], a.eps[mb], a.wd[mb]);
}
#endif  // adam_update_members

// ---- adam_update_soft ---------------------------------------------------------------------------
// adam_update, then soft_update of target toward the new p in the same pass:
// target[i] = tau*p[i] + (1 - tau)*target[i] with p[i] the value just stored, one graph node fewer.
// p, m and v are adam_update's bits, and target soft_update's: both spell the sum's rounding out
// (__fmaf_rn of the tau product onto the rounded (1 - tau) product). Left to the compiler, the
// contraction differed between the two kernels by one rounding (the H200 at 18f8334).
// Reads 20*n + n bytes (+24 of scalars), writes 16*n.
// The parameters of cudarl_optim_adam_update_soft, passed as one value (cudarl.signatures reads them here).
struct AdamUpdateSoftArgs {
  float* p;
  const float* g;
  float* m;
  float* v;
  const unsigned char* mask;
  float* target;
  i64 n;
  i64 s;
  const float* lr;
  const float* m_scale;
  const float* bc1;
  const float* bc2;
  const float* clip;
  const float* tau;
  float beta1;
  float beta2;
  float eps;
  float wd;
};

__device__ __forceinline__ void adam_update_soft_impl(float* p, const float* g, float* m, float* v,
                                                      const unsigned char* mask, float* target, i64 n, const float* lr,
                                                      const float* m_scale, const float* bc1, const float* bc2,
                                                      const float* clip, const float* tau, float beta1, float beta2,
                                                      float eps, float wd) {
  const float lr_ = lr[0], ms = m_scale[0], c1 = bc1[0], c2 = bc2[0], cl = clip[0], t = tau[0], u = 1.f - t;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const float pi = adam_elem(p, g, m, v, mask, i, lr_, ms, c1, c2, cl, beta1, beta2, eps, wd);
    target[i] = soft_elem(t, u, pi, target[i]);
  }
}

#if CUDARL_UNIT_IS(adam_update_soft)
extern "C" __global__ void cudarl_optim_adam_update_soft(const AdamUpdateSoftArgs a) {
  const i64 mb = blockIdx.y, o = mb * a.s;
  adam_update_soft_impl(a.p + o, a.g + o, a.m + o, a.v + o, a.mask + o, a.target + o, a.n, a.lr + mb,
                        a.m_scale + mb, a.bc1 + mb, a.bc2 + mb, a.clip + mb, a.tau + mb, a.beta1, a.beta2, a.eps,
                        a.wd);
}
#endif  // adam_update_soft

// adam_update_soft_members: adam_update_soft whose members each have their own beta1, beta2, eps and wd
// ([P] arrays of its by-value float; member mb reads element mb): the bits of adam_update_soft alone with them.
// The parameters of cudarl_optim_adam_update_soft_members, passed as one value (cudarl.signatures reads them here).
struct AdamUpdateSoftMembersArgs {
  float* p;
  const float* g;
  float* m;
  float* v;
  const unsigned char* mask;
  float* target;
  i64 n;
  i64 s;
  const float* lr;
  const float* m_scale;
  const float* bc1;
  const float* bc2;
  const float* clip;
  const float* tau;
  const float* beta1;
  const float* beta2;
  const float* eps;
  const float* wd;
};

#if CUDARL_UNIT_IS(adam_update_soft_members)
extern "C" __global__ void cudarl_optim_adam_update_soft_members(const AdamUpdateSoftMembersArgs a) {
  const i64 mb = blockIdx.y, o = mb * a.s;
  adam_update_soft_impl(a.p + o, a.g + o, a.m + o, a.v + o, a.mask + o, a.target + o, a.n, a.lr + mb,
                        a.m_scale + mb, a.bc1 + mb, a.bc2 + mb, a.clip + mb, a.tau + mb, a.beta1[mb], a.beta2[mb],
                        a.eps[mb], a.wd[mb]);
}
#endif  // adam_update_soft_members

// ---- clip_adam_soft -----------------------------------------------------------------------------
// grad_norm (with its ticket), adam_update_soft and agent's publish in ONE launch, with their bits:
// the last phase of the train step was three graph nodes on the critical path.
//
// grid = G <= kernels.resident_grid_limit() blocks (one per SM at most, for cudarl::grid_barrier),
// block = CAS_THREADS = 1024 = CAS_GROUPS groups of GN_THREADS.
//  1. Stage 1 of grad_norm: the GN_BLOCKS "virtual blocks" of cudarl_optim_grad_norm, CAS_GROUPS at
//     a time per block (virtual block k = base + group, base = blockIdx.x*CAS_GROUPS + r*G*CAS_GROUPS):
//     thread t of virtual block k sums g[i]^2 in double over i = k*256 + t + j*GN_BLOCKS*256,
//     j ascending, then the pairs of block_tree_sum(., GN_THREADS) -> partial[k]: the same bits as
//     gn_block_partial whatever G is. A round whose virtual blocks all start past n writes 0.0,
//     what the tree of zeros gives, without the tree.
//  2. cudarl::grid_barrier(barrier): every partial is written. Then cudarl::last_block(done): the
//     block it picks (every block is past the barrier by then) sets *barrier back to 0; both
//     counters are 0 at launch and left 0.
//  3. Every block reduces the partials read from L2 in grad_norm's last-block order (partial[t] +
//     partial[t + 256], then the 256-slot tree) and gn_norm_scale: the clip scale in every block
//     without a second barrier. Block 0 thread 0 writes norm[0] and scale[0] (as gn_finish does) and
//     publishes: ring[2s] = loss[0], ring[2s + 1] = norm[0], s = step[0] % slots (cudarl_agent_publish;
//     step is Adam's counter, already advanced by lr_schedule).
//  4. adam_update_soft's elements, grid-stride: p, m, v by adam_math, target[i] by the spelled-out
//     soft update. Each thread's first element (i = blockIdx.x*1024 + threadIdx.x, the element it
//     squared first in stage 1 when the round is the first) is loaded before the barrier, so the
//     update's reads overlap stage 1 and the barrier; nothing else in the launch writes it.
// Members (grid.y = P): each member's G blocks run the above on its rows with its own counters
// (done[mb], barrier[mb]: the barrier waits for the member's gridDim.x blocks), so all G*P blocks
// must be resident at once: the launcher keeps G*P <= kernels.resident_grid_limit().
// Reads about 24*n + 8*GN_BLOCKS*G bytes (+ scalars: g for the norm, then p, g, m, v and the target for
// the update; each thread's first element once), writes 16*n + 8*GN_BLOCKS + 16.
#define CAS_THREADS 1024
#define CAS_GROUPS (CAS_THREADS / GN_THREADS)
static_assert(GN_BLOCKS % CAS_GROUPS == 0, "a round of virtual blocks never straddles GN_BLOCKS");

// The body of clip_adam_soft and clip_adam_soft_members, one text for both (max_norm, beta1, beta2, eps and
// wd: by-value in both, clip_adam_soft's arguments, clip_adam_soft_members' element blockIdx.y of theirs): a
// macro, so clip_adam_soft's text and PTX stay as they were.
#define CLIP_ADAM_SOFT_BODY \
  __shared__ double sh[CAS_THREADS];                                                                                 \
  __shared__ float sh_clip;                                                                                          \
  {  /* the member's rows, partials, ring slots and scalars (member 0: the pointers as given) */                     \
    const i64 mb = blockIdx.y, o = mb * s;                                                                           \
    p += o;                                                                                                          \
    g += o;                                                                                                          \
    m += o;                                                                                                          \
    v += o;                                                                                                          \
    mask += o;                                                                                                       \
    target += o;                                                                                                     \
    partial += mb * GN_BLOCKS;                                                                                       \
    ring += mb * 2 * (i64)slots;                                                                                     \
    norm += mb;                                                                                                      \
    scale += mb;                                                                                                     \
    lr += mb;                                                                                                        \
    m_scale += mb;                                                                                                   \
    bc1 += mb;                                                                                                       \
    bc2 += mb;                                                                                                       \
    tau += mb;                                                                                                       \
    loss += mb;                                                                                                      \
    step += mb;                                                                                                      \
    done += mb;                                                                                                      \
    barrier += mb;                                                                                                   \
  }                                                                                                                  \
  const int tid = (int)threadIdx.x, group = tid / GN_THREADS, t = tid % GN_THREADS;                                  \
  const i64 i0 = (i64)blockIdx.x * CAS_THREADS + tid;                                                                \
                                                                                                                     \
/* Everything the update reads but the clip scale, before the barrier. */                                            \
  const float lr_ = lr[0], ms = m_scale[0], c1 = bc1[0], c2 = bc2[0], ta = tau[0], u = 1.f - ta;                     \
  float g0 = 0.f, m0 = 0.f, v0 = 0.f, p0 = 0.f, tg0 = 0.f;                                                           \
  bool decay0 = false;                                                                                               \
  if (i0 < n) {                                                                                                      \
    g0 = CAS_G(i0);                                                                                                  \
    m0 = m[i0];                                                                                                      \
    v0 = v[i0];                                                                                                      \
    p0 = p[i0];                                                                                                      \
    tg0 = target[i0];                                                                                                \
    decay0 = wd != 0.f && mask[i0];                                                                                  \
  }                                                                                                                  \
  float loss0 = 0.f;                                                                                                 \
  i64 step0 = 0;                                                                                                     \
  if (blockIdx.x == 0 && tid == 0) {                                                                                 \
    loss0 = loss[0];                                                                                                 \
    step0 = step[0];                                                                                                 \
  }                                                                                                                  \
                                                                                                                     \
/* 1. grad_norm's partials, CAS_GROUPS virtual blocks per round. */                                                  \
  const i64 span = (i64)GN_BLOCKS * GN_THREADS;                                                                      \
  const int kv = (int)(((n < span ? n : span) + GN_THREADS - 1) / GN_THREADS);  /* virtual blocks with an element */ \
  for (int base = (int)blockIdx.x * CAS_GROUPS; base < GN_BLOCKS; base += (int)gridDim.x * CAS_GROUPS) {             \
    const int k = base + group;                                                                                      \
    if (base >= kv) {  /* uniform over the block: every group of the round sums nothing */                           \
      if (t == 0) partial[k] = 0.0;                                                                                  \
      continue;                                                                                                      \
    }                                                                                                                \
    double acc = 0.0;                                                                                                \
    i64 i = (i64)k * GN_THREADS + t;                                                                                 \
    if (base == (int)blockIdx.x * CAS_GROUPS && i < n) {  /* the first round's first element is i0's */              \
      const double x = (double)g0;                                                                                   \
      acc += x * x;                                                                                                  \
      i += span;                                                                                                     \
    }                                                                                                                \
    for (; i < n; i += span) {                                                                                       \
      const double x = (double)CAS_G(i);                                                                             \
      acc += x * x;                                                                                                  \
    }                                                                                                                \
    __syncthreads();  /* the previous round's tree may still read sh */                                              \
    sh[tid] = acc;                                                                                                   \
    const double sum = tree_gn(sh + group * GN_THREADS, t);                                                          \
    if (t == 0) partial[k] = sum;                                                                                    \
  }                                                                                                                  \
                                                                                                                     \
/* 2. Every partial is written; the block last_block picks resets the barrier's counter. */                          \
  cudarl::grid_barrier(barrier);                                                                                     \
  if (cudarl::last_block(done) && tid == 0) *barrier = 0u;                                                           \
                                                                                                                     \
/* 3. The norm and the clip scale in every block, in grad_norm's order; block 0 publishes. */                        \
  if (tid < GN_THREADS) sh[tid] = cudarl::load_l2(partial + tid) + cudarl::load_l2(partial + tid + GN_THREADS);      \
  const double total = tree_gn(sh, tid);                                                                             \
  if (tid == 0) {                                                                                                    \
    float nf, sf;                                                                                                    \
    gn_norm_scale(total, max_norm, &nf, &sf);                                                                        \
    sh_clip = sf;                                                                                                    \
    if (blockIdx.x == 0) {                                                                                           \
      norm[0] = nf;                                                                                                  \
      scale[0] = sf;                                                                                                 \
      const i64 slot = step0 % slots;                                                                                \
      ring[2 * slot] = loss0;                                                                                        \
      ring[2 * slot + 1] = nf;                                                                                       \
    }                                                                                                                \
  }                                                                                                                  \
  __syncthreads();                                                                                                   \
  const float cl = sh_clip;                                                                                          \
                                                                                                                     \
/* 4. adam_update_soft's elements. */                                                                                \
  const i64 stride = (i64)gridDim.x * CAS_THREADS;                                                                   \
  i64 i = i0;                                                                                                        \
  if (i < n) {                                                                                                       \
    CAS_PUT(i, g0);                                                                                                  \
    const float pi = adam_math(g0, m0, v0, p0, decay0, lr_, ms, c1, c2, cl, beta1, beta2, eps, wd);                  \
    m[i] = m0;                                                                                                       \
    v[i] = v0;                                                                                                       \
    p[i] = pi;                                                                                                       \
    target[i] = soft_elem(ta, u, pi, tg0);                                                                           \
    i += stride;                                                                                                     \
  }                                                                                                                  \
  for (; i < n; i += stride) {                                                                                       \
    const float gi = CAS_G(i);                                                                                       \
    CAS_PUT(i, gi);                                                                                                  \
    const float pi = adam_elem_g(p, gi, m, v, mask, i, lr_, ms, c1, c2, cl, beta1, beta2, eps, wd);                  \
    target[i] = soft_elem(ta, u, pi, target[i]);                                                                     \
  }

// The gradient as clip_adam_soft and clip_adam_soft_members read it (g[i]) and store it (not at all).
#define CAS_G(i) g[i]
#define CAS_PUT(i, x)

#if CUDARL_UNIT_IS(clip_adam_soft)
extern "C" __global__ __launch_bounds__(CAS_THREADS, 1) void cudarl_optim_clip_adam_soft(
    float* p, const float* g, float* m, float* v, const unsigned char* mask, float* target, i64 n, i64 s,
    double* partial, float* norm, float* scale, float max_norm, const float* lr, const float* m_scale,
    const float* bc1, const float* bc2, const float* tau, float* ring, const float* loss, const i64* step, int slots,
    unsigned int* done, unsigned int* barrier, float beta1, float beta2, float eps, float wd) {
  CLIP_ADAM_SOFT_BODY
}
#endif  // clip_adam_soft

// clip_adam_soft_members: clip_adam_soft whose members each have their own clip norm and Adam constants
// (max_norms, beta1s, beta2s, epss, wds: [P] arrays of its by-value float; member mb reads element mb): the
// bits of clip_adam_soft launched alone with them.
#if CUDARL_UNIT_IS(clip_adam_soft_members)
extern "C" __global__ __launch_bounds__(CAS_THREADS, 1) void cudarl_optim_clip_adam_soft_members(
    float* p, const float* g, float* m, float* v, const unsigned char* mask, float* target, i64 n, i64 s,
    double* partial, float* norm, float* scale, const float* max_norms, const float* lr, const float* m_scale,
    const float* bc1, const float* bc2, const float* tau, float* ring, const float* loss, const i64* step, int slots,
    unsigned int* done, unsigned int* barrier, const float* beta1s, const float* beta2s,
    const float* epss, const float* wds) {
  const int mb_ = blockIdx.y;
  const float max_norm = max_norms[mb_], beta1 = beta1s[mb_], beta2 = beta2s[mb_], eps = epss[mb_], wd = wds[mb_];
  CLIP_ADAM_SOFT_BODY
}
#endif  // clip_adam_soft_members

#undef CAS_G
#undef CAS_PUT

// clip_adam_soft_vaccine: clip_adam_soft of Gradient Vaccine's corrected gradient, with vaccine's apply_plus (or
// apply) folded in, one member: every read of g[i] is vaccine_grad's element (g[i] + plus[i] where i < stop,
// then c (f - aux[i]) added on [lo, hi), c = vstate[2], which vaccine's dots_control wrote), and the update's
// pass stores it into g[i], as the apply did (the element is read, then written, by one thread, after the
// grid barrier: every read of g before it is the norm's). The bits of vaccine's apply (apply_plus) followed by
// clip_adam_soft, one node fewer on the step's tail (issue 19). plus and aux: the flat layout (no member axis).
// Reads about 12 n more bytes than clip_adam_soft (plus and aux, twice), writes 4 n more.
#define CAS_G(i) vaccine_grad(g, plus, aux, vc, i, lo, hi, stop)
#define CAS_PUT(i, x) g[i] = (x)

#if CUDARL_UNIT_IS(clip_adam_soft_vaccine)
extern "C" __global__ __launch_bounds__(CAS_THREADS, 1) void cudarl_optim_clip_adam_soft_vaccine(
    float* p, float* g, float* m, float* v, const unsigned char* mask, float* target, i64 n, i64 s,
    double* partial, float* norm, float* scale, float max_norm, const float* lr, const float* m_scale,
    const float* bc1, const float* bc2, const float* tau, float* ring, const float* loss, const i64* step, int slots,
    unsigned int* done, unsigned int* barrier, float beta1, float beta2, float eps, float wd, const float* plus,
    const float* aux, const float* vstate, i64 lo, i64 hi, i64 stop) {
  const float vc = vstate[2];
  CLIP_ADAM_SOFT_BODY
}
#endif  // clip_adam_soft_vaccine

#undef CAS_G
#undef CAS_PUT
#undef CLIP_ADAM_SOFT_BODY

// ---- tau_schedule -----------------------------------------------------------------------------
// One thread per member (block (0, mb)): count += 1; tau = tau_end + (tau_start - tau_end)(1 + cos(pi min(c, T) / T)) / 2, c = count - 1.
namespace {

// One member's tau schedule (count and tau at its slot): the one statement of tau_schedule and tau_schedule_members.
__device__ __forceinline__ void tau_schedule_one(i64* count, float* tau, float tau_start, float tau_end, i64 period) {
  const i64 c1 = count[0] + 1;
  count[0] = c1;
  const i64 c = (c1 - 1) < period ? (c1 - 1) : period;
  const double a = (double)tau_start, b = (double)tau_end;
  tau[0] = (float)(b + 0.5 * (a - b) * (1.0 + cos(PI_D * (double)c / (double)period)));
}

}  // namespace

#if CUDARL_UNIT_IS(tau_schedule)
extern "C" __global__ void cudarl_optim_tau_schedule(i64* count, float* tau, float tau_start, float tau_end, i64 period) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  tau_schedule_one(count + blockIdx.y, tau + blockIdx.y, tau_start, tau_end, period);
}
#endif  // tau_schedule

// ---- tau_schedule_members ---------------------------------------------------------------------
// tau_schedule with each member's own schedule: tau_start, tau_end and period are [P] arrays
// (tau_schedule's by-value types), member mb reading element mb: the bits of tau_schedule alone with
// its values. Reads 24 bytes a member, writes 12.
#if CUDARL_UNIT_IS(tau_schedule_members)
extern "C" __global__ void cudarl_optim_tau_schedule_members(i64* count, float* tau, const float* tau_start,
                                                             const float* tau_end, const i64* period) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const int mb = blockIdx.y;
  tau_schedule_one(count + mb, tau + mb, tau_start[mb], tau_end[mb], period[mb]);
}
#endif  // tau_schedule_members

// ---- soft_update ------------------------------------------------------------------------------
// target = tau*online + (1 - tau)*target, one thread per element; grid.y = members. Reads 8*n + 4,
// writes 4*n (a member).
#if CUDARL_UNIT_IS(soft_update)
extern "C" __global__ void cudarl_optim_soft_update(float* target, const float* online, i64 n, const float* tau, i64 s) {
  const i64 mb = blockIdx.y;
  target += mb * s;
  online += mb * s;
  const float t = tau[mb], u = 1.f - t;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    target[i] = soft_elem(t, u, online[i], target[i]);
}
#endif  // soft_update

// ---- shrink_perturb ---------------------------------------------------------------------------
// theta = lam*theta + sigma*z, z ~ N(0,1) by Box-Muller in double from Philox (seed, counter,
// stream_id): one thread per Philox block k, elements 2k (lanes 0, 1) and 2k+1 (lanes 2, 3).
// Launched ungraphed, at epoch boundaries. Reads and writes 4*n bytes.
#if CUDARL_UNIT_IS(shrink_perturb)
extern "C" __global__ void cudarl_optim_shrink_perturb(float* theta, i64 n, float lam, float sigma,
                                                       unsigned long long seed, unsigned long long counter,
                                                       unsigned int stream_id) {
  const i64 nb = (n + 1) / 2;
  for (i64 k = blockIdx.x * (i64)blockDim.x + threadIdx.x; k < nb; k += (i64)gridDim.x * blockDim.x) {
    const uint4 r = cudarl::philox_block(seed, counter, stream_id, (unsigned int)k);
    const unsigned int u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const i64 i = 2 * k + j;
      if (i >= n) break;
      const double u1 = (double)cudarl::u32_to_uniform(u[2 * j]), u2 = (double)cudarl::u32_to_uniform(u[2 * j + 1]);
      const float z = (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * PI_D * u2));
      theta[i] = lam * theta[i] + sigma * z;
    }
  }
}
#endif  // shrink_perturb

// ======== spectral normalisation (Miyato et al. 2018), an option on chosen linear layers ========
// W [rows, cols] is the raw weight; the layer uses W_sn = W / sigma with sigma = u^T W v.
// The backward treats u and v as constants (as the paper and common implementations do):
// dW = (dW_sn - <dW_sn, W_sn> u v^T) / sigma.

// ---- spectral_power_iter ----------------------------------------------------------------------
// One block of 1024 threads (fixed, so the reductions have one shape). With iterate != 0:
// v = normalize(W^T u) (thread per column, i ascending), wv = W v (warp per row, xor tree),
// u = wv / ||wv||; without it u and v are kept. Always sigma = u . wv (fixed tree, double).
// Reads 8*rows*cols bytes at most, writes 4*(2*rows + cols + 1).
#if CUDARL_UNIT_IS(spectral_power_iter)
extern "C" __global__ __launch_bounds__(1024) void cudarl_optim_spectral_power_iter(const float* W, float* u, float* v,
                                                                                   float* wv, float* sigma, i64 rows,
                                                                                   i64 cols, int iterate) {
  __shared__ double sh[1024];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  if (iterate) {
    double ss = 0.0;
    for (i64 j = t; j < cols; j += 1024) {
      float acc = 0.f;
      for (i64 i = 0; i < rows; ++i) acc += W[i * cols + j] * u[i];
      v[j] = acc;
      ss += (double)acc * (double)acc;
    }
    sh[t] = ss;
    cudarl::block_tree_sum(sh, 1024);
    const double nv = sqrt(sh[0]);
    __syncthreads();
    for (i64 j = t; j < cols; j += 1024) v[j] = (float)((double)v[j] / nv);
    __syncthreads();
  }
  for (i64 i = warp; i < rows; i += 32) {
    float acc = 0.f;
    for (i64 j = lane; j < cols; j += 32) acc += W[i * cols + j] * v[j];
    acc = cudarl::warp_sum(acc);
    if (lane == 0) wv[i] = acc;
  }
  __syncthreads();
  if (iterate) {
    double ss = 0.0;
    for (i64 i = t; i < rows; i += 1024) ss += (double)wv[i] * (double)wv[i];
    sh[t] = ss;
    cudarl::block_tree_sum(sh, 1024);
    const double nw = sqrt(sh[0]);
    __syncthreads();
    for (i64 i = t; i < rows; i += 1024) u[i] = (float)((double)wv[i] / nw);
    __syncthreads();
  }
  double d = 0.0;
  for (i64 i = t; i < rows; i += 1024) d += (double)u[i] * (double)wv[i];
  sh[t] = d;
  cudarl::block_tree_sum(sh, 1024);
  if (t == 0) sigma[0] = (float)sh[0];
}
#endif  // spectral_power_iter

// ---- spectral_scale ---------------------------------------------------------------------------
// w_sn = W / sigma, one thread per element. Reads 4*n + 4, writes 4*n.
#if CUDARL_UNIT_IS(spectral_scale)
extern "C" __global__ void cudarl_optim_spectral_scale(const float* W, const float* sigma, float* w_sn, i64 n) {
  const float s = sigma[0];
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) w_sn[i] = W[i] / s;
}
#endif  // spectral_scale

// ---- spectral_dot_partial -----------------------------------------------------------------------
// Stage 1 of <dW_sn, W_sn>: same mapping as grad_norm_partial. Reads 8*n, writes 8*GN_BLOCKS.
#if CUDARL_UNIT_IS(spectral_dot_partial)
extern "C" __global__ __launch_bounds__(GN_THREADS) void cudarl_optim_spectral_dot_partial(const float* a, const float* b,
                                                                                          double* partial, i64 n) {
  __shared__ double sh[GN_THREADS];
  double acc = 0.0;
  for (i64 i = (i64)blockIdx.x * GN_THREADS + threadIdx.x; i < n; i += (i64)GN_BLOCKS * GN_THREADS)
    acc += (double)a[i] * (double)b[i];
  sh[threadIdx.x] = acc;
  cudarl::block_tree_sum(sh, GN_THREADS);
  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}
#endif  // spectral_dot_partial

// ---- spectral_backward ------------------------------------------------------------------------
// Every block reduces the GN_BLOCKS partials with one fixed tree (so all blocks agree), then
// dW[i, j] = (dW_sn[i, j] - (c u[i]) v[j]) / sigma over a grid-stride loop. block = GN_THREADS.
// Reads 4*n + 8*GN_BLOCKS per block + 4*(rows + cols + 1), writes 4*n.
#if CUDARL_UNIT_IS(spectral_backward)
extern "C" __global__ __launch_bounds__(GN_THREADS) void cudarl_optim_spectral_backward(const float* dw_sn, const float* u,
                                                                                       const float* v, const float* sigma,
                                                                                       const double* partial, float* dW,
                                                                                       i64 rows, i64 cols) {
  __shared__ double sh[GN_THREADS];
  sh[threadIdx.x] = partial[threadIdx.x] + partial[threadIdx.x + GN_THREADS];
  cudarl::block_tree_sum(sh, GN_THREADS);
  const float c = (float)sh[0], s = sigma[0];
  const i64 n = rows * cols;
  for (i64 k = blockIdx.x * (i64)blockDim.x + threadIdx.x; k < n; k += (i64)gridDim.x * blockDim.x) {
    const i64 i = k / cols, j = k % cols;
    dW[k] = (dw_sn[k] - (c * u[i]) * v[j]) / s;
  }
}
#endif  // spectral_backward
