// Gradient Vaccine (Wang et al., ICLR 2021) between the main and the auxiliary gradients on the
// encoder (agent.aux = [..., "vaccine"]). Twin: cudarl/reference/vaccine.py (the equations and our
// choices). Launchers: cudarl/ops/vaccine.py. No float atomics, fixed-order sums, two forms of the same
// bits: two launches, dots_control (a block a VC_CHUNK chunk; the last block to finish, by an integer
// ticket, the control step), then apply (grid-stride); or one, dots_control_apply (the chunks, a grid
// barrier, the control step's sums in every block, the apply: run.grid_barrier). The _plus kernels read
// the flat gradient as full + plus (causal's own gradient folded in).

#include <cudarl/reduce.cuh>
#include <cudarl/vaccine.cuh>

#define VC_THREADS 256
#define VC_CHUNK 4096
#define VC_PHI_MAX (1.0f - 1e-6f)

// ---------------------------------------------------------------------------------------------
// The control step (every thread of one block sums; thread 0 computes): sums the P partials (strided then
// a tree), phi = cosine, the coefficient c of the paper's eq. 4 against phi_hat = old (state[0] read before
// it moves), then the EMA phi_hat <- (1 - beta) phi_hat + beta phi; where state is given, thread 0 writes
// state = [phi_hat, phi, c, |g_m|, |g_a|]. Returns c to thread 0 (other threads: 0). The partials were
// written by other blocks of the launch before their tickets (or the grid barrier): read from L2.
// The one text of dots_control's last block and of every block of dots_control_apply: the same bits.
__device__ __forceinline__ float vc_control(const float* partial, int P, float beta, float old, float* state,
                                            float* sh) {
  float mg = 0.f, mm = 0.f, aa = 0.f;
  for (int p = threadIdx.x; p < P; p += VC_THREADS) {
    mg += __ldcg(partial + 3 * p + 0);
    mm += __ldcg(partial + 3 * p + 1);
    aa += __ldcg(partial + 3 * p + 2);
  }
  mg = cudarl::block_sum(mg, sh, VC_THREADS);
  mm = cudarl::block_sum(mm, sh, VC_THREADS);
  aa = cudarl::block_sum(aa, sh, VC_THREADS);
  if (threadIdx.x != 0) return 0.f;
  const float target = fminf(old, VC_PHI_MAX);
  const float nm = sqrtf(mm), na = sqrtf(aa);
  const bool both = nm > 0.f && na > 0.f;
  const float phi = both ? mg / (nm * na) : 0.f;
  float c = 0.f;
  if (both && phi < target) {
    const float st = sqrtf(1.f - target * target);
    c = na * (target * sqrtf(fmaxf(1.f - phi * phi, 0.f)) - phi * st) / (nm * st);
  }
  if (state != nullptr) {
    state[0] = (1.f - beta) * target + beta * phi;
    state[1] = phi;
    state[2] = c;
    state[3] = nm;
    state[4] = na;
  }
  return c;
}

// ---------------------------------------------------------------------------------------------
// The flat gradient's element i: full[i], or with PLUS full[i] + plus[i] (another signal's own gradient,
// causal intervention's, added on the fly where its grad phase once added it over the whole buffer first:
// the same IEEE sum, so the same bits; one node fewer on the MLP step's tail, issue 19).
template <bool PLUS>
__device__ __forceinline__ float vc_full(const float* full, const float* plus, long long i) {
  return PLUS ? full[i] + plus[i] : full[i];
}

// The partial sums of chunk p of [lo, hi), with g_m = full - aux and g_a = aux:
//   partial[p] = (sum g_m g_a, sum g_m^2, sum g_a^2) (elements strided per thread in order, then the
//   block's tree; thread 0 writes). sh: VC_THREADS floats. The one text of both forms' chunks.
template <bool PLUS>
__device__ __forceinline__ void vc_chunk(const float* full, const float* plus, const float* aux, float* partial,
                                         long long p, long long lo, long long hi, float* sh) {
  const long long start = lo + p * VC_CHUNK;
  const long long stop = min(start + VC_CHUNK, hi);
  float mg = 0.f, mm = 0.f, aa = 0.f;
  for (long long i = start + threadIdx.x; i < stop; i += VC_THREADS) {
    const float a = aux[i];
    const float m = vc_full<PLUS>(full, plus, i) - a;
    mg += m * a;
    mm += m * m;
    aa += a * a;
  }
  mg = cudarl::block_sum(mg, sh, VC_THREADS);
  mm = cudarl::block_sum(mm, sh, VC_THREADS);
  aa = cudarl::block_sum(aa, sh, VC_THREADS);
  if (threadIdx.x == 0) {
    partial[3 * p + 0] = mg;
    partial[3 * p + 1] = mm;
    partial[3 * p + 2] = aa;
  }
}

// The body of dots_control: chunk blockIdx.x (vc_chunk); the block that finishes last (cudarl::last_block
// on the integer ticket *done, 0 at launch and left 0) then takes the control step over the P = gridDim.x
// partials. One launch where dots and a one-block control kernel were two (issue 19: one node fewer on
// the MLP step's path), the same arithmetic in the same order: the same bits.
template <bool PLUS>
__device__ __forceinline__ void vc_dots_control(const float* __restrict__ full, const float* __restrict__ plus,
                                                const float* __restrict__ aux, float* partial,
                                                float* __restrict__ state, unsigned int* __restrict__ done,
                                                long long lo, long long hi, float beta) {
  __shared__ float sh[VC_THREADS];
  vc_chunk<PLUS>(full, plus, aux, partial, blockIdx.x, lo, hi, sh);
  if (!cudarl::last_block(done)) return;
  vc_control(partial, (int)gridDim.x, beta, state[0], state, sh);
}

// The body of apply: grads[i] = f + c (f - aux[i]) on [lo, hi), f elsewhere, f = vc_full (grads may be
// full or aux: each element is read, then written, by one thread). Grid-stride over the launch.
template <bool PLUS>
__device__ __forceinline__ void vc_apply_c(const float* full, const float* plus, const float* aux, float* grads,
                                           float c, long long n, long long lo, long long hi) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const float f = vc_full<PLUS>(full, plus, i);
    grads[i] = (i >= lo && i < hi) ? cudarl::vaccine_elem(f, aux[i], c) : f;
  }
}

// apply's launch: c = state[2] (dots_control's).
template <bool PLUS>
__device__ __forceinline__ void vc_apply(const float* full, const float* plus, const float* aux, float* grads,
                                         const float* __restrict__ state, long long n, long long lo, long long hi) {
  vc_apply_c<PLUS>(full, plus, aux, grads, state[2], n, lo, hi);
}

// The body of dots_control_apply: dots_control then apply in one launch, with their bits.
// grid = G <= kernels.resident_grid_limit() blocks (every block resident, for cudarl::grid_barrier),
// block = VC_THREADS; P = the chunks of [lo, hi).
//  1. Block b: the chunks p = b, b + G, ... (vc_chunk: the partials' bits whatever G is). Every block
//     reads the old phi_hat = state[0] first (block 0 rewrites state after the barrier).
//  2. cudarl::grid_barrier(barrier): every partial is written. Then cudarl::last_block(done): the block
//     it picks (every block is past the barrier by then) sets *barrier back to 0; both counters are 0 at
//     launch and left 0.
//  3. Every block the control step's sums over the P partials from L2 in its order (vc_control): every
//     block the same c, without a second barrier; block 0 thread 0 writes state.
//  4. The apply over [0, n), grid-stride (vc_apply_c, stride G * VC_THREADS). grads may be full or aux:
//     every read of the chunks is before the barrier, and the apply reads element i before it writes it.
template <bool PLUS>
__device__ __forceinline__ void vc_dots_control_apply(const float* full, const float* plus, const float* aux,
                                                      float* grads, float* partial, float* state,
                                                      unsigned int* barrier, unsigned int* done, long long n,
                                                      long long lo, long long hi, float beta) {
  __shared__ float sh[VC_THREADS];
  __shared__ float sh_c;
  const float old = state[0];
  const long long P = (hi - lo + VC_CHUNK - 1) / VC_CHUNK;
  for (long long p = blockIdx.x; p < P; p += gridDim.x) vc_chunk<PLUS>(full, plus, aux, partial, p, lo, hi, sh);
  cudarl::grid_barrier(barrier);
  if (cudarl::last_block(done) && threadIdx.x == 0) *barrier = 0u;
  const float c = vc_control(partial, (int)P, beta, old, blockIdx.x == 0 ? state : nullptr, sh);
  if (threadIdx.x == 0) sh_c = c;
  __syncthreads();
  vc_apply_c<PLUS>(full, plus, aux, grads, sh_c, n, lo, hi);
}

// ---------------------------------------------------------------------------------------------
// cudarl_vaccine_dots_control: vc_dots_control over full (the flat gradient as it is).
// Threads: one VC_THREADS block per chunk. Reads 8 (hi - lo) + 12 P bytes; writes 12 P + 20.
extern "C" __global__ void cudarl_vaccine_dots_control(const float* __restrict__ full, const float* __restrict__ aux,
                                                       float* partial, float* __restrict__ state,
                                                       unsigned int* __restrict__ done, long long lo, long long hi,
                                                       float beta) {
  vc_dots_control<false>(full, nullptr, aux, partial, state, done, lo, hi, beta);
}

// cudarl_vaccine_dots_control_plus: vc_dots_control over full + plus.
// Threads: one VC_THREADS block per chunk. Reads 12 (hi - lo) + 12 P bytes; writes 12 P + 20.
extern "C" __global__ void cudarl_vaccine_dots_control_plus(const float* __restrict__ full,
                                                            const float* __restrict__ plus,
                                                            const float* __restrict__ aux, float* partial,
                                                            float* __restrict__ state, unsigned int* __restrict__ done,
                                                            long long lo, long long hi, float beta) {
  vc_dots_control<true>(full, plus, aux, partial, state, done, lo, hi, beta);
}

// ---------------------------------------------------------------------------------------------
// cudarl_vaccine_apply: grads[i] = full[i] + c (full[i] - aux[i]) on [lo, hi), full[i] elsewhere.
// Threads: grid-stride. Reads 8n bytes; writes 4n.
extern "C" __global__ void cudarl_vaccine_apply(const float* full, const float* aux, float* grads,
                                                const float* __restrict__ state, long long n, long long lo,
                                                long long hi) {
  vc_apply<false>(full, nullptr, aux, grads, state, n, lo, hi);
}

// cudarl_vaccine_apply_plus: as apply over f = full[i] + plus[i] (grads may be full: each element is read,
// then written, by one thread). Threads: grid-stride. Reads 12n bytes; writes 4n.
extern "C" __global__ void cudarl_vaccine_apply_plus(const float* full, const float* plus, const float* aux,
                                                     float* grads, const float* __restrict__ state, long long n,
                                                     long long lo, long long hi) {
  vc_apply<true>(full, plus, aux, grads, state, n, lo, hi);
}

// ---------------------------------------------------------------------------------------------
// cudarl_vaccine_dots_control_apply: vc_dots_control_apply over full: dots_control then apply, one launch.
// Threads: G <= resident_grid_limit() blocks of VC_THREADS (chunks strided over blocks, then grid-stride).
// Reads 8 (hi - lo) + 12 P G + 8n bytes; writes 12 P + 20 + 4n.
extern "C" __global__ void cudarl_vaccine_dots_control_apply(const float* full, const float* aux, float* grads,
                                                             float* partial, float* state, unsigned int* barrier,
                                                             unsigned int* done, long long n, long long lo,
                                                             long long hi, float beta) {
  vc_dots_control_apply<false>(full, nullptr, aux, grads, partial, state, barrier, done, n, lo, hi, beta);
}

// cudarl_vaccine_dots_control_apply_plus: vc_dots_control_apply over f = full + plus (grads may be full).
// Threads: as dots_control_apply. Reads 12 (hi - lo) + 12 P G + 12n bytes; writes 12 P + 20 + 4n.
extern "C" __global__ void cudarl_vaccine_dots_control_apply_plus(const float* full, const float* plus,
                                                                  const float* aux, float* grads, float* partial,
                                                                  float* state, unsigned int* barrier,
                                                                  unsigned int* done, long long n, long long lo,
                                                                  long long hi, float beta) {
  vc_dots_control_apply<true>(full, plus, aux, grads, partial, state, barrier, done, n, lo, hi, beta);
}
