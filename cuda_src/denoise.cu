// denoise: the denoising objective (agent.aux "denoise"): masking noise on the observation window and
// the reconstruction loss of the clean window. Twin: cudarl/reference/denoise.py (the equations and the
// method). Launchers: cudarl/ops/denoise.py. Tests: tests/parity/test_denoise.py.
//
// corrupt reads the draw counter from device memory (DESIGN rule 2) and loss advances it, so each
// replay of the graph masks afresh and a graphed run equals an eager one. No atomics.

#include <cudarl/philox.cuh>

typedef long long i64;

// corrupt: out[i] = 0 where draw i of the stream (seed, counter[0], stream_id) is below p, else x[i].
// One thread per 4 elements (one Philox block), grid-stride; reads 16 bytes and writes 16 per thread.
extern "C" __global__ void cudarl_denoise_corrupt(const float* __restrict__ x, float* __restrict__ out,
                                                  const i64* __restrict__ counter, i64 n, float p,
                                                  unsigned long long seed, unsigned int stream_id) {
  const unsigned long long ctr = (unsigned long long)counter[0];
  for (i64 q = (i64)blockIdx.x * blockDim.x + threadIdx.x; q * 4 < n; q += (i64)gridDim.x * blockDim.x) {
    const uint4 r = cudarl::philox_block(seed, ctr, stream_id, (unsigned int)q);
    const unsigned int lanes[4] = {r.x, r.y, r.z, r.w};
    for (int l = 0; l < 4; ++l) {
      const i64 i = q * 4 + l;
      if (i < n) out[i] = cudarl::u32_to_uniform(lanes[l]) < p ? 0.0f : x[i];
    }
  }
}

// loss: one thread per sample b over its m columns, in order: e = recon - clean, grad = 2 scale e,
// loss_per[b] = scale sum_j e_j^2 (__fmul_rn / __fadd_rn: equal to the twin bit for bit); thread 0
// then advances the draw counter (the next step's mask). Reads 8m bytes, writes 4m + 4 per sample.
extern "C" __global__ void cudarl_denoise_loss(const float* __restrict__ recon, const float* __restrict__ clean,
                                               float* __restrict__ grad, float* __restrict__ loss_per,
                                               i64* __restrict__ counter, int B, int m, float scale) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const float g = __fmul_rn(2.0f, scale);
  float acc = 0.0f;
  for (int j = 0; j < m; ++j) {
    const i64 i = (i64)b * m + j;
    const float e = __fsub_rn(recon[i], clean[i]);
    grad[i] = __fmul_rn(g, e);
    acc = __fadd_rn(acc, __fmul_rn(e, e));
  }
  loss_per[b] = __fmul_rn(scale, acc);
  if (b == 0) counter[0] += 1;
}
