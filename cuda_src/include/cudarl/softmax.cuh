// A warp's softmax over one row of K logits, in one fixed order (lanes over atoms k = lane,
// lane + 32, ...), shared by qstats.per_sample and agent.act_c51 so that the expected Q they
// compute from the same logits is the same bits.
#pragma once

#include <cudarl/reduce.cuh>

namespace cudarl {

// m = max_k x_k and log_s = log sum_k exp(x_k - m) (warp_max, warp_sum: the same on every lane);
// then visit(k, lp_k, p_k) for each atom k of this lane, lp_k = x_k - m - log_s, p_k = exp(lp_k).
// x_at(k) gives logit k (a pure function: it is called up to three times for one k, e.g. to combine
// a dueling head's raw output on the fly, agent.act_c51_dueling). Call with all 32 lanes.
template <class XAt, class Visit>
__device__ __forceinline__ void warp_softmax_visit_at(XAt&& x_at, int K, int lane, Visit&& visit) {
  float mx = __int_as_float((int)0xff800000u);  // -inf
  for (int k = lane; k < K; k += 32) mx = fmaxf(mx, x_at(k));
  mx = warp_max(mx);
  float s = 0.f;
  for (int k = lane; k < K; k += 32) s += expf(x_at(k) - mx);
  s = warp_sum(s);
  const float log_s = logf(s);
  for (int k = lane; k < K; k += 32) {
    const float lp = x_at(k) - mx - log_s;
    visit(k, lp, expf(lp));
  }
}

// warp_softmax_visit_at over a row of logits in memory, x [K].
template <class Visit>
__device__ __forceinline__ void warp_softmax_visit(const float* x, int K, int lane, Visit&& visit) {
  warp_softmax_visit_at([&](int k) { return x[k]; }, K, lane, visit);
}

}  // namespace cudarl
