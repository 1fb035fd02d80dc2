// Quantile losses: IQN (Dabney et al. 2018b) with Philox-sampled tau, and QR-DQN (Dabney et al.
// 2018a) with fixed tau_i = (2i + 1) / 2N. Twin: cudarl/reference/quantile.py.
// Launchers: cudarl/ops/quantile.py.
//
// Layout: theta [B, N, A] quantile values (the IQN head's output, action fastest), actions int32
// [B], targets [B, M], taus [B, N] (tau_stride = N) or [N] shared by all samples (tau_stride = 0).
// Per-sample ops map ONE WARP TO ONE SAMPLE with xor-butterfly sums (fixed order, every lane
// gets the same bits). The batch mean is one block's fixed-order tree; the only atomic is the
// integer ticket of cudarl::last_block (reduce.cuh). A sample's theta is one contiguous run of
// N*A floats; a column theta[b, :, a] is read with stride A, so a warp's load spans 32*A contiguous floats
// (A cache lines for the small A of trading) and the A column passes share them through L1:
// DRAM traffic stays one read of the sample. Full-row writes walk the flat index (coalesced).
#include <cudarl/philox.cuh>
#include <cudarl/reduce.cuh>

#define Q_WARP 32
#define Q_NAN __int_as_float((int)0x7fffffffu)

namespace {
using cudarl::warp_sum;
}  // namespace

// ---------------------------------------------------------------------------------------------
// cudarl_quantile_sample_taus: tau[i] = uniform draw i of Philox stream (seed, counter[0], stream_id).
// The counter is read from device memory, so each replay draws fresh taus once the counter moves.
// Threads: one per Philox block of 4 draws. Reads 8 bytes; writes n floats.
extern "C" __global__ void cudarl_quantile_sample_taus(unsigned long long seed, const unsigned long long* __restrict__ counter,
                                                       unsigned int stream_id, float* __restrict__ taus, long long n) {
  const long long blk = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long i0 = blk * 4;
  if (i0 >= n) return;
  const uint4 v = cudarl::philox_block(seed, counter[0], stream_id, (unsigned int)blk);
  const unsigned int lanes[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int l = 0; l < 4; ++l)
    if (i0 + l < n) taus[i0 + l] = cudarl::u32_to_uniform(lanes[l]);
}

// ---------------------------------------------------------------------------------------------
// cudarl_quantile_targets: double-DQN quantile targets, online and target [B, M, A].
//   a*_b = argmax_a (1/M) sum_j online[b,j,a] (first max on ties); T_bj = r_b + d_b target[b,j,a*]
// Threads: one warp per sample, lanes over j (stride-A column reads, see the layout note).
// Reads M*A + M + 2 floats; writes M floats + 1 int.
extern "C" __global__ void cudarl_quantile_targets(const float* __restrict__ online, const float* __restrict__ target,
                                                   const float* __restrict__ r_t, const float* __restrict__ discount_t,
                                                   float* __restrict__ out, int* __restrict__ a_star, int B, int A, int M) {
  const int lane = threadIdx.x % Q_WARP;
  const int b = blockIdx.x * (blockDim.x / Q_WARP) + threadIdx.x / Q_WARP;
  if (b >= B) return;
  const float* x = online + (long long)b * M * A;
  int best = 0;
  float best_q = 0.f;
  for (int a = 0; a < A; ++a) {
    float acc = 0.f;
    for (int j = lane; j < M; j += Q_WARP) acc += x[(long long)j * A + a];
    const float q = warp_sum(acc) / (float)M;
    if (a == 0 || q > best_q) { best_q = q; best = a; }
  }
  const float r = r_t[b], d = discount_t[b];
  const float* y = target + (long long)b * M * A + best;
  for (int j = lane; j < M; j += Q_WARP) out[(long long)b * M + j] = r + d * y[(long long)j * A];
  if (lane == 0) a_star[b] = best;
}

// ---------------------------------------------------------------------------------------------
// cudarl_quantile_huber_loss: quantile Huber loss, its gradient wrt theta [B, N, A] and the
// importance-weighted batch mean, in one launch.
//   delta_ij = T_j - theta_i,  theta_i = theta[b,i,a_b],  rho(delta) = |tau_i - 1{delta < 0}| H(delta) / kappa,
//   H(delta) = delta^2 / 2 if |delta| <= kappa else kappa (|delta| - kappa / 2);  kappa = 0: rho = |tau - 1{delta<0}| |delta|
//   L_b = sum_i (1/M) sum_j rho(delta_ij)
//   grad[b,i,a_b] = -(w_b / B)(1/M) sum_j |tau_i - 1{delta_ij < 0}| psi(delta_ij),
//   psi = clip(delta, -kappa, kappa) / kappa  (sign(delta) when kappa = 0); grad[b,i,a] = 0 for a != a_b.
//   loss[0] = scale * sum_b w_b L_b   (scale = 1 / B from the launcher)
// Threads: one warp per sample; lane owns quantiles i = lane, lane + 32, ... and loops j in order;
// the zeros of the other actions are written over the flat index k = i*A + a (coalesced), the
// chosen column with stride A: each element has exactly one writer. The block that finishes
// last (cudarl::last_block on the integer ticket *done, 0 at launch and left 0) sums loss_per in
// the fixed order of cudarl::block_weighted_sum<Q_MEAN_SLOTS>, whichever block that is.
// Reads N + M + N taus + 2 floats per sample (+ 2B by the last block); writes N*A + 1 floats
// per sample and 1.
#define Q_MEAN_SLOTS 256
namespace {
__device__ __forceinline__ void huber_row(const float* theta_b, int act, const float* T, const float* tau, float w,
                                          float* g, float* loss_b, int B, int A, int N, int M, float kappa, int lane) {
  const long long NA = (long long)N * A;
  if (act < 0 || act >= A) {
    for (long long k = lane; k < NA; k += Q_WARP) g[k] = 0.f;
    if (lane == 0) *loss_b = Q_NAN;
    return;
  }
  for (long long k = lane; k < NA; k += Q_WARP)
    if (k % A != act) g[k] = 0.f;
  const float* th = theta_b + act;  // column a_b: th[i * A]
  const float scale = w / (float)B / (float)M;
  float total = 0.f;
  for (int i = lane; i < N; i += Q_WARP) {
    const float ti = tau[i], q = th[(long long)i * A];
    float li = 0.f, gi = 0.f;
    for (int j = 0; j < M; ++j) {
      const float delta = T[j] - q;
      const float wgt = delta < 0.f ? 1.f - ti : ti;  // |tau - 1{delta < 0}|
      const float ad = fabsf(delta);
      float rho, psi;
      if (kappa > 0.f) {
        rho = ad <= kappa ? 0.5f * delta * delta / kappa : ad - 0.5f * kappa;
        psi = fminf(fmaxf(delta, -kappa), kappa) / kappa;
      } else {
        rho = ad;
        psi = delta > 0.f ? 1.f : (delta < 0.f ? -1.f : 0.f);
      }
      li += wgt * rho;
      gi += wgt * psi;
    }
    total += li;
    g[(long long)i * A + act] = -scale * gi;
  }
  total = warp_sum(total);
  if (lane == 0) *loss_b = total / (float)M;
}
}  // namespace

extern "C" __global__ void cudarl_quantile_huber_loss(const float* __restrict__ theta, const int* __restrict__ actions,
                                                      const float* __restrict__ target, const float* __restrict__ taus,
                                                      const float* __restrict__ weights, float* __restrict__ loss_per,
                                                      float* __restrict__ grad, float* __restrict__ loss,
                                                      unsigned int* __restrict__ done, int B, int A, int N, int M,
                                                      int tau_stride, float kappa, float scale) {
  __shared__ float part[Q_MEAN_SLOTS];
  const int lane = threadIdx.x % Q_WARP;
  const int b = blockIdx.x * (blockDim.x / Q_WARP) + threadIdx.x / Q_WARP;
  const long long NA = (long long)N * A;
  if (b < B)  // no return: every thread reaches last_block()
    huber_row(theta + (long long)b * NA, actions[b], target + (long long)b * M, taus + (long long)b * tau_stride, weights[b],
              grad + (long long)b * NA, loss_per + b, B, A, N, M, kappa, lane);
  if (cudarl::last_block(done)) {
    const float sum = cudarl::block_weighted_sum<Q_MEAN_SLOTS>(loss_per, weights, B, part);
    if (threadIdx.x == 0) loss[0] = scale * sum;
  }
}
