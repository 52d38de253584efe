// A fixed table's push and a reply's rows on the shard (het/ps/store/kernels.py), and the
// finiteness check of het/ps/limits.py.
#include "adagrad.h"
#include "ops.h"

// Whether every float of x[0 .. n) is finite: an exponent of all ones is inf or NaN. Bit tests
// the compiler vectorises, where a loop of std::isfinite runs one float at a time.
static bool all_finite(const float* x, int64_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  for (int64_t b = 0; b < n; b += 4096) {
    uint32_t bad = 0;
    const int64_t e = std::min(n, b + 4096);
    for (int64_t i = b; i < e; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, 4);
      bad |= uint32_t((bits & kExponent) == kExponent);
    }
    if (bad) return false;
  }
  return true;
}

// het.ps.limits.all_finite: whether every float of a contiguous float32 tensor is finite.
bool all_finite_op(torch::Tensor x) {
  check(x, torch::kFloat32, "x");
  return all_finite(x.data_ptr<float>(), x.numel());
}

// The square roots of an (m, D) block, by torch's kernel, as the reference's `sqrt_` takes them
// (the same bits: torch's vectorised sqrt is not always IEEE's correctly rounded one).
static torch::Tensor torch_sqrt(float* values, int64_t m, int64_t D) {
  return torch::from_blob(values, {m, D}, torch::kFloat32).sqrt();
}

// table_push's SGD in place, in one pass over the gradients in order (duplicates one after
// another): each row's old value, clock and mark are kept aside before it changes, the new
// value checked as it is written (rows prefetched ahead); if any value is not finite or a clock
// would pass max_clock, every row is put back, last change first. The same floats as the
// general path, without reading the rows twice.
static int64_t sgd_push_in_place(float* w, int64_t* ck, bool* tc, const int64_t* r, const int64_t* a, const float* g,
                                 const int64_t* cn, int64_t n, int64_t D, float nlr, int64_t max_clock) {
  constexpr uint32_t kExponent = 0x7f800000u;
  thread_local std::vector<float> undo;
  thread_local std::vector<int64_t> undo_clock;
  thread_local std::vector<uint8_t> undo_mark;
  if (undo.size() < size_t(n * D)) undo.resize(size_t(n * D));
  if (undo_clock.size() < size_t(n)) undo_clock.resize(size_t(n)), undo_mark.resize(size_t(n));
  int64_t failed = 0, done = 0;
  bool clock_failed = false;
  for (; done < n && !failed; ++done) {
    const int64_t i = done;
    if (i + kAhead < n) {
      prefetch(w + r[a[i + kAhead]] * D, D * 4, true);
      prefetch(ck + r[a[i + kAhead]], 8, true);
    }
    const int64_t row = r[a[i]];
    float* wi = w + row * D;
    const float* gi = g + i * D;
    std::copy(wi, wi + D, undo.data() + i * D);
    undo_clock[i] = ck[row];
    undo_mark[i] = tc[row];
    uint32_t bad = 0;
    for (int64_t d = 0; d < D; ++d) {
      const float step = gi[d] * nlr;
      const float after = wi[d] + step;
      uint32_t bits;
      std::memcpy(&bits, &after, 4);
      bad |= uint32_t((bits & kExponent) == kExponent);
      wi[d] = after;
    }
    ck[row] += cn[i];
    tc[row] = true;
    if (bad) failed = 1;  // a row's failure stops the pass, and names the push's (as the general path)
    else if (ck[row] > max_clock) clock_failed = true;
  }
  if (!failed && clock_failed) failed = 100;
  if (failed) {
    for (int64_t i = done - 1; i >= 0; --i) {  // put back, last change first: duplicates end at their first value
      const int64_t row = r[a[i]];
      std::copy(undo.data() + i * D, undo.data() + (i + 1) * D, w + row * D);
      ck[row] = undo_clock[i];
      tc[row] = undo_mark[i] != 0;
    }
  }
  return failed;
}

// FixedRows.push for a fixed table, all or nothing: the new rows and optimizer state of the
// unique `rows` are computed aside and checked first (every value finite, no clock past
// max_clock), and written only if they pass. `at` gives each gradient's place in `rows`, and
// `inverse` each count's. SGD applies the gradients in order, duplicates one after another;
// Adagrad and Adam take one gradient per row (duplicates summed by the caller). The floats follow
// het.ps.store.optim's tensor ops: torch's index_add_(alpha) is a fused multiply-add (its kernel:
// vec::fmadd), and square roots are torch's. Returns 0, or what failed: 1 rows, 2 + i state i,
// 100 a clock.
int64_t table_push(const std::string& kind, torch::Tensor weight, std::vector<torch::Tensor> state,
                   torch::Tensor clocks, torch::Tensor touched, torch::Tensor rows, torch::Tensor at,
                   torch::Tensor inverse, torch::Tensor grads, torch::Tensor counts, double lr, double eps,
                   double beta1, double beta2, double step_size, int64_t max_clock, torch::Tensor steps,
                   torch::Tensor sq) {
  check(weight, torch::kFloat32, "weight");
  for (auto& t : state) check(t, torch::kFloat32, "optimizer state");
  check(clocks, torch::kInt64, "clocks");
  check(touched, torch::kBool, "touched");
  check(rows, torch::kInt64, "rows");
  check(at, torch::kInt64, "at");
  check(inverse, torch::kInt64, "inverse");
  check(grads, torch::kFloat32, "grads");
  check(counts, torch::kInt64, "counts");
  const int64_t m = rows.numel(), n = at.numel(), D = weight.size(1);
  TORCH_CHECK(grads.size(0) == n && (n == 0 || grads.size(1) == D), "grads: expected (", n, ", ", D, "), got ",
              grads.sizes());
  TORCH_CHECK(counts.numel() == inverse.numel(), "counts: expected ", inverse.numel(), ", got ", counts.numel());
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t* a = at.data_ptr<int64_t>();
  const int64_t* inv = inverse.data_ptr<int64_t>();
  const float* g = grads.data_ptr<float>();
  const int64_t* cn = counts.data_ptr<int64_t>();
  float* w = weight.data_ptr<float>();
  int64_t* ck = clocks.data_ptr<int64_t>();
  bool* tc = touched.data_ptr<bool>();
  const int S = int(state.size());
  if (kind == "sgd" && S == 0 && inverse.numel() == n) {
    return sgd_push_in_place(w, ck, tc, r, a, g, cn, n, D, float(-lr), max_clock);
  }
  std::vector<float*> st(S);
  for (int i = 0; i < S; ++i) st[i] = state[i].data_ptr<float>();
  // the new values, aside: rows, then each state. The scratch is kept between calls (a fresh
  // megabyte-sized block a push costs page faults) and not zero-filled: every value is copied
  // in below, the rows prefetched ahead (random rows' latency is the cost of a push).
  thread_local std::vector<float> scratch;
  if (scratch.size() < size_t(m * D * (S + 1))) scratch.resize(size_t(m * D * (S + 1)));
  float* nw = scratch.data();
  float* ns = nw + m * D;
  for (int64_t j = 0; j < m; ++j) {
    if (j + kAhead < m) {
      prefetch(w + r[j + kAhead] * D, D * 4, true);
      prefetch(ck + r[j + kAhead], 8, true);
      prefetch(tc + r[j + kAhead], 1, true);
      for (int i = 0; i < S; ++i) prefetch(st[i] + r[j + kAhead] * D, D * 4, true);
    }
    std::copy(w + r[j] * D, w + (r[j] + 1) * D, nw + j * D);
    for (int i = 0; i < S; ++i) std::copy(st[i] + r[j] * D, st[i] + (r[j] + 1) * D, ns + (i * m + j) * D);
  }
  const float flr = float(lr), nlr = float(-lr), feps = float(eps);
  if (kind == "sgd") {
    for (int64_t i = 0; i < n; ++i) {  // grads.mul_(-lr), then index_add_ in order
      float* dst = nw + a[i] * D;
      const float* gi = g + i * D;
      for (int64_t d = 0; d < D; ++d) {
        const float step = gi[d] * nlr;
        dst[d] += step;
      }
    }
  } else if (kind == "adagrad") {
    for (int64_t i = 0; i < n; ++i) {  // one gradient per row
      float* acc = ns + a[i] * D;
      const float* gi = g + i * D;
      for (int64_t d = 0; d < D; ++d) {
        const float sq = gi[d] * gi[d];
        acc[d] += sq;
      }
    }
    const auto root = torch_sqrt(ns, m, D);  // torch's own kernel: its vectorised sqrt is not IEEE's
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = a[i];
      float* wj = nw + j * D;
      const float* rj = root.data_ptr<float>() + j * D;
      const float* gi = g + i * D;
      for (int64_t d = 0; d < D; ++d) {
        const float q = gi[d] / (rj[d] + feps);
        wj[d] = std::fma(q, nlr, wj[d]);
      }
    }
  } else if (kind == "adagrad_steps") {
    // het.ps.store.optim.Adagrad with a push of several steps (Pushed): row j's gradient sums steps[j]
    // steps whose squares sum to sq[j] (one float a row, shared out in proportion to the sum's
    // squares, or one a coordinate); the accumulator grows by them and the row moves by
    // lr * g * adagrad_factor. One gradient per row (at is the identity).
    check(steps, torch::kInt64, "steps");
    check(sq, torch::kFloat32, "sq");
    const int64_t W = sq.size(1);
    TORCH_CHECK(steps.numel() == n && sq.size(0) == n && (W == 1 || W == D), "steps, sq: expected (", n,
                ") and (", n, ", 1 or ", D, "), got ", steps.sizes(), " and ", sq.sizes());
    const int64_t* u = steps.data_ptr<int64_t>();
    const float* sqp = sq.data_ptr<float>();
    const Follow follow{flr, feps, W, D};
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = a[i];
      float* wj = nw + j * D;
      float* acc = ns + j * D;
      const float* gi = g + i * D;
      const float mean = W == 1 ? sum_squares(gi, D) / float(D) : 0.0f;
      for (int64_t d = 0; d < D; ++d) {
        float q = gi[d] * gi[d];
        if (u[i] > 1) q = W == D ? sqp[i * D + d] : (mean > 0 ? q * (sqp[i] / mean) : sqp[i]);
        const float f = follow.factor(acc[d], q, u[i]);
        acc[d] += q;
        wj[d] = std::fma(gi[d] * f, nlr, wj[d]);
      }
    }
  } else if (kind == "adam") {
    const float c1 = float(1 - beta1), c2 = float(1 - beta2), nstep = float(-step_size);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = a[i];
      float* mj = ns + j * D;
      float* vj = ns + (m + j) * D;
      const float* gi = g + i * D;
      for (int64_t d = 0; d < D; ++d) {
        const float dm = (gi[d] - mj[d]) * c1;
        mj[d] += dm;
        const float sq = gi[d] * gi[d];
        const float dv = (sq - vj[d]) * c2;
        vj[d] += dv;
      }
    }
    const auto root = torch_sqrt(ns + m * D, m, D);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = a[i];
      float* wj = nw + j * D;
      const float* mj = ns + j * D;
      const float* rj = root.data_ptr<float>() + j * D;
      for (int64_t d = 0; d < D; ++d) {
        const float q = mj[d] / (rj[d] + feps);
        wj[d] = std::fma(q, nstep, wj[d]);
      }
    }
  } else {
    TORCH_CHECK(false, "optimizer: expected sgd, adagrad or adam, got ", kind);
  }
  (void)flr;
  if (!all_finite(nw, m * D)) return 1;
  for (int i = 0; i < S; ++i) {
    if (!all_finite(ns + int64_t(i) * m * D, m * D)) return 2 + i;
  }
  std::vector<int64_t> nc(m);
  for (int64_t j = 0; j < m; ++j) nc[j] = ck[r[j]];
  for (int64_t i = 0; i < inverse.numel(); ++i) nc[inv[i]] += cn[i];
  for (int64_t j = 0; j < m; ++j) if (nc[j] > max_clock) return 100;
  for (int64_t j = 0; j < m; ++j) {  // all checked: write
    std::copy(nw + j * D, nw + (j + 1) * D, w + r[j] * D);
    for (int i = 0; i < S; ++i) std::copy(ns + (i * m + j) * D, ns + (i * m + j + 1) * D, st[i] + r[j] * D);
    ck[r[j]] = nc[j];
    tc[r[j]] = true;
  }
  return 0;
}

// weight[idx] as numpy's take or index_select gives it, into `out` (n, D): each row copied
// whole, the rows kAhead ahead prefetched, as a gather of random rows waits on their latency.
// Every index is checked against the table's rows first.
void gather_rows(torch::Tensor weight, torch::Tensor idx, torch::Tensor out) {
  check(weight, torch::kFloat32, "weight");
  check(idx, torch::kInt64, "idx");
  check(out, torch::kFloat32, "out");
  const int64_t n = idx.numel(), D = weight.size(1), rows = weight.size(0);
  TORCH_CHECK(out.dim() == 2 && out.size(0) == n && out.size(1) == D, "out: expected (", n, ", ", D, "), got ",
              out.sizes());
  const int64_t* k = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(k[i] >= 0 && k[i] < rows, "row ", k[i], " out of range [0, ", rows, ")");
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i + kAhead < e) prefetch(w + k[i + kAhead] * D, D * 4, false);
      std::copy(w + k[i] * D, w + (k[i] + 1) * D, o + i * D);
    }
  });
}

// A lazy reply's rows (het.ps.store.fixed.FixedRows.rows_to_send): the rows idx whose `touched` mark
// is set, in order, and `built` (n,) uint8, 1 where a row was left for the client to build.
// The rows go into `out`'s first rows (at least n of dim D: a reused reply buffer), or into a new
// tensor when `out` is empty; the rows written are returned.
std::vector<torch::Tensor> gather_touched(torch::Tensor weight, torch::Tensor touched, torch::Tensor idx,
                                          torch::Tensor out) {
  check(weight, torch::kFloat32, "weight");
  check(touched, torch::kBool, "touched");
  check(idx, torch::kInt64, "idx");
  const int64_t n = idx.numel(), D = weight.size(1), rows = weight.size(0);
  TORCH_CHECK(touched.numel() == rows, "touched: expected ", rows, " marks, got ", touched.numel());
  const int64_t* k = idx.data_ptr<int64_t>();
  const bool* tc = touched.data_ptr<bool>();
  auto built_t = torch::empty({n}, idx.options().dtype(torch::kUInt8));
  uint8_t* built = built_t.data_ptr<uint8_t>();
  int64_t sent = 0;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(k[i] >= 0 && k[i] < rows, "row ", k[i], " out of range [0, ", rows, ")");
    built[i] = !tc[k[i]];
    sent += !built[i];
  }
  if (out.numel() == 0) {
    out = torch::empty({sent, D}, weight.options());
  } else {
    check(out, torch::kFloat32, "out");
    TORCH_CHECK(out.dim() == 2 && out.size(0) >= sent && out.size(1) == D, "out: expected at least (", sent, ", ",
                D, "), got ", out.sizes());
    out = out.narrow(0, 0, sent);
  }
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  std::vector<int64_t> from;
  from.reserve(size_t(sent));
  for (int64_t i = 0; i < n; ++i) if (!built[i]) from.push_back(k[i]);
  for (int64_t j = 0; j < sent; ++j) {
    if (j + kAhead < sent) prefetch(w + from[j + kAhead] * D, D * 4, false);
    std::copy(w + from[j] * D, w + (from[j] + 1) * D, o + j * D);
  }
  return {out, built_t};
}
