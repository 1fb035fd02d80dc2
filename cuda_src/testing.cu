// testing: kernels that exist to prove the foundation's guarantees on the GPU.
// Twin: cudarl/reference/testing.py. Launchers: cudarl/ops/testing.py.
#include <cudarl/philox.cuh>

// spin_then_write: one thread spins for `cycles` clock cycles, then writes *dst = value.
// Used to show that PinnedReadback.read() never returns a value older than its writer.
extern "C" __global__ void cudarl_testing_spin_then_write(float* dst, float value, long long cycles) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const long long start = clock64();
  while (clock64() - start < cycles) { }
  *dst = value;
}

// iota_sized: out[i] = i + 1 for i < *n, out[i] = 0 for *n <= i < capacity. The size comes from
// device memory, so a graph captured at one size sees the size at replay time (DESIGN rule 2).
extern "C" __global__ void cudarl_testing_iota_sized(float* __restrict__ out, const long long* __restrict__ n, long long capacity) {
  const long long size = *n;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < capacity; i += (long long)gridDim.x * blockDim.x)
    out[i] = i < size ? (float)(i + 1) : 0.0f;
}

// axpb: x[i] = a * x[i] + b, i < n. A small elementwise kernel for graph benchmarks and the
// graphed-equals-eager test.
extern "C" __global__ void cudarl_testing_axpb(float* __restrict__ x, long long n, float a, float b) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    x[i] = a * x[i] + b;
}

// empty: does nothing. The floor model's probe (tools/bench_floor.py): what a graph node costs
// when its kernel has no work. Reads and writes nothing.
extern "C" __global__ void cudarl_testing_empty() {}

// fma: x[i] = a * x[i] + b, repeated `iters` times, one dependent chain a thread (i < n; 2 FLOPs an
// iteration). The floor model's FP32 probe (tools/bench_floor.py): with a million threads the chains
// hide the FMA latency, so the time measures the FP32 rate. Reads and writes 4n bytes.
extern "C" __global__ void cudarl_testing_fma(float* __restrict__ x, long long n, float a, float b, int iters) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float v = x[i];
    for (int k = 0; k < iters; ++k) v = fmaf(a, v, b);
    x[i] = v;
  }
}
