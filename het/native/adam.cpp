// Adam's steps of a push that sums several (het.ps.server.store.optim.adam_steps), in one pass a point
// instead of a dozen tensor ops: the same floats, op for op (the build does not contract them
// into FMAs), the square roots and the row means by torch's own kernels (their bits).
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <vector>

#include "common.h"

namespace {

constexpr int64_t kPoints = 8;  // het.ps.server.store.optim.ADAM_POINTS

// Where point j of a row of u steps starts and ends, and the step it is taken at (het.ps.server.store.optim.adam_steps).
struct Point {
  int64_t first, end, k;
};

Point point_of(int64_t j, int64_t u) {
  int64_t first, end;
  if (j < kPoints) {
    first = std::min(j, u), end = std::min(j + 1, u);
  } else {
    const int64_t rest = std::max<int64_t>(u - kPoints, 0), i = j - kPoints;
    first = kPoints + rest * i / kPoints, end = kPoints + rest * (i + 1) / kPoints;
  }
  return {first, end, std::min(std::max<int64_t>(first + (end - first + 1) / 2, 1), u)};
}

// The steps' mean squares, (n, D): `sq / u` per coordinate, or a row's mean shared out in
// proportion to the mean gradient's squares (torch.where(mean > 0, gsq * (per / mean.clamp(1e-30)), per)).
void mean_squares(const float* g, const float* sq, const int64_t* u, int64_t n, int64_t D, int64_t W, float* out) {
  for (int64_t i = 0; i < n * D; ++i) out[i] = g[i] * g[i];
  if (W != 1) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t d = 0; d < D; ++d) out[i * D + d] = sq[i * D + d] / float(u[i]);
    }
    return;
  }
  const auto mean = torch::from_blob(out, {n, D}, torch::kFloat32).mean(1, true);
  const float* mn = mean.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float per = sq[i] / float(u[i]);
    const float scale = per / std::max(mn[i], 1e-30f);
    for (int64_t d = 0; d < D; ++d) out[i * D + d] = mn[i] > 0 ? out[i * D + d] * scale : per;
  }
}

}  // namespace

// het.ps.server.store.optim.adam_steps on gathered rows: the moments old_m, old_v (n, D), the summed
// gradients (n, D), their steps u (n,) and squares sq (n, 1 or D), the tables p1, p2 (b^i) and
// sizes (the step sizes of the last top + 1 steps). Returns the rows' move, and the new moments.
std::vector<torch::Tensor> adam_steps(torch::Tensor old_m, torch::Tensor old_v, torch::Tensor grads,
                                      torch::Tensor counts, torch::Tensor sq, torch::Tensor p1, torch::Tensor p2,
                                      torch::Tensor sizes, double eps) {
  for (auto* t : {&old_m, &old_v, &grads, &sq, &p1, &p2, &sizes}) check(*t, torch::kFloat32, "adam_steps");
  check(counts, torch::kInt64, "counts");
  const int64_t n = grads.size(0), D = grads.dim() == 2 ? grads.size(1) : 0, W = sq.size(1), top = p1.numel() - 1;
  TORCH_CHECK(old_m.sizes() == grads.sizes() && old_v.sizes() == grads.sizes() && counts.numel() == n &&
                  sq.size(0) == n && (W == 1 || W == D) && p2.numel() == top + 1 && sizes.numel() == top + 1,
              "adam_steps: shapes do not match");
  const int64_t* u = counts.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(u[i] >= 1 && u[i] <= top, "adam_steps: counts must lie in [1, ", top, "]");
  const float *m0 = old_m.data_ptr<float>(), *v0 = old_v.data_ptr<float>(), *gr = grads.data_ptr<float>();
  const float *a1 = p1.data_ptr<float>(), *a2 = p2.data_ptr<float>(), *sz = sizes.data_ptr<float>();
  auto g = torch::empty({n, D}, torch::kFloat32), gsq = torch::empty({n, D}, torch::kFloat32);
  auto vk = torch::empty({n, D}, torch::kFloat32), move = torch::zeros({n, D}, torch::kFloat32);
  float *gp = g.data_ptr<float>(), *qp = gsq.data_ptr<float>(), *vp = vk.data_ptr<float>(), *mv = move.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t d = 0; d < D; ++d) gp[i * D + d] = gr[i * D + d] / float(u[i]);
  }
  mean_squares(gp, sq.data_ptr<float>(), u, n, D, W, qp);
  const float feps = float(eps);
  std::vector<Point> points(static_cast<size_t>(n));
  for (int64_t j = 0; j < 2 * kPoints; ++j) {
    for (int64_t i = 0; i < n; ++i) {
      points[i] = point_of(j, u[i]);
      const float b = a2[points[i].k], c = 1 - b;
      for (int64_t d = 0; d < D; ++d) vp[i * D + d] = b * v0[i * D + d] + c * qp[i * D + d];
    }
    const auto root = vk.sqrt();  // torch's kernel, as the reference's vk.sqrt()
    const float* rt = root.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      const Point& p = points[i];
      const float b = a1[p.k], c = 1 - b, w = float(p.end - p.first) * sz[top - u[i] + p.k];
      for (int64_t d = 0; d < D; ++d) {
        const int64_t x = i * D + d;
        const float mk = b * m0[x] + c * gp[x];
        mv[x] += w * mk / (rt[x] + feps);
      }
    }
  }
  auto new_m = torch::empty({n, D}, torch::kFloat32), new_v = torch::empty({n, D}, torch::kFloat32);
  float *nm = new_m.data_ptr<float>(), *nv = new_v.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float b1 = a1[u[i]], c1 = 1 - b1, b2 = a2[u[i]], c2 = 1 - b2;
    for (int64_t d = 0; d < D; ++d) {
      const int64_t x = i * D + d;
      nm[x] = b1 * m0[x] + c1 * gp[x];
      nv[x] = b2 * v0[x] + c2 * qp[x];
    }
  }
  return {move, new_m, new_v};
}
