// Deterministic warp and block reductions (DESIGN rule 3: fixed order, no float atomics).
//
// Every helper has one fixed association order that depends only on the shape (32 lanes, or
// n shared slots), never on scheduling, so a float result is bitwise repeatable on one GPU.
// The NumPy twins do not reproduce these orders; parity tests compare within rounding.
//
//   warp_sum(v)             xor butterfly over the 32 lanes; every lane gets the same bits
//                           (IEEE + is commutative, so lanes i and i^o add the same pair).
//   warp_max / warp_min(v)  the same butterfly with max (fmaxf for float) or min.
//   block_tree_sum(sh, n)   in place over sh[0 .. n): sh[t] += sh[t + s] for s = n/2, ..., 1,
//                           a __syncthreads() before each level and after the last; the
//                           sum is in sh[0], visible to every thread.
//   block_sum(v, sh, n)     every thread contributes v (n == blockDim.x); the tree above;
//                           returns the sum to every thread (safe to call back to back on sh).
//
// Call warp helpers with all 32 lanes active; call block helpers from every thread of the
// block (they synchronise), with n a power of two, n <= blockDim.x (block_sum: n == blockDim.x).
#pragma once

namespace cudarl {

constexpr unsigned int kFullWarp = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullWarp, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, o));
  return v;
}

__device__ __forceinline__ unsigned long long warp_max(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long w = __shfl_xor_sync(kFullWarp, v, o);
    v = v > w ? v : w;
  }
  return v;
}

__device__ __forceinline__ unsigned long long warp_min(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long w = __shfl_xor_sync(kFullWarp, v, o);
    v = v < w ? v : w;
  }
  return v;
}

template <typename T>
__device__ __forceinline__ void block_tree_sum(T* sh, int n) {
  const int t = (int)threadIdx.x;
  for (int s = n >> 1; s > 0; s >>= 1) {
    __syncthreads();
    if (t < s) sh[t] += sh[t + s];
  }
  __syncthreads();
}

template <typename T>
__device__ __forceinline__ T block_sum(T v, T* sh, int n) {
  __syncthreads();  // sh may still be read by a previous call
  sh[threadIdx.x] = v;
  block_tree_sum(sh, n);
  return sh[0];
}

}  // namespace cudarl
