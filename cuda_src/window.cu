// window: observation windows gathered from the device-resident feature matrix.
// Twin: cudarl/reference/window.py (the layout of a state row and of a window is documented there).
// Launchers: cudarl/ops/window.py. Tests: tests/parity/test_window.py.
//
// A state row is float32 [4]: bar, mirror, position, hold. A window is `window` bars of F + 2 floats,
// oldest first: bar b = bar - (window - 1) + w gives features[b] (times sign[c] on a mirror row; zeros
// for b outside [0, T)), then the position and the hold fraction on the newest bar and zeros before.
// Pure copies (and a sign flip by __fmul_rn, exact), so the kernel equals the twin bit for bit.
#include <cudarl/window.cuh>

typedef long long i64;

#define STATE_DIM 4

// gather: one thread per output float, grid-stride over n * window * (F + 2). Reads 16 bytes of its
// state row (cached: a row's threads are adjacent) and at most one feature and one sign per thread;
// writes 4 bytes, coalesced.
extern "C" __global__ void cudarl_window_gather(const float* __restrict__ rows, const float* __restrict__ features,
                                                const float* __restrict__ sign, float* __restrict__ out, i64 n,
                                                int window, int n_features, i64 n_bars) {
  const int bar_width = n_features + 2;
  const i64 row_width = (i64)window * bar_width;
  const i64 total = n * row_width;
  for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
    const i64 i = e / row_width;
    const int r = (int)(e - i * row_width);
    const int w = r / bar_width, c = r - w * bar_width;
    const float* row = rows + i * STATE_DIM;
    const float v = cudarl::window_value(row[0], row[1], row[2], row[3], features, sign, w, c, window, n_features,
                                         n_bars);
    out[e] = v;
  }
}
