// Copies for the auxiliary signals' own passes: the flat gradient of those with a backward of their own
// (vaccine, causal), and the sub-batch of rows the denoise and causal passes read (agent.aux_batch).
// Twin: cudarl/reference/auxgrad.py. Launchers: cudarl/ops/auxgrad.py.

// ---------------------------------------------------------------------------------------------
// cudarl_auxgrad_copy: dst[i] = src[i] for i < n. Threads: grid-stride, one element each.
// Reads 4n bytes; writes 4n.
extern "C" __global__ void cudarl_auxgrad_copy(float* __restrict__ dst, const float* __restrict__ src, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

// ---------------------------------------------------------------------------------------------
// cudarl_auxgrad_spread_rows: dst[r, c] = src[floor(r B / R), c] for r < R, c < n: the R rows of src
// [B, n] spread evenly over it (R <= B). Threads: grid-stride, one element of dst each.
// Reads 4 R n bytes; writes 4 R n.
extern "C" __global__ void cudarl_auxgrad_spread_rows(float* __restrict__ dst, const float* __restrict__ src,
                                                      long long R, long long B, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < R * n;
       i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / n, c = i - r * n;
    dst[i] = src[(r * B / R) * n + c];
  }
}
