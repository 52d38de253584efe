// Adagrad's move for a sum of steps (het/adagrad.py), shared by the cache's local rule and a
// fixed table's push.
#pragma once

#include "common.h"

// The local rule that follows the table's Adagrad (TorchStep._server_step): the step the
// server will take with a push of `p`, from the accumulator `a` (W = 1: one per row, the mean
// of the squares; W = D: one per coordinate), written as -step into `out` (may alias nothing).
// The sum of the squares of x[0..D), in 16 lanes the compiler vectorises (a serial sum in
// double was a quarter of the cache's update at dim 128).
inline float sum_squares(const float* x, int64_t D) {
  float lane[16] = {0};
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    for (int l = 0; l < 16; ++l) lane[l] += x[d + l] * x[d + l];
  }
  for (; d < D; ++d) lane[d & 15] += x[d] * x[d];
  float sum = 0;
  for (int l = 0; l < 16; ++l) sum += lane[l];
  return sum;
}

struct Follow {
  float lr, eps;
  int64_t W, D;
  // het.adagrad.adagrad_factor: one step 1 / (sqrt(a + q) + eps); u > 1 steps of like size
  // 2 / (sqrt(a + q + h) + sqrt(a + h) + 2 eps), h = q / 2u
  float factor(float a, float q, int64_t u) const {
    if (u > 1) {
      const float h = q / float(2 * u);
      return 2.0f / (std::sqrt(a + q + h) + std::sqrt(a + h) + 2.0f * eps);
    }
    return 1.0f / (std::sqrt(a + q) + eps);
  }
  // out[d] = -(p[d] * factor * lr): minus the step the server will take with a push of `p`,
  // the sum of `u` steps whose squares sum to `q`, from the accumulator `a` (W floats each)
  void neg_step(const float* __restrict__ a, const float* __restrict__ p, const float* __restrict__ q, int64_t u,
                float* __restrict__ out) const {
    if (u == 0) {
      std::fill(out, out + D, 0.0f);
    } else if (W == 1) {
      const float f = factor(a[0], q[0], u);
      for (int64_t d = 0; d < D; ++d) out[d] = -(p[d] * f * lr);
    } else if (u > 1) {  // factor's arithmetic, the branch out of the loop: it vectorises
      const float twice_u = float(2 * u), two_eps = 2.0f * eps;
      for (int64_t d = 0; d < D; ++d) {
        const float h = q[d] / twice_u;
        out[d] = -(p[d] * (2.0f / (std::sqrt(a[d] + q[d] + h) + std::sqrt(a[d] + h) + two_eps)) * lr);
      }
    } else {
      for (int64_t d = 0; d < D; ++d) out[d] = -(p[d] * (1.0f / (std::sqrt(a[d] + q[d]) + eps)) * lr);
    }
  }
  // what one step of gradient `g` adds to the squares `q`
  void add_squares(float* q, const float* g) const {
    if (W == 1) {
      q[0] += sum_squares(g, D) / float(D);
    } else {
      for (int64_t d = 0; d < D; ++d) q[d] += g[d] * g[d];
    }
  }
};
