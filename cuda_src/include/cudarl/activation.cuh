// The layers' activations and their backward, one copy for every kernel that applies them (nn.cu's
// layers, gemm.cu's dx GEMM with the activation's backward in its epilogue): codes 0 identity, 1 ReLU,
// 2 sigmoid. Twin: cudarl/reference/nn.py (act_forward, act_backward).
#pragma once

namespace cudarl {

__device__ __forceinline__ float act_fwd(float z, int act) {
  if (act == 1) return z > 0.f ? z : 0.f;
  if (act == 2) return 1.f / (1.f + expf(-z));
  return z;
}

// dL/dz from dL/dout and the layer's output y = act(z).
__device__ __forceinline__ float act_bwd(float dout, float y, int act) {
  if (act == 1) return y > 0.f ? dout : 0.f;
  if (act == 2) return dout * (y * (1.f - y));
  return dout;
}

}  // namespace cudarl
