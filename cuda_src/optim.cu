// Optimiser kernels over flat parameter buffers.
// Twin: cudarl/reference/optim.py. Launchers: cudarl/ops/optim.py. Tests: tests/parity/test_optim.py.
//
// Device scalars (step, lr, bias corrections, clip scale, tau) are 1-element buffers: the
// schedule kernels advance counters on the device, so a replayed graph sees the new values.
// The gradient norm is a two-stage, fixed-order reduction in double: bitwise reproducible.
#include <cudarl/philox.cuh>

typedef long long i64;

#define GN_BLOCKS 512
#define GN_THREADS 256
#define PI_D 3.141592653589793

namespace {

// Fixed-shape tree over sh[0 .. n) (n a power of two, n == blockDim.x); result in sh[0].
__device__ __forceinline__ void block_tree(double* sh, int n) {
  for (int s = n >> 1; s > 0; s >>= 1) {
    __syncthreads();
    if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
  }
  __syncthreads();
}

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
// grid = GN_BLOCKS, block = GN_THREADS. Thread (k, t) sums g[i]^2 in double over
// i = k*256 + t + j*GN_BLOCKS*256 (j ascending), then a fixed tree per block -> partial[k].
// Reads 4*n bytes, writes 8*GN_BLOCKS.
extern "C" __global__ void __launch_bounds__(GN_THREADS) cudarl_optim_grad_norm_partial(const float* g, double* partial, i64 n) {
  __shared__ double sh[GN_THREADS];
  double acc = 0.0;
  for (i64 i = (i64)blockIdx.x * GN_THREADS + threadIdx.x; i < n; i += (i64)GN_BLOCKS * GN_THREADS) {
    const double x = (double)g[i];
    acc += x * x;
  }
  sh[threadIdx.x] = acc;
  block_tree(sh, GN_THREADS);
  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

// ---- grad_norm_finalize ---------------------------------------------------------------------
// One block of GN_BLOCKS threads: fixed tree over the partials; norm = sqrt(sum);
// scale = max_norm / (norm + 1e-6) when that is below 1 and max_norm > 0, else 1.
// Reads 8*GN_BLOCKS bytes, writes 8.
extern "C" __global__ void __launch_bounds__(GN_BLOCKS) cudarl_optim_grad_norm_finalize(const double* partial, float* norm,
                                                                                       float* scale, float max_norm) {
  __shared__ double sh[GN_BLOCKS];
  sh[threadIdx.x] = partial[threadIdx.x];
  block_tree(sh, GN_BLOCKS);
  if (threadIdx.x == 0) {
    const double nd = sqrt(sh[0]);
    norm[0] = (float)nd;
    const double denom = nd + 1e-6;
    scale[0] = (max_norm > 0.f && denom > (double)max_norm) ? (float)((double)max_norm / denom) : 1.f;
  }
}

// ---- lr_schedule ------------------------------------------------------------------------------
// One thread: step += 1 (t = step), lr = schedule(t - 1), m_scale (warm restarts), bias
// corrections bc1 = 1 - beta1^t, bc2 = 1 - beta2^t, all in double, rounded once.
extern "C" __global__ void cudarl_optim_lr_schedule(i64* step, float* lr, float* m_scale, float* bc1, float* bc2,
                                                    int kind, float lr_max, float lr_min, i64 warmup, i64 period, i64 mult,
                                                    float restart_m_scale, float beta1, float beta2) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const i64 t = step[0] + 1;
  step[0] = t;
  bool restart;
  lr[0] = (float)schedule_lr(t - 1, kind, (double)lr_max, (double)lr_min, warmup, period, mult, &restart);
  m_scale[0] = restart ? restart_m_scale : 1.f;
  bc1[0] = (float)(1.0 - pow((double)beta1, (double)t));
  bc2[0] = (float)(1.0 - pow((double)beta2, (double)t));
}

// ---- adam_update ------------------------------------------------------------------------------
// One thread per element, grid-stride. g' = clip*g; m = b1*(m_scale*m) + (1-b1)*g';
// v = b2*v + (1-b2)*g'^2; p -= lr*wd*p where mask; p -= lr*(m/bc1)/(sqrt(v/bc2) + eps).
// Reads 16*n + n bytes (+20 of scalars), writes 12*n.
extern "C" __global__ void cudarl_optim_adam_update(float* p, const float* g, float* m, float* v, const unsigned char* mask,
                                                    i64 n, const float* lr, const float* m_scale, const float* bc1,
                                                    const float* bc2, const float* clip, float beta1, float beta2,
                                                    float eps, float wd) {
  const float lr_ = lr[0], ms = m_scale[0], c1 = bc1[0], c2 = bc2[0], cl = clip[0];
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const float gi = g[i] * cl;
    const float mi = beta1 * (ms * m[i]) + (1.f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.f - beta2) * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    float pi = p[i];
    if (wd != 0.f && mask[i]) pi = pi - lr_ * wd * pi;
    p[i] = pi - lr_ * ((mi / c1) / (sqrtf(vi / c2) + eps));
  }
}

// ---- tau_schedule -----------------------------------------------------------------------------
// One thread: count += 1; tau = tau_end + (tau_start - tau_end)(1 + cos(pi min(c, T) / T)) / 2, c = count - 1.
extern "C" __global__ void cudarl_optim_tau_schedule(i64* count, float* tau, float tau_start, float tau_end, i64 period) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const i64 c1 = count[0] + 1;
  count[0] = c1;
  const i64 c = (c1 - 1) < period ? (c1 - 1) : period;
  const double a = (double)tau_start, b = (double)tau_end;
  tau[0] = (float)(b + 0.5 * (a - b) * (1.0 + cos(PI_D * (double)c / (double)period)));
}

// ---- soft_update ------------------------------------------------------------------------------
// target = tau*online + (1 - tau)*target, one thread per element. Reads 8*n + 4, writes 4*n.
extern "C" __global__ void cudarl_optim_soft_update(float* target, const float* online, i64 n, const float* tau) {
  const float t = tau[0], u = 1.f - t;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    target[i] = t * online[i] + u * target[i];
}

// ---- shrink_perturb ---------------------------------------------------------------------------
// theta = lam*theta + sigma*z, z ~ N(0,1) by Box-Muller in double from Philox (seed, counter,
// stream_id): one thread per Philox block k, elements 2k (lanes 0, 1) and 2k+1 (lanes 2, 3).
// Launched ungraphed, at epoch boundaries. Reads and writes 4*n bytes.
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
