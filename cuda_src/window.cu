// window: observation windows gathered from the device-resident feature matrix.
// Twin: cudarl/reference/window.py (the layout of a state row and of a window is documented there).
// Launchers: cudarl/ops/window.py. Tests: tests/parity/test_window.py.
//
// A state row is float32 [4]: bar, mirror, position, hold. A window is `window` bars of F + 2 floats,
// oldest first: bar b = bar - (window - 1) + w gives features[b] (times sign[c] on a mirror row; zeros
// for b outside [0, T)), then the position and the hold fraction on the newest bar and zeros before.
// Pure copies (and a sign flip by __fmul_rn, exact), so the kernel equals the twin bit for bit.
// noise (agent.input_noise) adds Philox-drawn zero-mean noise to the feature columns of gathered windows,
// in float32 adds and multiplies rounded as the twin rounds them: bit for bit too.
#include <cudarl/philox.cuh>
#include <cudarl/window.cuh>

typedef long long i64;

#define STATE_DIM 4

// Element e of a row-major [n, window, width] array as (i, w, c).
__device__ __forceinline__ void split_index(i64 e, int window, int width, i64& i, int& w, int& c) {
  const i64 row = (i64)window * width;
  i = e / row;
  const int r = (int)(e - i * row);
  w = r / width;
  c = r - w * width;
}

// gather: one thread per output float, grid-stride over n * window * (F + 2). Reads 16 bytes of its
// state row (cached: a row's threads are adjacent) and at most one feature and one sign per thread;
// writes 4 bytes, coalesced.
extern "C" __global__ void cudarl_window_gather(const float* __restrict__ rows, const float* __restrict__ features,
                                                const float* __restrict__ sign, float* __restrict__ out, i64 n,
                                                int window, int n_features, i64 n_bars) {
  const i64 total = n * window * (n_features + 2);
  for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
    i64 i;
    int w, c;
    split_index(e, window, n_features + 2, i, w, c);
    const float* row = rows + i * STATE_DIM;
    const float v = cudarl::window_value(row[0], row[1], row[2], row[3], features, sign, w, c, window, n_features,
                                         n_bars);
    out[e] = v;
  }
}

// noise: zero-mean noise added in place to the feature columns of gathered windows x [n, window * (F + 2)]
// (the position columns untouched): feature element e (row-major over [n, window, F]) adds
// scale * (((u0 + u1) + (u2 + u3)) - 2), u the four uniforms of Philox block e of the stream (seed,
// counter[0], stream_id). Adds and multiplies by __fadd_rn / __fmul_rn (no contraction), no
// transcendental: equal to the twin bit for bit. One thread per element, grid-stride; reads and
// writes 4 bytes of x each. counter is read only: its owner advances it (the learner's step).
extern "C" __global__ void cudarl_window_noise(float* __restrict__ x, const i64* __restrict__ counter, i64 n,
                                               int window, int n_features, float scale, unsigned long long seed,
                                               unsigned int stream_id) {
  const unsigned long long ctr = (unsigned long long)counter[0];
  const i64 total = n * window * n_features;
  for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
    i64 i;
    int w, c;
    split_index(e, window, n_features, i, w, c);
    const uint4 u = cudarl::philox_block(seed, ctr, stream_id, (unsigned int)e);
    const float s = __fadd_rn(__fadd_rn(cudarl::u32_to_uniform(u.x), cudarl::u32_to_uniform(u.y)),
                              __fadd_rn(cudarl::u32_to_uniform(u.z), cudarl::u32_to_uniform(u.w)));
    float* p = x + i * ((i64)window * (n_features + 2)) + (i64)w * (n_features + 2) + c;
    *p = __fadd_rn(*p, __fmul_rn(scale, __fsub_rn(s, 2.0f)));
  }
}
