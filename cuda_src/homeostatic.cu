// Homeostatic regulariser on C51 atom utilisation (agent.aux = ["homeostatic"]).
// Twin: cudarl/reference/homeostatic.py (the equations and the summation order). Launchers:
// cudarl/ops/homeostatic.py. Two launches on the MLP step's chain (issue 19: each graph node costs its
// launch latency, and these are tiny kernels), no float atomics, every reduction in one fixed order:
//   probs_control: the softmax rows, each block's column sums of its rows, and in the block that
//                  finishes last (an integer ticket) the batch-mean masses m, H, u, the loss and g;
//   grad_dueling:  the logits' gradient, through the dueling combine, added onto the head's dL/dva.

#include <cudarl/reduce.cuh>
#include <cudarl/softmax.cuh>

#define HS_WARP 32
#define HS_THREADS 256
#define HS_ROWS 8  // rows a block of probs_control: one warp a row
#define HS_MAXA 32  // actions a sample of grad_dueling (a warp's shared slots)
#define HS_TINY 1e-30f

static_assert(HS_ROWS * HS_WARP == HS_THREADS, "probs_control: one warp a row");

// sum_{i = first, first + step, ... < end} base[i * stride], read from L2 (cudarl::load_l2), added in that order.
// The loads go out HS_BATCH at a time before their adds: load_l2 is volatile asm, kept in program order, and a loop
// of `acc += load_l2(...)` waited for each load before issuing the next (about 39 dependent L2 round trips a thread
// in the last block at the MLP's 192 blocks: homeostatic alone measured 5 us slower than its four launches, H100,
// 87a1f0f). The same terms in the same order: the same bits.
#define HS_BATCH 8
__device__ __forceinline__ float hs_sum_l2(const float* base, long long stride, int first, int end, int step) {
  float acc = 0.f;
  for (int i = first; i < end; i += HS_BATCH * step) {
    float v[HS_BATCH];
#pragma unroll
    for (int u = 0; u < HS_BATCH; ++u) v[u] = i + u * step < end ? cudarl::load_l2(base + (i + u * step) * stride) : 0.f;
#pragma unroll
    for (int u = 0; u < HS_BATCH; ++u)
      if (i + u * step < end) acc += v[u];
  }
  return acc;
}

// ---------------------------------------------------------------------------------------------
// cudarl_homeostatic_probs_control: the forward and the control in one launch.
//   p[r, :] = softmax(logits[r, :])                                   (a warp a row, as qstats)
//   part[i, k] = sum_{j < HS_ROWS} p[HS_ROWS i + j, k]               (block i's rows, in row order)
//   m_k = (sum_q sum_{i = q mod S} part[i, k]) / R                   (the last block: S slices of the
//         partials, S = max(1, HS_THREADS / K), each slice's i in ascending order, then the slices in
//         order: S threads a column keep that block's loads in flight)
//   H = -sum_k m_k log m_k, u = exp(H)/K, loss = w (u - u*)^2, g_k = 2 w (u - u*) u (-log m_k - 1);
//   state = [loss, u, H] (the last block, as the former one-block control kernel).
// Every sum starts from 0 and adds in the order above (the twin's mass, bit for bit given p). The block
// that finishes last is picked by cudarl::last_block on the ticket *done (0 at launch, left 0).
// Threads: HS_THREADS a block, ceil(R / HS_ROWS) blocks. Reads R*K floats (+ R*K from L1 for the block
// sums, + NB*K by the last block); writes R*K + NB*K + 2K + 3.
extern "C" __global__ void cudarl_homeostatic_probs_control(const float* __restrict__ logits, float* __restrict__ p,
                                                            float* __restrict__ part, float* __restrict__ m,
                                                            float* __restrict__ g, float* __restrict__ state,
                                                            unsigned int* __restrict__ done, int R, int K, float target,
                                                            float weight) {
  __shared__ float sh[HS_THREADS];
  const int lane = threadIdx.x % HS_WARP;
  const int r0 = blockIdx.x * HS_ROWS;
  const int r = r0 + threadIdx.x / HS_WARP;
  if (r < R) {  // no return: every thread reaches the barriers below
    float* out = p + (long long)r * K;
    cudarl::warp_softmax_visit(logits + (long long)r * K, K, lane, [&](int k, float, float pk) { out[k] = pk; });
  }
  __syncthreads();  // the block's rows of p, each written by its warp, seen by every thread of the block
  const int rows = min(HS_ROWS, R - r0);
  for (int k = threadIdx.x; k < K; k += HS_THREADS) {
    float v[HS_ROWS];  // the rows' loads all in flight before the first add (the adds in row order)
#pragma unroll
    for (int j = 0; j < HS_ROWS; ++j) v[j] = j < rows ? p[(long long)(r0 + j) * K + k] : 0.f;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < HS_ROWS; ++j)
      if (j < rows) acc += v[j];
    part[(long long)blockIdx.x * K + k] = acc;
  }
  if (!cudarl::last_block(done)) return;

  // the last block: the masses from every block's partials (written before their tickets: read from L2)
  const int nb = (int)gridDim.x;
  const int S = max(1, HS_THREADS / K);
  const float fr = (float)R;
  if (S == 1) {
    for (int k = threadIdx.x; k < K; k += HS_THREADS) m[k] = hs_sum_l2(part + k, K, 0, nb, 1) / fr;
  } else {  // S * K <= HS_THREADS: thread c = q K + k sums slice q of column k
    const int c = threadIdx.x;
    if (c < S * K) {
      const int q = c / K, k = c % K;
      sh[c] = hs_sum_l2(part + k, K, q, nb, S);
    }
    __syncthreads();
    if (c < K) {
      float acc = 0.f;
      for (int q = 0; q < S; ++q) acc += sh[q * K + c];
      m[c] = acc / fr;
    }
  }
  __syncthreads();  // m, written by this block, read by all of it (block_sum's first barrier frees sh)

  float acc = 0.f;
  for (int k = threadIdx.x; k < K; k += HS_THREADS) {
    const float mk = m[k];
    acc -= mk * logf(fmaxf(mk, HS_TINY));
  }
  const float H = cudarl::block_sum(acc, sh, HS_THREADS);
  const float u = expf(H) / (float)K;
  const float err = u - target;
  const float coef = 2.f * weight * err * u;
  for (int k = threadIdx.x; k < K; k += HS_THREADS) g[k] = coef * (-logf(fmaxf(m[k], HS_TINY)) - 1.f);
  if (threadIdx.x == 0) {
    state[0] = weight * err * err;
    state[1] = u;
    state[2] = H;
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_homeostatic_grad_dueling: the loss's gradient on the logits, d[b, a, z] = dL/dlogits[b, a, z]
// = (1/R) p[b, a, z] (g_z - s_a), s_a = sum_k p[b, a, k] g_k (R = B A), taken through the dueling
// combine and added onto the head's raw gradient dva [B, (1 + A) K]:
//   dva[b, z] += sum_a d[b, a, z] (in order),  dva[b, (1 + a) K + z] += d[b, a, z] - (sum_a d) / A
// (cudarl::dueling_backward_atom's roundings). One launch instead of a grad kernel into a [B, A, K]
// buffer and nn.dueling_backward over it: d stays in registers, and it has their bits (d is rounded
// once by __fmul_rn, as storing it did: no FMA contraction into the sums).
// Threads: one warp per sample b, HS_THREADS a block (s_a in a warp's shared slots, A <= HS_MAXA);
// each (b, z) is one lane's, so the adds have no race. Reads 3*A*K floats of p a sample (the last two
// passes from L1), K of g and (1+A)*K of dva; writes (1+A)*K.
extern "C" __global__ void cudarl_homeostatic_grad_dueling(const float* __restrict__ p, const float* __restrict__ g,
                                                           float* __restrict__ dva, int B, int A, int K) {
  __shared__ float s_warp[HS_THREADS / HS_WARP][HS_MAXA];
  const int lane = threadIdx.x % HS_WARP, w = threadIdx.x / HS_WARP;
  const int b = blockIdx.x * (blockDim.x / HS_WARP) + w;
  if (b >= B) return;
  const float* pb = p + (long long)b * A * K;
  for (int a = 0; a < A; ++a) {
    const float* pr = pb + (long long)a * K;
    float s = 0.f;
    for (int k = lane; k < K; k += HS_WARP) s += pr[k] * g[k];
    s = cudarl::warp_sum(s);
    if (lane == 0) s_warp[w][a] = s;
  }
  __syncwarp();
  const float inv_r = 1.f / (float)(B * A);
  float* out = dva + (long long)b * (1 + A) * K;
  for (int z = lane; z < K; z += HS_WARP) {
    const float gz = g[z];
    float sum = __fmul_rn(pb[z] * (gz - s_warp[w][0]), inv_r);
    for (int a = 1; a < A; ++a) sum += __fmul_rn(pb[(long long)a * K + z] * (gz - s_warp[w][a]), inv_r);
    const float mean = sum / (float)A;
    out[z] = out[z] + sum;
    for (int a = 0; a < A; ++a) {
      const float d = __fmul_rn(pb[(long long)a * K + z] * (gz - s_warp[w][a]), inv_r);
      out[(1 + a) * K + z] = out[(1 + a) * K + z] + (d - mean);
    }
  }
}
