// Philox4x32-10 (Salmon et al., SC'11, "Parallel random numbers: as easy as 1, 2, 3").
// Twin: cudarl/reference/philox.py. Both produce bit-identical uint32 streams.
//
// A cudarl stream is keyed by (seed, counter, stream_id):
//   key   = (seed & 0xffffffff, seed >> 32)
//   block = philox4x32_10(ctr = (b, stream_id, counter & 0xffffffff, counter >> 32), key)
//   draw j of the stream = block(b = j / 4).lane[j % 4]
// `counter` is normally a step counter that lives in device memory (DESIGN rule 2).
#pragma once

namespace cudarl {

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) { k.x += 0x9E3779B9u; k.y += 0xBB67AE85u; }
    const u32 hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const u32 hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
  }
  return c;
}

// Block b (4 draws) of the stream (seed, counter, stream_id).
__device__ __forceinline__ uint4 philox_block(u64 seed, u64 counter, u32 stream_id, u32 b) {
  return philox4x32_10(make_uint4(b, stream_id, (u32)counter, (u32)(counter >> 32)),
                       make_uint2((u32)seed, (u32)(seed >> 32)));
}

// Draw j of the stream. Computes a whole block: callers that need 4 draws use philox_block.
__device__ __forceinline__ u32 philox_u32(u64 seed, u64 counter, u32 stream_id, u64 j) {
  const uint4 v = philox_block(seed, counter, stream_id, (u32)(j >> 2));
  switch (j & 3) { case 0: return v.x; case 1: return v.y; case 2: return v.z; default: return v.w; }
}

// Uniform float32 in [0, 1): the top 24 bits times 2^-24, exact in float32 on both faces.
__device__ __forceinline__ float u32_to_uniform(u32 x) { return (float)(x >> 8) * 5.9604644775390625e-08f; }

}  // namespace cudarl
