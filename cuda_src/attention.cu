// Causal multi-head self-attention with rotary positions: a fused forward and backward that hold a
// (sample, head)'s whole window in shared memory (W <= 128, Dh <= 64), and the key/value-cache step.
// Twin: cudarl/reference/attention.py (equations). Launchers: cudarl/ops/attention.py.
// Tests: tests/parity/test_attention.py.
//
// A qkv row is [q (d) | k (d) | v (d)], d = H Dh; head h owns columns h Dh .. h Dh + Dh of each.
// RoPE rotates the pairs (2i, 2i + 1) of q and k by p theta_i, theta_i = base^(-2i / Dh); the angle
// and its cosine and sine are computed in double and rounded once (as the twin). Every sum has one
// order (rows by lanes then the xor butterfly, columns by one thread in ascending order): no float
// atomics, bitwise reproducible.
#include <cudarl/reduce.cuh>

typedef long long i64;

#define ATT_THREADS 256  // forward and backward blocks (8 warps)
#define STEP_THREADS 128
#define ATT_NEG_INF __int_as_float((int)0xff800000u)

namespace {

using cudarl::warp_max;
using cudarl::warp_sum;

// cos and sin of p theta_i (double, then rounded to float).
__device__ __forceinline__ void rope_cs(i64 p, int i, int Dh, double base, float* c, float* s) {
  const double theta = pow(base, (-2.0 * i) / Dh);
  double sd, cd;
  sincos((double)p * theta, &sd, &cd);
  *c = (float)cd;
  *s = (float)sd;
}

// Rotate the pair (x0, x1) by (c, s): sign 1 forward, -1 back.
__device__ __forceinline__ void rotate(float x0, float x1, float c, float s, float* y0, float* y1) {
  *y0 = x0 * c - x1 * s;
  *y1 = x0 * s + x1 * c;
}

// Load a head's rotated q and k, and v, into shared rows of ld floats.
__device__ __forceinline__ void load_head(const float* qkv, i64 row0, int W, int d, int h, int Dh, double base,
                                          float* qs, float* ks, float* vs, int ld) {
  const int half = Dh / 2;
  for (int i = threadIdx.x; i < W * half; i += blockDim.x) {
    const int t = i / half, j = i % half;
    const float* r = qkv + (row0 + t) * 3 * (i64)d + h * Dh + 2 * j;
    float c, s;
    rope_cs(t, j, Dh, base, &c, &s);
    rotate(r[0], r[1], c, s, &qs[t * ld + 2 * j], &qs[t * ld + 2 * j + 1]);
    rotate(r[d], r[d + 1], c, s, &ks[t * ld + 2 * j], &ks[t * ld + 2 * j + 1]);
  }
  for (int i = threadIdx.x; i < W * Dh; i += blockDim.x) vs[(i / Dh) * ld + i % Dh] = qkv[(row0 + i / Dh) * 3 * (i64)d + 2 * d + h * Dh + i % Dh];
}

// One warp's query row t over the shared rotated q, k and v (rows of ld floats): the scores of s <= t by
// lanes (dot over Dh, / sqrt(Dh)) into p, max and sum by the butterfly, then out[c] = sum_s p_s v_s[c] / l
// by lanes over c, s ascending, and *lse = m + log l (lane 0).
__device__ __forceinline__ void attend_row(const float* qs, const float* ks, const float* vs, int ld, int Dh, int t,
                                           float* p, int lane, float* out, float* lse) {
  const float scale = sqrtf((float)Dh);
  float m = ATT_NEG_INF;
  for (int s = lane; s <= t; s += 32) {
    float dot = 0.f;
    for (int c = 0; c < Dh; ++c) dot += qs[t * ld + c] * ks[s * ld + c];
    p[s] = dot / scale;
    m = fmaxf(m, p[s]);
  }
  m = warp_max(m);
  float l = 0.f;
  for (int s = lane; s <= t; s += 32) {
    const float e = expf(p[s] - m);
    p[s] = e;
    l += e;
  }
  l = warp_sum(l);
  __syncwarp();
  for (int c = lane; c < Dh; c += 32) {
    float acc = 0.f;
    for (int s = 0; s <= t; ++s) acc += p[s] * vs[s * ld + c];
    out[c] = acc / l;
  }
  if (lane == 0) *lse = m + logf(l);
  __syncwarp();  // p is reused by the warp's next row
}

}  // namespace

// ---- forward --------------------------------------------------------------------------------------
// Block per (sample, head) = blockIdx.x / H, % H; ATT_THREADS. A warp per query row t: the scores of
// s <= t by lanes (dot over Dh, / sqrt(Dh)), max and sum by the butterfly, then o_t[c] = sum_s p_s v_s[c] / l
// by lanes over c, s ascending; lse_t = m + log l. Shared (floats): q, k, v W*(Dh+1) each, 8 warp rows of W.
// Reads 12*W*Dh bytes a block, writes 4*W*(Dh + 1).
extern "C" __global__ __launch_bounds__(ATT_THREADS) void cudarl_attention_forward(const float* qkv, float* o,
                                                                                   float* lse, int W, int H, int Dh,
                                                                                   double base) {
  extern __shared__ float sh[];
  const int ld = Dh + 1, d = H * Dh;
  float* qs = sh;
  float* ks = qs + W * ld;
  float* vs = ks + W * ld;
  float* pr = vs + W * ld;
  const i64 b = blockIdx.x / H;
  const int h = blockIdx.x % H, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64 row0 = b * W;
  load_head(qkv, row0, W, d, h, Dh, base, qs, ks, vs, ld);
  __syncthreads();
  for (int t = warp; t < W; t += ATT_THREADS / 32)
    attend_row(qs, ks, vs, ld, Dh, t, pr + warp * W, lane, o + (row0 + t) * d + h * Dh, lse + (b * H + h) * W + t);
}

// ---- backward -------------------------------------------------------------------------------------
// Block per (sample, head), ATT_THREADS. Recomputes P = exp(S - lse) (s <= t), then
// dv_s = sum_{t >= s} P[t][s] do_t; dS = P (do_t . v_s - do_t . o_t) / sqrt(Dh) in place;
// d rope(q)_t = sum_{s <= t} dS[t][s] rope(k)_s and d rope(k)_s = sum_{t >= s} dS[t][s] rope(q)_t, rotated
// back. Shared (floats): q, k, v, do W*(Dh+1) each, P W*(W+1), D and lse 2W.
// Reads 20*W*Dh bytes a block, writes 12*W*Dh.
extern "C" __global__ __launch_bounds__(ATT_THREADS) void cudarl_attention_backward(const float* dout, const float* qkv,
                                                                                    const float* o, const float* lse,
                                                                                    float* dqkv, int W, int H, int Dh,
                                                                                    double base) {
  extern __shared__ float sh[];
  const int ld = Dh + 1, d = H * Dh, W1 = W + 1, half = Dh / 2;
  float* qs = sh;
  float* ks = qs + W * ld;
  float* vs = ks + W * ld;
  float* dos = vs + W * ld;
  float* Pm = dos + W * ld;
  float* Dv = Pm + W * W1;
  float* ls = Dv + W;
  const i64 b = blockIdx.x / H;
  const int h = blockIdx.x % H, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const i64 row0 = b * W;
  load_head(qkv, row0, W, d, h, Dh, base, qs, ks, vs, ld);
  for (int i = tid; i < W * Dh; i += blockDim.x) dos[(i / Dh) * ld + i % Dh] = dout[(row0 + i / Dh) * d + h * Dh + i % Dh];
  for (int t = tid; t < W; t += blockDim.x) ls[t] = lse[(b * H + h) * W + t];
  for (int t = warp; t < W; t += ATT_THREADS / 32) {
    float acc = 0.f;
    for (int c = lane; c < Dh; c += 32) acc += dout[(row0 + t) * d + h * Dh + c] * o[(row0 + t) * d + h * Dh + c];
    acc = warp_sum(acc);
    if (lane == 0) Dv[t] = acc;
  }
  __syncthreads();
  const float scale = sqrtf((float)Dh);
  for (int i = tid; i < W * W; i += blockDim.x) {
    const int t = i / W, s = i % W;
    float pv = 0.f;
    if (s <= t) {
      float dot = 0.f;
      for (int c = 0; c < Dh; ++c) dot += qs[t * ld + c] * ks[s * ld + c];
      pv = expf(dot / scale - ls[t]);
    }
    Pm[t * W1 + s] = pv;
  }
  __syncthreads();
  for (int i = tid; i < W * Dh; i += blockDim.x) {  // dv
    const int s = i / Dh, c = i % Dh;
    float acc = 0.f;
    for (int t = s; t < W; ++t) acc += Pm[t * W1 + s] * dos[t * ld + c];
    dqkv[(row0 + s) * 3 * (i64)d + 2 * d + h * Dh + c] = acc;
  }
  __syncthreads();
  for (int i = tid; i < W * W; i += blockDim.x) {  // dS in place
    const int t = i / W, s = i % W;
    if (s <= t) {
      float dot = 0.f;
      for (int c = 0; c < Dh; ++c) dot += dos[t * ld + c] * vs[s * ld + c];
      Pm[t * W1 + s] = Pm[t * W1 + s] * (dot - Dv[t]) / scale;
    }
  }
  __syncthreads();
  for (int i = tid; i < W * half; i += blockDim.x) {  // dq and dk, a pair per thread
    const int t = i / half, j = i % half;
    float q0 = 0.f, q1 = 0.f, k0 = 0.f, k1 = 0.f;
    for (int s = 0; s <= t; ++s) {
      const float ds = Pm[t * W1 + s];
      q0 += ds * ks[s * ld + 2 * j];
      q1 += ds * ks[s * ld + 2 * j + 1];
    }
    for (int t2 = t; t2 < W; ++t2) {  // here t is the key's position
      const float ds = Pm[t2 * W1 + t];
      k0 += ds * qs[t2 * ld + 2 * j];
      k1 += ds * qs[t2 * ld + 2 * j + 1];
    }
    float c, s;
    rope_cs(t, j, Dh, base, &c, &s);
    float* r = dqkv + (row0 + t) * 3 * (i64)d + h * Dh + 2 * j;
    rotate(q0, q1, c, -s, &r[0], &r[1]);
    rotate(k0, k1, c, -s, &r[d], &r[d + 1]);
  }
}

// ---- last_forward / last_backward -----------------------------------------------------------------
// The last position only (the twin's last_forward / last_backward), for the top block of an encoder whose
// heads read the last bar: block per (sample, head), ATT_THREADS; the forward is the forward kernel's row
// W - 1 (attend_row, warp 0): the same numbers as that kernel's last row. The backward from do_T: P_s =
// exp(S[T][s] - lse_T), dv_s = P_s do_T, dS_s = P_s (do_T . v_s - do_T . o_T) / sqrt(Dh), d rope(q)_T =
// sum_s dS_s rope(k)_s and d rope(k)_s = dS_s rope(q)_T, rotated back; dq zero before T. Shared (floats):
// q, k, v W*(Dh+1) each; the forward W more (the scores), the backward do_T Dh and dS W.
extern "C" __global__ __launch_bounds__(ATT_THREADS) void cudarl_attention_last_forward(const float* qkv, float* o,
                                                                                        float* lse, int W, int H,
                                                                                        int Dh, double base) {
  extern __shared__ float sh[];
  const int ld = Dh + 1, d = H * Dh;
  float *qs = sh, *ks = qs + W * ld, *vs = ks + W * ld, *pr = vs + W * ld;
  const i64 b = blockIdx.x / H;
  const int h = blockIdx.x % H;
  load_head(qkv, b * W, W, d, h, Dh, base, qs, ks, vs, ld);
  __syncthreads();
  if (threadIdx.x < 32) attend_row(qs, ks, vs, ld, Dh, W - 1, pr, threadIdx.x, o + b * d + h * Dh, lse + b * H + h);
}

extern "C" __global__ __launch_bounds__(ATT_THREADS) void cudarl_attention_last_backward(
    const float* dout, const float* qkv, const float* o, const float* lse, float* dqkv, int W, int H, int Dh,
    double base) {
  extern __shared__ float sh[];
  const int ld = Dh + 1, d = H * Dh, half = Dh / 2, T = W - 1;
  float *qs = sh, *ks = qs + W * ld, *vs = ks + W * ld, *dos = vs + W * ld, *dS = dos + Dh;
  __shared__ float Dv;
  const i64 b = blockIdx.x / H;
  const int h = blockIdx.x % H, tid = threadIdx.x;
  const i64 row0 = b * W;
  load_head(qkv, row0, W, d, h, Dh, base, qs, ks, vs, ld);
  for (int c = tid; c < Dh; c += blockDim.x) dos[c] = dout[b * d + h * Dh + c];
  if (tid < 32) {  // D = do_T . o_T, lanes then the butterfly (the backward kernel's order)
    float acc = 0.f;
    for (int c = tid; c < Dh; c += 32) acc += dout[b * d + h * Dh + c] * o[b * d + h * Dh + c];
    acc = warp_sum(acc);
    if (tid == 0) Dv = acc;
  }
  __syncthreads();
  const float scale = sqrtf((float)Dh), l = lse[b * H + h];
  for (int s = tid; s < W; s += blockDim.x) {
    float dot = 0.f, dp = 0.f;
    for (int c = 0; c < Dh; ++c) dot += qs[T * ld + c] * ks[s * ld + c];
    const float pv = expf(dot / scale - l);
    for (int c = 0; c < Dh; ++c) dp += dos[c] * vs[s * ld + c];
    dS[s] = pv * (dp - Dv) / scale;
    vs[s * ld + Dh] = pv;  // P_s in the padding column, for dv below
  }
  __syncthreads();
  for (int i = tid; i < W * Dh; i += blockDim.x) {  // dv_s = P_s do_T
    const int s = i / Dh, c = i % Dh;
    dqkv[(row0 + s) * 3 * (i64)d + 2 * d + h * Dh + c] = vs[s * ld + Dh] * dos[c];
  }
  for (int i = tid; i < W * half; i += blockDim.x) {  // dk_s, and dq (zero before T), a pair per thread
    const int t = i / half, j = i % half;
    float q0 = 0.f, q1 = 0.f;
    if (t == T) {
      for (int s = 0; s < W; ++s) {
        q0 += dS[s] * ks[s * ld + 2 * j];
        q1 += dS[s] * ks[s * ld + 2 * j + 1];
      }
    }
    float c, s;
    rope_cs(t, j, Dh, base, &c, &s);
    float* r = dqkv + (row0 + t) * 3 * (i64)d + h * Dh + 2 * j;
    if (t == T) {
      rotate(q0, q1, c, -s, &r[0], &r[1]);
    } else {
      r[0] = 0.f;
      r[1] = 0.f;
    }
    rotate(dS[t] * qs[T * ld + 2 * j], dS[t] * qs[T * ld + 2 * j + 1], c, -s, &r[d], &r[d + 1]);
  }
}

// ---- step -----------------------------------------------------------------------------------------
#define STEP_MAX_WINDOW 128  // ops/attention.py MAX_WINDOW: a lane holds W / 32 scores in registers
// One bar over the key/value cache [B, H, W, Dh]: at p = pos[b], rope(k) and v go to slot p mod W, and
// rope(q) attends to the last min(p + 1, W) bars, oldest first (warp 0: scores, max and sum by lanes
// and the butterfly; then o by threads over channels, bars ascending). Block per (env, head),
// STEP_THREADS; shared q Dh, scores W. Reads 8*W*Dh bytes a block at most, writes 4*3*Dh.
extern "C" __global__ void cudarl_attention_step(const float* qkv, float* kcache, float* vcache, const i64* pos,
                                                 float* o, int W, int H, int Dh, double base) {
  extern __shared__ float sh[];
  float* qr = sh;
  float* sc = qr + Dh;
  const i64 b = blockIdx.x / H;
  const int h = blockIdx.x % H, tid = threadIdx.x, d = H * Dh;
  const i64 p = pos[b];
  const int slot = (int)(p % W);
  float* kc = kcache + (b * H + h) * (i64)W * Dh;
  float* vc = vcache + (b * H + h) * (i64)W * Dh;
  const float* r = qkv + b * 3 * (i64)d + h * Dh;
  for (int j = tid; j < Dh / 2; j += blockDim.x) {
    float c, s;
    rope_cs(p, j, Dh, base, &c, &s);
    rotate(r[2 * j], r[2 * j + 1], c, s, &qr[2 * j], &qr[2 * j + 1]);
    rotate(r[d + 2 * j], r[d + 2 * j + 1], c, s, &kc[slot * Dh + 2 * j], &kc[slot * Dh + 2 * j + 1]);
  }
  for (int c = tid; c < Dh; c += blockDim.x) vc[slot * Dh + c] = r[2 * d + c];
  __syncthreads();  // the block's own cache writes are visible to it after the barrier
  const int n = p + 1 < W ? (int)(p + 1) : W;
  const i64 first = p - n + 1;
  const float scale = sqrtf((float)Dh);
  if (tid < 32) {
    // Scores stay in registers (bar tid + 32 k) until every lane has finished reading qr; only then, after
    // __syncwarp, go to shared memory (racecheck reported a warp-level WAR hazard between the q reads
    // and the score writes when each lane stored its score as soon as it had it).
    float e[STEP_MAX_WINDOW / 32];
    float m = ATT_NEG_INF;
#pragma unroll
    for (int k = 0; k < STEP_MAX_WINDOW / 32; ++k) {
      const int j = tid + 32 * k;
      e[k] = ATT_NEG_INF;
      if (j < n) {
        const float* kr = kc + ((first + j) % W) * Dh;
        float dot = 0.f;
        for (int c = 0; c < Dh; ++c) dot += qr[c] * kr[c];
        e[k] = dot / scale;
        m = fmaxf(m, e[k]);
      }
    }
    m = warp_max(m);
    float l = 0.f;
#pragma unroll
    for (int k = 0; k < STEP_MAX_WINDOW / 32; ++k) {
      if (tid + 32 * k < n) {
        e[k] = expf(e[k] - m);
        l += e[k];
      }
    }
    l = warp_sum(l);
    __syncwarp();
#pragma unroll
    for (int k = 0; k < STEP_MAX_WINDOW / 32; ++k)
      if (tid + 32 * k < n) sc[tid + 32 * k] = e[k];
    if (tid == 0) sc[W] = l;
  }
  __syncthreads();
  const float l = sc[W];
  for (int c = tid; c < Dh; c += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < n; ++j) acc += sc[j] * vc[((first + j) % W) * Dh + c];
    o[b * d + h * Dh + c] = acc / l;
  }
}

// ---- advance --------------------------------------------------------------------------------------
// pos[b] += 1, one thread per environment (after the last layer's step).
extern "C" __global__ void cudarl_attention_advance(i64* pos, i64 n) {
  const i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
  if (i < n) pos[i] += 1;
}
