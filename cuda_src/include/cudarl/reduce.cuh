// Deterministic warp and block reductions (DESIGN rule 3: fixed order, no float atomics).
//
// Every helper has one fixed association order that depends only on the shape (32 lanes, or
// n shared slots), never on scheduling, so a float result is bitwise repeatable on one GPU.
// The NumPy twins do not reproduce these orders; parity tests compare within rounding.
//
//   warp_sum(v)             xor butterfly over the 32 lanes; every lane gets the same bits
//                           (IEEE + is commutative, so lanes i and i^o add the same pair).
//   warp_max / warp_min(v)  the same butterfly with max (fmaxf for float) or min.
//   block_tree_sum(sh, n)   the pairs sh[t] += sh[t + s] for s = n/2, ..., 1 over sh[0 .. n):
//                           levels s >= 32 in shared memory, a __syncthreads() before each;
//                           when blockDim.x >= 32 and n >= 32, levels 16 .. 1 in registers of
//                           the first warp (warp_tree_sum: lane t adds lane t + s, the same
//                           pair), so five barriers instead of nine at n = 256. The sum is in
//                           sh[0], visible to every thread (a __syncthreads() after); sh[1 ..)
//                           hold partial sums the caller must not rely on.
//   block_tree_sum2(a, b, n) the same tree over two arrays, one barrier a level for both.
//   warp_tree_sum(v)        lane 0 gets sum_l v_l by the pairs of a 32-slot tree (lane t adds
//                           lane t + s for s = 16, ..., 1; other lanes: partial sums).
//   block_sum(v, sh, n)     every thread contributes v (n == blockDim.x); the tree above;
//                           returns the sum to every thread (safe to call back to back on sh).
//   block_weighted_sum<N>(values, w, n, sh)
//                           sum_i w_i values_i over i < n in the order of an N-thread block:
//                           slot j < N sums i = j, j + N, ... in order, then the tree over N
//                           slots. The order depends on N and n only, never on blockDim.x, so
//                           every block size gives the same bits. values are read from L2
//                           (load_l2, not through L1): they may be what other blocks of this
//                           launch wrote before a last_block() that returned true.
//   block_ordered_sum<N>(values, n, sh)
//                           block_weighted_sum<N> without the weights: sum_i values_i in the
//                           order of an N-thread block (the one-block regularizers_mean launch's
//                           when N is its 256), read from L2 as above.
//   block_strided_sum<N>(n, sh, term)
//                           the body of both: sum_i term(i) in that order and tree (term: a
//                           device lambda; the two above pass w[i] * value_i and value_i).
//   last_block(counter)     true in every thread of the one block of the launch that finishes
//                           last (integer atomicAdd on *counter: which block is last varies,
//                           what it computes then does not). Writes a block made before the
//                           call are visible to the last block after it (fence, ticket, fence).
//                           *counter must be 0 at launch; the last block sets it back to 0.
//   grid_barrier(counter)   every block of the launch waits until all gridDim.x blocks have
//                           arrived (integer atomicAdd, then an acquire-load spin). Writes a
//                           block made before the call are visible to every block after it.
//                           Needs every block resident at once: the launcher keeps the grid at
//                           most the device's multiprocessor count (kernels.resident_grid_limit),
//                           so each block has an SM once the SM's other work drains. *counter
//                           must be 0 at launch and is NOT reset here (a block may still be
//                           spinning): the block that last_block() picks at the end of the
//                           launch, when every block is past the barrier, sets it back to 0.
//
// Call warp helpers with all 32 lanes active; call block helpers from every thread of a 1-D
// block (they synchronise), with n a power of two, n <= blockDim.x (block_sum: n == blockDim.x;
// block_weighted_sum: any blockDim.x).
#pragma once

namespace cudarl {

constexpr unsigned int kFullWarp = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullWarp, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, o));
  return v;
}

__device__ __forceinline__ unsigned long long warp_max(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long w = __shfl_xor_sync(kFullWarp, v, o);
    v = v > w ? v : w;
  }
  return v;
}

__device__ __forceinline__ unsigned long long warp_min(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long w = __shfl_xor_sync(kFullWarp, v, o);
    v = v < w ? v : w;
  }
  return v;
}

// The pairs of a 32-slot tree, slot t in lane t: at level s, lane t < s adds lane t + s (which holds
// what slot t + s held after the level before, since t + s < 2s), so lane 0 ends with the bits of
// sh[0] after block_tree_sum's levels 16 .. 1 (IEEE + is commutative: v + w is w + v). Lanes >= s
// add what __shfl_down_sync gives them (partial sums or their own value): never read.
template <typename T>
__device__ __forceinline__ T warp_tree_sum(T v) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) v += __shfl_down_sync(kFullWarp, v, s);
  return v;
}

// Levels s >= 32 in shared memory; the last five in the first warp's registers when the first warp
// is whole (blockDim.x >= 32: the shuffles need all 32 lanes) and holds 32 slots (n >= 32); else
// every level in shared memory, as before. Both give the same bits (the same pairs in the same order).
template <typename T>
__device__ __forceinline__ void block_tree_sum(T* sh, int n) {
  const int t = (int)threadIdx.x;
  const bool warp_tail = n >= 32 && blockDim.x >= 32;
  const int last = warp_tail ? 32 : 1;  // the smallest level done in shared memory
  for (int s = n >> 1; s >= last; s >>= 1) {
    __syncthreads();
    if (t < s) sh[t] += sh[t + s];
  }
  __syncthreads();
  if (warp_tail) {
    if (t < 32) {
      const T v = warp_tree_sum(sh[t]);
      if (t == 0) sh[0] = v;
    }
    __syncthreads();
  }
}

// block_tree_sum over two arrays at once: the same pairs in each (the same bits as two calls),
// one __syncthreads() per level for both, the last five levels in the first warp as there.
template <typename T>
__device__ __forceinline__ void block_tree_sum2(T* sh1, T* sh2, int n) {
  const int t = (int)threadIdx.x;
  const bool warp_tail = n >= 32 && blockDim.x >= 32;
  const int last = warp_tail ? 32 : 1;
  for (int s = n >> 1; s >= last; s >>= 1) {
    __syncthreads();
    if (t < s) {
      sh1[t] += sh1[t + s];
      sh2[t] += sh2[t + s];
    }
  }
  __syncthreads();
  if (warp_tail) {
    if (t < 32) {
      const T v1 = warp_tree_sum(sh1[t]), v2 = warp_tree_sum(sh2[t]);
      if (t == 0) {
        sh1[0] = v1;
        sh2[0] = v2;
      }
    }
    __syncthreads();
  }
}

template <typename T>
__device__ __forceinline__ T block_sum(T v, T* sh, int n) {
  __syncthreads();  // sh may still be read by a previous call
  sh[threadIdx.x] = v;
  block_tree_sum(sh, n);
  return sh[0];
}

// A load from L2 (ld.global.cg, what __ldcg emits, spelled out for NVRTC), not through this SM's
// L1: it sees what other blocks of the launch wrote before their fence.
__device__ __forceinline__ float load_l2(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ double load_l2(const double* p) {
  double v;
  asm volatile("ld.global.cg.f64 %0, [%1];" : "=d"(v) : "l"(p));
  return v;
}

// Fixed-order sum of term(i) over i < n by one block (see block_weighted_sum in the banner); sh
// holds N floats, N a power of two. Returns the sum to every thread. The one body of
// block_weighted_sum and block_ordered_sum, which differ only in the term.
template <int N, typename Term>
__device__ __forceinline__ float block_strided_sum(int n, float* sh, Term term) {
  __syncthreads();  // sh may still be read by a previous call
  for (int j = (int)threadIdx.x; j < N; j += (int)blockDim.x) {
    float acc = 0.f;
    for (int i = j; i < n; i += N) acc += term(i);
    sh[j] = acc;
  }
  for (int s = N >> 1; s > 0; s >>= 1) {  // the pairs of block_tree_sum(sh, N), for any blockDim.x
    __syncthreads();
    for (int j = (int)threadIdx.x; j < s; j += (int)blockDim.x) sh[j] += sh[j + s];
  }
  __syncthreads();
  return sh[0];
}

// Fixed-order weighted sum of n values by one block (see the banner).
template <int N>
__device__ __forceinline__ float block_weighted_sum(const float* values, const float* w, int n, float* sh) {
  return block_strided_sum<N>(n, sh, [=](int i) { return w[i] * load_l2(values + i); });
}

// Fixed-order sum of n values by one block (see the banner): block_weighted_sum's order and tree.
template <int N>
__device__ __forceinline__ float block_ordered_sum(const float* values, int n, float* sh) {
  return block_strided_sum<N>(n, sh, [=](int i) { return load_l2(values + i); });
}

// A fence with acquire and release semantics at GPU scope (PTX fence.acq_rel.gpu): lighter than
// __threadfence()'s sequentially consistent fence, and all the two patterns below need.
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// Is this the last block of the launch to get here? Call once per launch from every thread of
// every block, after the block's writes that the last block reads (see the banner).
// One thread fences for the block, as cooperative groups' grid sync does: the __syncthreads()
// before it orders every thread's writes before thread 0's release fence (fences are cumulative
// over what their thread has synchronised with), and the one after it orders thread 0's acquire
// before every thread's reads. (Every thread fenced before: 128 fences a block, ncu at af237d7.)
__device__ __forceinline__ bool last_block(unsigned int* counter) {
  __shared__ int is_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_acq_rel_gpu();  // release the block's writes before the ticket
    const bool last = atomicAdd(counter, 1u) == gridDim.x - 1u;
    if (last) {
      *counter = 0u;  // every block has its ticket: ready for the next launch
      fence_acq_rel_gpu();  // acquire the other blocks' released writes
    }
    is_last = last;
  }
  __syncthreads();
  return is_last != 0;
}

// An acquire load at GPU scope (PTX ld.acquire.gpu): later reads see what the writer released.
__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Wait for every block of the launch (see the banner: residency and the reset are the caller's).
// One thread fences and waits for the block (see last_block).
__device__ __forceinline__ void grid_barrier(unsigned int* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_acq_rel_gpu();  // release the block's writes before it arrives
    atomicAdd(counter, 1u);
    while (load_acquire(counter) < gridDim.x) __nanosleep(32);
  }
  __syncthreads();
}

}  // namespace cudarl
