// Q statistics of a head for the host (DESIGN rule 8 observables: metrics.jsonl's atom_entropy,
// atom_utilisation, q_var; the guard's collapse rule). Twin: cudarl/reference/qstats.py.
// Launchers: cudarl/ops/qstats.py.
//
// Two stages, no atomics: per_sample (C51) writes per-sample rows into scratch buffers; reduce (A + 2
// blocks, each one statistic family in a fixed order) writes out [2A + 2] = {mean_b Q[b, a] (A), mean
// entropy, utilisation, var_b Q[b, a] (A)}. moments is reduce's Q half for a head without atoms (IQN,
// QR-DQN): entropy and utilisation are NaN. expected_q is per_sample's Q alone (evaluation and policies
// read nothing else).
//
// Why A + 2 blocks and not one: one block ran the A moments, the entropy and the K atom columns one
// after another (~2A + 1 + K block trees, 56.6 us on an H200 at B = 512, K = 51), longer than the
// backward and the optimiser it runs beside, so it became the train graph's critical path. Each block
// below computes exactly what the one block computed for its statistic, in the same order (the same
// bits for the means, variances and entropy); the utilisation block gives each warp whole atom columns.
//
// The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 4):
// per_sample and reduce take blockIdx.y as the member mb. Each row family advances by mb times its
// stride argument, in elements: s_l the logits ([B, A, K]), s_z the support ([K]; 0: one support for
// every member), s_q the Q rows ([B, A]), s_e the entropies ([B]), s_m the atom masses ([B, K]); the
// statistics vector out by mb * (2A + 2) ([P, 2A + 2]). The x grid, the block, each thread's work
// and every reduction's order are the single launch's, so member mb gets the bits of a single launch
// on its rows; one member (gridDim.y = 1, mb = 0: every offset zero) is the single launch.

#include <cudarl/reduce.cuh>
#include <cudarl/softmax.cuh>

#define QS_WARP 32
#define QS_THREADS 256

namespace {
using cudarl::warp_sum;

// out[a] = mean_b q[b, a], out[A + 2 + a] = (1/B) sum_b (q[b, a] - mean)^2 (two passes) for one action
// a, each a strided per-thread sum then a shared tree (fixed order). Call from every thread of a
// QS_THREADS block.
__device__ __forceinline__ void q_moments(const float* __restrict__ q, float* __restrict__ out, int B, int A, int a,
                                          float* sh) {
  const int t = threadIdx.x;
  const float inv_b = 1.f / (float)B;
  float acc = 0.f;
  for (int b = t; b < B; b += QS_THREADS) acc += q[(long long)b * A + a];
  const float mean = cudarl::block_sum(acc, sh, QS_THREADS) * inv_b;
  float acc2 = 0.f;
  for (int b = t; b < B; b += QS_THREADS) { const float d = q[(long long)b * A + a] - mean; acc2 += d * d; }
  const float var = cudarl::block_sum(acc2, sh, QS_THREADS) * inv_b;
  if (t == 0) { out[a] = mean; out[A + 2 + a] = var; }
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// cudarl_qstats_per_sample: p = softmax(logits[b, a]);
//   q[b, a] = sum_k p_k z_k;  ent[b] = (1/A) sum_a -sum_k p_k log p_k;  mass[b, k] = (1/A) sum_a p_k
// Threads: one warp per sample, lanes over atoms; grid.y = members. Reads A*K + K floats; writes
// A + 1 + K (a sample).
extern "C" __global__ void cudarl_qstats_per_sample(const float* __restrict__ logits, const float* __restrict__ support,
                                                    float* __restrict__ q, float* __restrict__ ent,
                                                    float* __restrict__ mass, int B, int A, int K, long long s_l,
                                                    long long s_z, long long s_q, long long s_e, long long s_m) {
  const int lane = threadIdx.x % QS_WARP;
  const int b = blockIdx.x * (blockDim.x / QS_WARP) + threadIdx.x / QS_WARP;
  if (b >= B) return;
  const long long mb = blockIdx.y;
  logits += mb * s_l;
  support += mb * s_z;
  q += mb * s_q;
  ent += mb * s_e;
  mass += mb * s_m;
  float h_sum = 0.f;
  for (int k = lane; k < K; k += QS_WARP) mass[(long long)b * K + k] = 0.f;
  for (int a = 0; a < A; ++a) {
    float qa = 0.f, ha = 0.f;
    cudarl::warp_softmax_visit(logits + ((long long)b * A + a) * K, K, lane, [&](int k, float lp, float p) {
      qa += p * support[k];  // agent.act_c51 computes q with this same statement: the same bits
      ha -= p * lp;
      mass[(long long)b * K + k] += p / (float)A;  // each element owned by one lane: no race
    });
    qa = warp_sum(qa);
    h_sum += warp_sum(ha);
    if (lane == 0) q[(long long)b * A + a] = qa;
  }
  if (lane == 0) ent[b] = h_sum / (float)A;
}

// ---------------------------------------------------------------------------------------------
// cudarl_qstats_reduce: A + 2 blocks of QS_THREADS, no atomics. Block a < A: the moments of action
// a (q_moments). Block A: the mean entropy, a strided per-thread sum then a shared tree. Block A + 1:
// utilisation = (1/K) #{k : (1/B) sum_b mass[b, k] > 1/(10K)}, warp w summing columns k = w, w + 8,
// ... over b (lane-strided, then warp_sum: a fixed order), the count a block tree of integers.
// var is the population variance (1/B) sum_b (Q[b, a] - mean_a)^2 (two passes).
// grid.y = members. Reads 2*B*A + B + B*K floats (Q twice for the two-pass variance); writes 2A + 2
// (a member).
extern "C" __global__ void cudarl_qstats_reduce(const float* __restrict__ q, const float* __restrict__ ent,
                                                const float* __restrict__ mass, float* __restrict__ out,
                                                int B, int A, int K, long long s_q, long long s_e, long long s_m) {
  __shared__ float sh[QS_THREADS];
  const long long mb = blockIdx.y;
  q += mb * s_q;
  ent += mb * s_e;
  mass += mb * s_m;
  out += mb * (2 * A + 2);
  const int t = threadIdx.x;
  const float inv_b = 1.f / (float)B;
  if ((int)blockIdx.x < A) {
    q_moments(q, out, B, A, (int)blockIdx.x, sh);
  } else if ((int)blockIdx.x == A) {
    float acc = 0.f;
    for (int b = t; b < B; b += QS_THREADS) acc += ent[b];
    const float h = cudarl::block_sum(acc, sh, QS_THREADS) * inv_b;
    if (t == 0) out[A] = h;
  } else {
    const int lane = t % QS_WARP, warp = t / QS_WARP;
    const float thresh = 1.f / (10.f * (float)K);
    float used = 0.f;  // a small integer count: exact in float
    for (int k = warp; k < K; k += QS_THREADS / QS_WARP) {
      float m = 0.f;
      for (int b = lane; b < B; b += QS_WARP) m += mass[(long long)b * K + k];
      const float col = warp_sum(m) * inv_b;
      used += (lane == 0 && col > thresh) ? 1.f : 0.f;
    }
    const float n_used = cudarl::block_sum(used, sh, QS_THREADS);
    if (t == 0) out[A + 1] = n_used / (float)K;
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_qstats_moments: reduce's Q half for a head without atoms (IQN, QR-DQN quantile means):
// out[:A] = mean_b q, out[A + 2:] = var_b q as reduce writes them; out[A] = out[A + 1] = NaN (no
// atoms: no entropy or utilisation). A blocks of QS_THREADS, block a the moments of action a. Reads
// 2*B*A floats; writes 2A + 2.
extern "C" __global__ void cudarl_qstats_moments(const float* __restrict__ q, float* __restrict__ out, int B, int A) {
  __shared__ float sh[QS_THREADS];
  q_moments(q, out, B, A, (int)blockIdx.x, sh);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    out[A] = __int_as_float(0x7fc00000);
    out[A + 1] = __int_as_float(0x7fc00000);
  }
}

// ---------------------------------------------------------------------------------------------
// cudarl_qstats_expected_q: q[b, a] = sum_k softmax(logits[b, a])_k z_k, per_sample's (and
// agent.act_c51's) statement: the same bits, and nothing else written. One warp per sample, lanes
// over atoms. Reads A*K + K floats; writes A.
extern "C" __global__ void cudarl_qstats_expected_q(const float* __restrict__ logits, const float* __restrict__ support,
                                                    float* __restrict__ q, int B, int A, int K) {
  const int lane = threadIdx.x % QS_WARP;
  const int b = blockIdx.x * (blockDim.x / QS_WARP) + threadIdx.x / QS_WARP;
  if (b >= B) return;
  for (int a = 0; a < A; ++a) {
    float qa = 0.f;
    cudarl::warp_softmax_visit(logits + ((long long)b * A + a) * K, K, lane, [&](int k, float, float p) {
      qa += p * support[k];
    });
    qa = warp_sum(qa);
    if (lane == 0) q[(long long)b * A + a] = qa;
  }
}
