// The sub-batch of rows the denoise and causal passes read (agent.aux_batch). (Its copy of the flat
// gradient went with the extra backward on the flat gradient: vaccine and causal backward into buffers of
// their own.)
// Twin: cudarl/reference/auxgrad.py. Launchers: cudarl/ops/auxgrad.py.

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
