// Flat-gradient copies for the auxiliary signals with a backward of their own (vaccine, causal).
// Twin: cudarl/reference/auxgrad.py. Launchers: cudarl/ops/auxgrad.py.

// ---------------------------------------------------------------------------------------------
// cudarl_auxgrad_copy: dst[i] = src[i] for i < n. Threads: grid-stride, one element each.
// Reads 4n bytes; writes 4n.
extern "C" __global__ void cudarl_auxgrad_copy(float* __restrict__ dst, const float* __restrict__ src, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}
