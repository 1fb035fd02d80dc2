// util: whole-word fills and copies, host-to-device scalar writes, device-side counter increments.
// Twin: cudarl/reference/util.py. Launchers: cudarl/ops/util.py.
#include <cudarl/philox.cuh>

using cudarl::u32;
using cudarl::u64;

// fill_u32: dst[i] = value for i < n. One thread per 32-bit word (DESIGN rule 7: whole-word
// clears). Reads nothing, writes 4n bytes.
extern "C" __global__ void cudarl_util_fill_u32(u32* __restrict__ dst, long long n, u32 value) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = value;
}

// copy_u32: dst[i] = src[i] for i < n, 32-bit words (a float32 buffer's bits, signed zeros and NaNs
// kept). One thread per word. Reads 4n bytes, writes 4n; dst and src do not overlap. Gradient Vaccine's
// copy of the extra heads' dL/dpsi before the step's backward adds the Q head's onto it.
extern "C" __global__ void cudarl_util_copy_u32(u32* __restrict__ dst, const u32* __restrict__ src, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

// set_u64: *dst = bits. One thread. Writes 8 bytes. Host updates of DeviceScalars go through
// this kernel so they are ordered on the stream with the graph replays that read them.
extern "C" __global__ void cudarl_util_set_u64(u64* __restrict__ dst, u64 bits) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *dst = bits;
}

// add_i64: *dst += by. One thread, a plain read-modify-write (no atomics: one writer).
// Captured in a graph it advances a step counter on the device at every replay.
extern "C" __global__ void cudarl_util_add_i64(long long* __restrict__ dst, long long by) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *dst += by;
}

// add_f32: dst[i] = a[i] + b[i] for i < n (rounded to nearest; dst may be a or b). One thread per
// element. Reads 8n bytes, writes 4n. Sums a step's losses of two heads (net.head = "c51+iqn").
extern "C" __global__ void cudarl_util_add_f32(float* dst, const float* a, const float* b, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = __fadd_rn(a[i], b[i]);
}
