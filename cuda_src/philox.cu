// philox: fill buffers from a Philox4x32-10 stream (cudarl/include/cudarl/philox.cuh).
// Twin: cudarl/reference/philox.py. Launchers: cudarl/ops/philox.py.
#include <cudarl/philox.cuh>

using cudarl::u32;
using cudarl::u64;

// u32: out[j] = draw j of stream (seed, *counter, stream_id), j < n. One thread per block of
// 4 draws. Reads 8 bytes (the counter, from device memory so replays see its current value),
// writes 4n bytes.
extern "C" __global__ void cudarl_philox_u32(u32* __restrict__ out, long long n, u64 seed,
                                             const u64* __restrict__ counter, u32 stream_id) {
  const u64 c = *counter;
  for (long long b = blockIdx.x * (long long)blockDim.x + threadIdx.x; 4 * b < n; b += (long long)gridDim.x * blockDim.x) {
    const uint4 v = cudarl::philox_block(seed, c, stream_id, (u32)b);
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int l = 0; l < 4; ++l)
      if (4 * b + l < n) out[4 * b + l] = w[l];
  }
}

// uniform: out[j] = u32_to_uniform(draw j), float32 in [0, 1). Same mapping as u32.
extern "C" __global__ void cudarl_philox_uniform(float* __restrict__ out, long long n, u64 seed,
                                                 const u64* __restrict__ counter, u32 stream_id) {
  const u64 c = *counter;
  for (long long b = blockIdx.x * (long long)blockDim.x + threadIdx.x; 4 * b < n; b += (long long)gridDim.x * blockDim.x) {
    const uint4 v = cudarl::philox_block(seed, c, stream_id, (u32)b);
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int l = 0; l < 4; ++l)
      if (4 * b + l < n) out[4 * b + l] = cudarl::u32_to_uniform(w[l]);
  }
}
