// auxsgd: the auxiliary signals' own optimiser step, plain SGD on spans of flat parameters (agent.aux
// "risk": its head; "denoise": the encoder from its own gradient, and its decoder). Twin:
// cudarl/reference/auxsgd.py. Launchers: cudarl/ops/auxsgd.py. Tests: tests/parity/test_auxsgd.py.
//
// steps: for every span s, p_s[i] = p_s[i] - lr_s g_s[i] (__fmul_rn, __fsub_rn: no FMA contraction, equal
// to the twin bit for bit), then g_s[i] = 0 when clear_s != 0 (the span's gradient is spent: the shared
// Adam after it sees zeros). Every span of the step in ONE launch (they were a launch each, back to back
// on the MLP step's chain before Adam: a graph node each, issue 19); the spans are disjoint (the launcher
// checks), so the order among them does not matter. Up to AS_MAX_SPANS spans by value; a slot past the
// step's spans has n = 0 (and repeats a real span's pointers: no null pointer, DESIGN rule 5).
// Threads: the whole grid strides over each span in turn; reads 8 bytes and writes 4 or 8 per element.
// No atomics.
typedef long long i64;

#define AS_MAX_SPANS 4

struct AuxsgdSpans {
  float* p0;
  float* g0;
  float* p1;
  float* g1;
  float* p2;
  float* g2;
  float* p3;
  float* g3;
  i64 n0, n1, n2, n3;
  float lr0, lr1, lr2, lr3;
  int clear0, clear1, clear2, clear3;
};

extern "C" __global__ void cudarl_auxsgd_steps(const AuxsgdSpans a) {
  float* const ps[AS_MAX_SPANS] = {a.p0, a.p1, a.p2, a.p3};
  float* const gs[AS_MAX_SPANS] = {a.g0, a.g1, a.g2, a.g3};
  const i64 ns[AS_MAX_SPANS] = {a.n0, a.n1, a.n2, a.n3};
  const float lrs[AS_MAX_SPANS] = {a.lr0, a.lr1, a.lr2, a.lr3};
  const int clears[AS_MAX_SPANS] = {a.clear0, a.clear1, a.clear2, a.clear3};
  const i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x, stride = (i64)gridDim.x * blockDim.x;
#pragma unroll
  for (int s = 0; s < AS_MAX_SPANS; ++s) {  // unrolled: the span's fields stay in registers
    float* p = ps[s];
    float* g = gs[s];
    for (i64 i = first; i < ns[s]; i += stride) {
      p[i] = __fsub_rn(p[i], __fmul_rn(lrs[s], g[i]));
      if (clears[s]) g[i] = 0.0f;
    }
  }
}
