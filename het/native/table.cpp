// A table's push (fixed, fixed in half precision, or dynamic) on the shard (het/ps/server/store/kernels.py),
// and the finiteness check of het/ps/protocol/limits.py.
#include "adagrad.h"
#include "ops.h"
#include "push_in_place.h"
#include "push_store.h"

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

// het.ps.protocol.limits.all_finite: whether every float of a contiguous float32 tensor is finite.
bool all_finite_op(torch::Tensor x) {
  check(x, torch::kFloat32, "x");
  return all_finite(x.data_ptr<float>(), x.numel());
}

// The square roots of an (m, D) block, by torch's kernel, as the reference's `sqrt_` takes them
// (the same bits: torch's vectorised sqrt is not always IEEE's correctly rounded one).
static torch::Tensor torch_sqrt(float* values, int64_t m, int64_t D) {
  return torch::from_blob(values, {m, D}, torch::kFloat32).sqrt();
}

namespace {

using het_push::adagrad_steps_push_in_place;
using het_push::ChunkStore;
using het_push::clock_failure;
using het_push::FlatStore;
using het_push::is_permutation;
using het_push::rooted_push_in_place;
using het_push::sgd_push_in_place;

// A push, all or nothing: SGD on float32 rows, Adagrad (of one step or several) and Adam in
// place (push_in_place.h); the rest with the new rows and optimizer state of the unique `rows`
// computed aside and checked first (every value finite, no clock past max_clock), and written
// only if they pass. `at` gives each gradient's place in `rows`, and `inverse` each count's. SGD
// applies the gradients in order, duplicates one after another; Adagrad and Adam take one
// gradient per row (duplicates summed by the caller). The floats follow het.ps.server.store.optim's tensor ops:
// torch's index_add_(alpha) is a fused multiply-add (its kernel: vec::fmadd), and square roots
// are torch's. Returns 0, or what failed: 1 rows, 2 + i state i, 100 a clock, 101 the meta's width.
template <typename Store>
int64_t push_rows(const Store& t, int S, const std::string& kind, torch::Tensor rows, torch::Tensor at,
                  torch::Tensor inverse, torch::Tensor grads, torch::Tensor counts, double lr, double eps,
                  double beta1, double beta2, double step_size, int64_t max_clock, torch::Tensor steps,
                  torch::Tensor sq) {
  check(rows, torch::kInt64, "rows");
  check(at, torch::kInt64, "at");
  check(inverse, torch::kInt64, "inverse");
  check(grads, torch::kFloat32, "grads");
  check(counts, torch::kInt64, "counts");
  const int64_t m = rows.numel(), n = at.numel(), D = t.D;
  TORCH_CHECK(grads.size(0) == n && (n == 0 || grads.size(1) == D), "grads: expected (", n, ", ", D, "), got ",
              grads.sizes());
  TORCH_CHECK(counts.numel() == inverse.numel(), "counts: expected ", inverse.numel(), ", got ", counts.numel());
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t* a = at.data_ptr<int64_t>();
  const int64_t* inv = inverse.data_ptr<int64_t>();
  const float* g = grads.data_ptr<float>();
  const int64_t* cn = counts.data_ptr<int64_t>();
  if constexpr (Store::kFloat) {
    if (kind == "sgd" && S == 0 && inverse.numel() == n) {
      return sgd_push_in_place(t, r, a, g, cn, n, D, float(-lr), max_clock);
    }
  }
  const bool several = kind == "adagrad_steps";  // Adagrad with pushes of several steps: their counts and squares
  if (several) {
    check(steps, torch::kInt64, "steps");
    check(sq, torch::kFloat32, "sq");
    TORCH_CHECK(steps.numel() == n && sq.dim() == 2 && sq.size(0) == n && (sq.size(1) == 1 || sq.size(1) == D),
                "steps, sq: expected (", n, ") and (", n, ", 1 or ", D, "), got ", steps.sizes(), " and ",
                sq.sizes());
  }
  const bool adam = kind == "adam" && S == 2;
  if ((((kind == "adagrad" || several) && S == 1) || adam) && n == m && is_permutation(a, n)) {
    if (several) {
      return adagrad_steps_push_in_place(t, r, a, g, inv, cn, inverse.numel(), steps.data_ptr<int64_t>(),
                                         sq.data_ptr<float>(), sq.size(1), n, D, float(-lr), float(eps), max_clock);
    }
    const het_push::Rooted opt{adam, float(1 - beta1), float(1 - beta2), float(adam ? -step_size : -lr), float(eps)};
    return rooted_push_in_place(t, r, a, g, inv, cn, inverse.numel(), n, D, opt, max_clock);
  }
  // the new values, aside: rows, then each state. The scratch is kept between calls (a fresh
  // megabyte-sized block a push costs page faults) and not zero-filled: every value is copied
  // in below, the rows prefetched ahead (random rows' latency is the cost of a push).
  thread_local std::vector<float> scratch;
  if (scratch.size() < size_t(m * D * (S + 1))) scratch.resize(size_t(m * D * (S + 1)));
  float* nw = scratch.data();
  float* ns = nw + m * D;
  for (int64_t j = 0; j < m; ++j) {
    if (j + kAhead < m) {
      prefetch(t.row_at(r[j + kAhead]), D * (Store::kFloat ? 4 : 2), true);
      t.prefetch_meta(r[j + kAhead]);
      for (int i = 0; i < S; ++i) prefetch(t.state(i, r[j + kAhead]), D * 4, true);
    }
    t.load_row(r[j], nw + j * D);
    for (int i = 0; i < S; ++i) {
      const float* sj = t.state(i, r[j]);
      std::copy(sj, sj + D, ns + (i * m + j) * D);
    }
  }
  const float nlr = float(-lr), feps = float(eps);
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
  } else if (several) {
    // het.ps.server.store.optim.Adagrad with a push of several steps (Pushed): row j's gradient sums steps[j]
    // steps whose squares sum to sq[j] (one float a row, shared out in proportion to the sum's
    // squares, or one a coordinate); the accumulator grows by them and the row moves by
    // lr * g * adagrad_factor. One gradient per row (at is the identity).
    const int64_t W = sq.size(1);
    const int64_t* u = steps.data_ptr<int64_t>();
    const float* sqp = sq.data_ptr<float>();
    thread_local std::vector<float> shares;
    if (shares.size() < size_t(D)) shares.resize(size_t(D));
    uint32_t bad = 0;  // checked below, with every row and sum
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = a[i];
      het_push::adagrad_steps_row(ns + j * D, nw + j * D, g + i * D, u[i], W == D ? sqp + i * D : sqp + i, W, D,
                                  feps, nlr, shares.data(), bad, bad);
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
  if (!all_finite(nw, m * D)) return 1;
  for (int i = 0; i < S; ++i) {
    if (!all_finite(ns + int64_t(i) * m * D, m * D)) return 2 + i;
  }
  std::vector<int64_t> nc(m);
  for (int64_t j = 0; j < m; ++j) nc[j] = t.clock(r[j]);
  for (int64_t i = 0; i < inverse.numel(); ++i) nc[inv[i]] += cn[i];
  const int64_t limit = t.limit(max_clock);
  int64_t why = 0;
  for (int64_t j = 0; j < m && why != 100; ++j) why = std::max(why, clock_failure(nc[j], max_clock, limit));
  if (why) return why;
  if constexpr (!Store::kFloat) {  // half rows: all rounded, and each checked to fit, before any is written
    thread_local std::vector<uint16_t> bits;
    if (bits.size() < size_t(m * D)) bits.resize(size_t(m * D));
    het_push::Unfit unfit;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t c = t.round(r[j], j, nc[j], nw + j * D, bits.data() + j * D);
      if (c >= 0) unfit.saw(t.key_of(r[j], j), nw + j * D, c);
    }
    if (unfit.any) return 102;
    for (int64_t j = 0; j < m; ++j) t.store_row(r[j], bits.data() + j * D);
  }
  for (int64_t j = 0; j < m; ++j) {  // all checked: write
    if constexpr (Store::kFloat) std::copy(nw + j * D, nw + (j + 1) * D, t.row(r[j]));
    for (int i = 0; i < S; ++i) std::copy(ns + (i * m + j) * D, ns + (i * m + j + 1) * D, t.state(i, r[j]));
    t.written(r[j], nc[j]);
  }
  return 0;
}

}  // namespace

// FixedRows.push for a fixed table (push_rows above).
int64_t table_push(const std::string& kind, torch::Tensor weight, std::vector<torch::Tensor> state,
                   torch::Tensor clocks, torch::Tensor touched, torch::Tensor rows, torch::Tensor at,
                   torch::Tensor inverse, torch::Tensor grads, torch::Tensor counts, double lr, double eps,
                   double beta1, double beta2, double step_size, int64_t max_clock, torch::Tensor steps,
                   torch::Tensor sq) {
  check(weight, torch::kFloat32, "weight");
  for (auto& t : state) check(t, torch::kFloat32, "optimizer state");
  check(clocks, torch::kInt64, "clocks");
  check(touched, torch::kBool, "touched");
  FlatStore t{weight.data_ptr<float>(), {}, clocks.data_ptr<int64_t>(), touched.data_ptr<bool>(), weight.size(1)};
  for (auto& s : state) t.st.push_back(s.data_ptr<float>());
  return push_rows(t, int(state.size()), kind, rows, at, inverse, grads, counts, lr, eps, beta1, beta2, step_size,
                   max_clock, steps, sq);
}

// FixedRows.push for a fixed table whose rows are stored in half precision (het/ps/protocol/halves.py):
// `weight` float16 or bfloat16, the rest as table_push; a row is rounded stochastically by its
// key (local row * shards + index) and new clock, or to nearest.
int64_t table_push_half(const std::string& kind, torch::Tensor weight, std::vector<torch::Tensor> state,
                        torch::Tensor clocks, torch::Tensor touched, bool stochastic, int64_t shards, int64_t index,
                        torch::Tensor rows, torch::Tensor at, torch::Tensor inverse, torch::Tensor grads,
                        torch::Tensor counts, double lr, double eps, double beta1, double beta2, double step_size,
                        int64_t max_clock, torch::Tensor steps, torch::Tensor sq) {
  const bool fp16 = weight.scalar_type() == torch::kHalf;
  check(weight, fp16 ? torch::kHalf : torch::kBFloat16, "weight");
  for (auto& t : state) check(t, torch::kFloat32, "optimizer state");
  check(clocks, torch::kInt64, "clocks");
  check(touched, torch::kBool, "touched");
  auto* w = static_cast<uint16_t*>(weight.data_ptr());
  std::vector<float*> st;
  for (auto& s : state) st.push_back(s.data_ptr<float>());
  auto run = [&](const auto& t) {
    return push_rows(t, int(state.size()), kind, rows, at, inverse, grads, counts, lr, eps, beta1, beta2,
                     step_size, max_clock, steps, sq);
  };
  if (fp16) {
    return run(het_push::HalfStore<c10::Half>{w, st, clocks.data_ptr<int64_t>(), touched.data_ptr<bool>(),
                                              weight.size(1), shards, index, stochastic});
  }
  return run(het_push::HalfStore<c10::BFloat16>{w, st, clocks.data_ptr<int64_t>(), touched.data_ptr<bool>(),
                                                weight.size(1), shards, index, stochastic});
}

// A dynamic table's chunks, their rows as T.
template <typename T>
static het_push::ChunkRows<T> chunk_rows(const het_push::ChunkMeta& where, const std::vector<void*>& w,
                                         const std::vector<float*>& st, int64_t D, int64_t S) {
  het_push::ChunkRows<T> rows{where, {}, st, D, S * D, S};
  for (void* p : w) rows.w.push_back(static_cast<T*>(p));
  return rows;
}

// DynamicRows.push for a dynamic table's stored slots (push_rows above), its storage in chunks
// (het.ps.server.store.chunks.Chunks, the first of 2^bits slots): `weight` (dim; float32, or float16 or
// bfloat16: then the j-th row written is rounded as table_push_half rounds it, by its key
// keys[j]), `state` (the states packed, S of dim each; none without state) and `meta` (clock,
// last step: int32, or int64 once widened) chunk by chunk. Each written slot's last step becomes
// at least `step`.
int64_t chunk_push(const std::string& kind, std::vector<torch::Tensor> weight, std::vector<torch::Tensor> state,
                   std::vector<torch::Tensor> meta, int64_t bits, bool fixed, int64_t S, int64_t step,
                   bool stochastic, torch::Tensor keys, torch::Tensor rows, torch::Tensor at, torch::Tensor inverse,
                   torch::Tensor grads, torch::Tensor counts, double lr, double eps, double beta1, double beta2,
                   double step_size, int64_t max_clock, torch::Tensor steps, torch::Tensor sq) {
  TORCH_CHECK(!weight.empty() && meta.size() == weight.size() && (state.empty() || state.size() == weight.size()),
              "chunks: expected as many weight, meta (and state) chunks, got ", weight.size(), ", ", meta.size(),
              ", ", state.size());
  const auto dtype = weight[0].scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kHalf || dtype == torch::kBFloat16,
              "weight chunk: expected float32, float16 or bfloat16, got ", dtype);
  const bool wide = meta[0].scalar_type() == torch::kInt64;
  const int64_t D = weight[0].size(1);
  het_push::ChunkMeta where{{}, wide, bits, fixed, step};
  std::vector<float*> st;
  std::vector<void*> w;
  int64_t capacity = 0;
  for (size_t c = 0; c < weight.size(); ++c) {
    check(weight[c], dtype, "weight chunk");
    check(meta[c], wide ? torch::kInt64 : torch::kInt32, "meta chunk");
    const int64_t size = weight[c].size(0);
    const int64_t expected = int64_t(1) << (bits + ((fixed || c == 0) ? 0 : int64_t(c) - 1));
    TORCH_CHECK(size == expected, "weight chunk ", c, ": expected ", expected, " slots (first 2^", bits, "), got ",
                size);
    TORCH_CHECK(meta[c].size(0) == size && meta[c].size(1) == 2, "meta chunk: expected (", size, ", 2), got ",
                meta[c].sizes());
    w.push_back(weight[c].data_ptr());
    where.meta.push_back(meta[c].data_ptr());
    if (!state.empty()) {
      check(state[c], torch::kFloat32, "state chunk");
      TORCH_CHECK(state[c].size(0) == size && state[c].size(1) == S * D, "state chunk: expected (", size, ", ",
                  S * D, "), got ", state[c].sizes());
      st.push_back(state[c].data_ptr<float>());
    }
    capacity += size;
  }
  TORCH_CHECK(state.empty() == (S == 0), "state: expected chunks for ", S, " states");
  check(rows, torch::kInt64, "rows");
  const int64_t* r = rows.data_ptr<int64_t>();
  for (int64_t j = 0; j < rows.numel(); ++j)
    TORCH_CHECK(r[j] >= 0 && r[j] < capacity, "slot ", r[j], " out of range [0, ", capacity, ")");
  auto run = [&](const auto& t) {
    return push_rows(t, int(S), kind, rows, at, inverse, grads, counts, lr, eps, beta1, beta2, step_size, max_clock,
                     steps, sq);
  };
  if (dtype == torch::kFloat32) return run(ChunkStore{chunk_rows<float>(where, w, st, D, S)});
  check(keys, torch::kInt64, "keys");
  TORCH_CHECK(keys.numel() == rows.numel(), "keys: expected ", rows.numel(), ", got ", keys.numel());
  const auto halves = chunk_rows<uint16_t>(where, w, st, D, S);
  if (dtype == torch::kHalf) {
    return run(het_push::ChunkHalfStore<c10::Half>{halves, keys.data_ptr<int64_t>(), stochastic});
  }
  return run(het_push::ChunkHalfStore<c10::BFloat16>{halves, keys.data_ptr<int64_t>(), stochastic});
}
