// auxsgd: the auxiliary signals' own optimiser step, plain SGD on a span of the flat parameters
// (agent.aux "risk": its head; "denoise": its encoder twin's gradient). Twin: cudarl/reference/auxsgd.py.
// Launchers: cudarl/ops/auxsgd.py. Tests: tests/parity/test_auxsgd.py.
//
// step: p[i] = p[i] - lr g[i] (__fmul_rn, __fsub_rn: no FMA contraction, equal to the twin bit for bit),
// then g[i] = 0 when clear != 0 (the span's gradient is spent: the shared Adam after it sees zeros).
// One thread per element, grid-stride; reads 8 bytes and writes 4 or 8 per element. No atomics.
typedef long long i64;

extern "C" __global__ void cudarl_auxsgd_step(float* __restrict__ p, float* __restrict__ g, i64 n, float lr,
                                              int clear) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    p[i] = __fsub_rn(p[i], __fmul_rn(lr, g[i]));
    if (clear) g[i] = 0.0f;
  }
}
