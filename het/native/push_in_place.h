// The pushes that change a table's rows where they live (table.cpp's push_rows takes them where
// they apply): SGD on float32 rows; Adagrad, of one step or several, and Adam, with one gradient
// a row, on any rows. Each keeps the old values it overwrites and puts them back if the push
// fails, so a push is all or nothing without copying every row aside and back.
#pragma once
#include <cstring>
#include <vector>

#include "adagrad.h"
#include "common.h"
#include "push_store.h"

namespace het_push {

// SGD in place, in one pass over the gradients in order (duplicates one after another): each
// row's old value and meta are kept aside before it changes, the new value checked as it is
// written (rows prefetched ahead); if any value is not finite or a clock would pass max_clock,
// every row is put back, last change first. The same floats as the general path, without
// reading the rows twice.
template <typename Store>
int64_t sgd_push_in_place(const Store& t, const int64_t* r, const int64_t* a, const float* g, const int64_t* cn,
                          int64_t n, int64_t D, float nlr, int64_t max_clock) {
  constexpr uint32_t kExponent = 0x7f800000u;
  thread_local std::vector<float> undo;
  thread_local std::vector<typename Store::Undo> undo_meta;
  if (undo.size() < size_t(n * D)) undo.resize(size_t(n * D));
  if (undo_meta.size() < size_t(n)) undo_meta.resize(size_t(n));
  const int64_t limit = t.limit(max_clock);
  int64_t failed = 0, done = 0, clock_failed = 0;
  for (; done < n && !failed; ++done) {
    const int64_t i = done;
    if (i + kAhead < n) {
      prefetch(t.row(r[a[i + kAhead]]), D * 4, true);
      t.prefetch_meta(r[a[i + kAhead]]);
    }
    const int64_t row = r[a[i]];
    float* wi = t.row(row);
    const float* gi = g + i * D;
    std::copy(wi, wi + D, undo.data() + i * D);
    undo_meta[size_t(i)] = t.undo(row);
    uint32_t bad = 0;
    for (int64_t d = 0; d < D; ++d) {
      const float step = gi[d] * nlr;
      const float after = wi[d] + step;
      uint32_t bits;
      std::memcpy(&bits, &after, 4);
      bad |= uint32_t((bits & kExponent) == kExponent);
      wi[d] = after;
    }
    const int64_t clock = t.clock(row) + cn[i];
    const int64_t why = clock_failure(clock, max_clock, limit);
    if (!why) t.written(row, clock);
    if (bad) failed = 1;  // a row's failure stops the pass, and names the push's (as the general path)
    else clock_failed = std::max(clock_failed, why);
  }
  if (!failed && clock_failed) failed = clock_failed;
  if (failed) {
    for (int64_t i = done - 1; i >= 0; --i) {  // put back, last change first: duplicates end at their first value
      const int64_t row = r[a[i]];
      std::copy(undo.data() + i * D, undo.data() + (i + 1) * D, t.row(row));
      t.restore(row, undo_meta[size_t(i)]);
    }
  }
  return failed;
}

// Whether a[0 .. n) holds each of 0 .. n - 1 once.
inline bool is_permutation(const int64_t* a, int64_t n) {
  thread_local std::vector<uint8_t> seen;
  seen.assign(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (a[i] < 0 || a[i] >= n || seen[size_t(a[i])]) return false;
    seen[size_t(a[i])] = 1;
  }
  return true;
}

// What an in-place push with one gradient a row keeps of the i-th row it changes, to put it
// back if the push fails: the row's old values (float32) or bits (half), its S states', and its
// meta. The buffers are the thread's, kept between pushes.
template <typename Store>
class Kept {
 public:
  Kept(const Store& t, int64_t n, int64_t D, int S) : t_(t), D_(D), S_(S) {
    thread_local std::vector<float> rows, states;
    thread_local std::vector<uint16_t> bits;
    thread_local std::vector<typename Store::Undo> meta;
    grow(states, n * D * S);
    if constexpr (Store::kFloat) grow(rows, n * D);
    else grow(bits, n * D);
    grow(meta, n);
    rows_ = rows.data();
    states_ = states.data();
    bits_ = bits.data();
    meta_ = meta.data();
  }
  void states(int64_t i, int64_t row) const {
    for (int k = 0; k < S_; ++k) {
      const float* s = t_.state(k, row);
      std::copy(s, s + D_, states_ + (i * S_ + k) * D_);
    }
  }
  void row(int64_t i, int64_t row) const {
    if constexpr (Store::kFloat) {
      const float* w = t_.row(row);
      std::copy(w, w + D_, rows_ + i * D_);
    } else {
      t_.copy_bits(row, bits_ + i * D_);
    }
    meta_[i] = t_.undo(row);
  }
  // every row 0 .. n - 1 kept put back, last change first
  void put_back(const int64_t* r, const int64_t* a, int64_t n) const {
    for (int64_t i = n - 1; i >= 0; --i) {
      const int64_t row = r[a[i]];
      if constexpr (Store::kFloat) std::copy(rows_ + i * D_, rows_ + (i + 1) * D_, t_.row(row));
      else t_.store_row(row, bits_ + i * D_);
      for (int k = 0; k < S_; ++k) {
        const float* s = states_ + (i * S_ + k) * D_;
        std::copy(s, s + D_, t_.state(k, row));
      }
      t_.restore(row, meta_[i]);
    }
  }

 private:
  template <typename T>
  static void grow(std::vector<T>& v, int64_t size) {
    if (v.size() < size_t(size)) v.resize(size_t(size));
  }
  const Store& t_;
  int64_t D_;
  int S_;
  float *rows_, *states_;
  uint16_t* bits_;
  typename Store::Undo* meta_;
};

// Each row's clock after the push, in slot order (nc, n of them, holding the clocks before):
// the counts of `inv` (counted of them) added; returns the worst clock failure (clock_failure),
// 0 if none.
template <typename Store>
int64_t new_clocks(const Store& t, const int64_t* inv, const int64_t* cn, int64_t counted, int64_t n,
                   int64_t max_clock, int64_t* nc) {
  for (int64_t k = 0; k < counted; ++k) nc[inv[k]] += cn[k];
  const int64_t limit = t.limit(max_clock);
  int64_t why = 0;
  for (int64_t j = 0; j < n && why != 100; ++j) why = std::max(why, clock_failure(nc[j], max_clock, limit));
  return why;
}

// A half row (Store not float32): its values widened into `wide`, for the push to move; else
// the row itself.
template <typename Store>
float* row_to_move(const Store& t, int64_t row, float* wide) {
  if constexpr (Store::kFloat) {
    (void)wide;
    return t.row(row);
  } else {
    t.load_row(row, wide);
    return wide;
  }
}

// The first value a half push could not round into its dtype, as the reference names it: that
// of the row with the least key (halves.round_rows over the rows in key order).
struct Unfit {
  bool any = false;
  int64_t key = 0;
  // the row `key`'s column c of `values` does not fit: kept (het_halves::refused) if first
  void saw(int64_t row_key, const float* values, int64_t c) {
    if (any && key <= row_key) return;
    any = true;
    key = row_key;
    het_halves::refused = values[c];
  }
};

// A half row moved (in `wide`) rounded by its key and new clock and stored; false, storing
// nothing, if a value does not fit its dtype (seen by `unfit`).
template <typename Store>
bool store_moved(const Store& t, int64_t row, int64_t j, int64_t clock, const float* wide, uint16_t* rounded,
                 Unfit& unfit) {
  if constexpr (Store::kFloat) {
    return true;
  } else {
    const int64_t c = t.round(row, j, clock, wide, rounded);
    if (c < 0) {
      t.store_row(row, rounded);
      return true;
    }
    unfit.saw(t.key_of(row, j), wide, c);
    return false;
  }
}

inline bool not_finite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return (bits & 0x7f800000u) == 0x7f800000u;
}

// What a rooted push (Adagrad's, Adam's) takes besides the gradients: Adam's moment rates
// (1 - beta1, 1 - beta2), and the step: each row moves by scale * x / (sqrt(s) + eps), x the
// gradient (Adagrad: scale -lr, s its sums) or the first moment (Adam: -step_size, s the second).
struct Rooted {
  bool adam;
  float c1, c2, scale, eps;
};

// Adagrad or Adam in place, one gradient per row (`a` a permutation of the slots), in two passes
// over the gradients in order, the states or rows ahead prefetched: the first moves each row's
// states (Adagrad's sums by the gradient's squares; Adam's moments, as the general path) and
// keeps the new sums (second moments) aside in slot order, whose square roots torch then takes
// in one call (its bits, as the general path's); the second moves each row (Rooted), a row
// stored in half precision widened as it is read and rounded as it is written (by its key and
// new clock). Each row's and state's old value, and its meta, are kept aside before they change
// (Kept); if any value is not finite, a clock would pass max_clock or what the store's meta
// holds, or a half row's value its dtype cannot hold (102, after the others), everything is put
// back, last change first. The same floats and failures as the general path (1 a row, 2 + k
// state k), without copying every row and state aside and back.
template <typename Store>
int64_t rooted_push_in_place(const Store& t, const int64_t* r, const int64_t* a, const float* g, const int64_t* inv,
                             const int64_t* cn, int64_t counted, int64_t n, int64_t D, const Rooted& opt,
                             int64_t max_clock) {
  const int S = opt.adam ? 2 : 1;
  const Kept<Store> kept(t, n, D, S);
  thread_local std::vector<float> roots, wide;  // wide: a half row widened
  thread_local std::vector<int64_t> nc;
  thread_local std::vector<uint16_t> rounded;
  if (roots.size() < size_t(n * D)) roots.resize(size_t(n * D));
  if (nc.size() < size_t(n)) nc.resize(size_t(n));
  if (wide.size() < size_t(D)) wide.resize(size_t(D)), rounded.resize(size_t(D));
  uint32_t bad_state[2] = {0, 0}, bad_row = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      for (int k = 0; k < S; ++k) prefetch(t.state(k, r[a[i + kAhead]]), D * 4, true);
      t.prefetch_meta(r[a[i + kAhead]]);
    }
    const int64_t j = a[i], row = r[j];
    float* root = roots.data() + j * D;
    const float* gi = g + i * D;
    kept.states(i, row);
    if (opt.adam) {
      float* mj = t.state(0, row);
      float* vj = t.state(1, row);
      for (int64_t d = 0; d < D; ++d) {
        const float dm = (gi[d] - mj[d]) * opt.c1;
        mj[d] += dm;
        const float sq = gi[d] * gi[d];
        const float dv = (sq - vj[d]) * opt.c2;
        vj[d] += dv;
        bad_state[0] |= uint32_t(not_finite(mj[d]));
        bad_state[1] |= uint32_t(not_finite(vj[d]));
        root[d] = vj[d];
      }
    } else {
      float* acc = t.state(0, row);
      for (int64_t d = 0; d < D; ++d) {
        const float sq = gi[d] * gi[d];
        acc[d] += sq;
        bad_state[0] |= uint32_t(not_finite(acc[d]));
        root[d] = acc[d];
      }
    }
    nc[size_t(j)] = t.clock(row);
  }
  const int64_t why = new_clocks(t, inv, cn, counted, n, max_clock, nc.data());
  torch::from_blob(roots.data(), {n, D}, torch::kFloat32).sqrt_();  // torch's own kernel, as the reference's
  Unfit unfit;  // half rows: a value its dtype cannot hold (102)
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      prefetch(t.row_at(r[a[i + kAhead]]), D * (Store::kFloat ? 4 : 2), true);
      if (opt.adam) prefetch(t.state(0, r[a[i + kAhead]]), D * 4, false);
    }
    const int64_t j = a[i], row = r[j];
    const float* rj = roots.data() + j * D;
    const float* x = opt.adam ? t.state(0, row) : g + i * D;  // the first moment, moved; or the gradient
    kept.row(i, row);
    float* wi = row_to_move(t, row, wide.data());
    for (int64_t d = 0; d < D; ++d) {
      const float q = x[d] / (rj[d] + opt.eps);
      wi[d] = std::fma(q, opt.scale, wi[d]);
      bad_row |= uint32_t(not_finite(wi[d]));
    }
    store_moved(t, row, j, nc[size_t(j)], wi, rounded.data(), unfit);
    t.written(row, nc[size_t(j)]);
  }
  const int64_t failed = bad_row ? 1 : bad_state[0] ? 2 : bad_state[1] ? 3 : why ? why : unfit.any ? 102 : 0;
  if (failed) kept.put_back(r, a, n);
  return failed;
}

// Adagrad's move of one row (w, its sums acc) by a gradient g that sums u steps whose squares
// sum to sq (W = 1: one float; W = D: one a coordinate): each coordinate's sum grows by its share
// of them (W = 1: in proportion to g's squares) and the row moves by lr * g * adagrad_factor
// (Follow::factor's arithmetic, its branches out of the loops: they vectorise). bad_s, bad_w:
// set where a sum or a row value is not finite. `shares`: D floats of scratch.
inline void adagrad_steps_row(float* acc, float* w, const float* g, int64_t u, const float* sq, int64_t W, int64_t D,
                              float eps, float nlr, float* shares, uint32_t& bad_s, uint32_t& bad_w) {
  if (u > 1) {
    float* q = shares;
    if (W == D) {
      std::copy(sq, sq + D, q);
    } else if (const float mean = sum_squares(g, D) / float(D); mean > 0) {
      const float scale = sq[0] / mean;
      for (int64_t d = 0; d < D; ++d) q[d] = g[d] * g[d] * scale;
    } else {
      std::fill(q, q + D, sq[0]);
    }
    const float twice_u = float(2 * u), two_eps = 2.0f * eps;
    for (int64_t d = 0; d < D; ++d) {
      const float h = q[d] / twice_u;
      const float f = 2.0f / (std::sqrt(acc[d] + q[d] + h) + std::sqrt(acc[d] + h) + two_eps);
      acc[d] += q[d];
      bad_s |= uint32_t(not_finite(acc[d]));
      w[d] = std::fma(g[d] * f, nlr, w[d]);
      bad_w |= uint32_t(not_finite(w[d]));
    }
  } else {
    for (int64_t d = 0; d < D; ++d) {
      const float q = g[d] * g[d];
      const float f = 1.0f / (std::sqrt(acc[d] + q) + eps);
      acc[d] += q;
      bad_s |= uint32_t(not_finite(acc[d]));
      w[d] = std::fma(g[d] * f, nlr, w[d]);
      bad_w |= uint32_t(not_finite(w[d]));
    }
  }
}

// Adagrad with a push of several steps in place (het.ps.server.store.optim.Adagrad with Pushed; the
// general path's "adagrad_steps"), one gradient per row (`a` a permutation of the slots), in
// one pass over the gradients in order, each row and its sums ahead prefetched: row j's
// gradient sums u[i] steps whose squares sum to sq[i] (one float a row, W = 1, shared out in
// proportion to the gradient's squares; or one a coordinate, W = D); each coordinate's sum grows
// by its share and the row moves by lr * g * adagrad_factor (adagrad_steps_row). Kept and put
// back as rooted_push_in_place, with the same failures; the same floats as the general path.
template <typename Store>
int64_t adagrad_steps_push_in_place(const Store& t, const int64_t* r, const int64_t* a, const float* g,
                                    const int64_t* inv, const int64_t* cn, int64_t counted, const int64_t* u,
                                    const float* sqp, int64_t W, int64_t n, int64_t D, float nlr, float feps,
                                    int64_t max_clock) {
  const Kept<Store> kept(t, n, D, 1);
  thread_local std::vector<float> wide, shares;  // a half row widened; a row's squares, shared out
  thread_local std::vector<int64_t> nc;
  thread_local std::vector<uint16_t> rounded;
  if (nc.size() < size_t(n)) nc.resize(size_t(n));
  if (wide.size() < size_t(D)) wide.resize(size_t(D)), rounded.resize(size_t(D)), shares.resize(size_t(D));
  for (int64_t j = 0; j < n; ++j) {
    if (j + kAhead < n) t.prefetch_meta(r[j + kAhead]);
    nc[size_t(j)] = t.clock(r[j]);
  }
  const int64_t why = new_clocks(t, inv, cn, counted, n, max_clock, nc.data());
  bool bad_sum = false, bad_row = false;
  Unfit unfit;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const int64_t ahead = r[a[i + kAhead]];
      prefetch(t.row_at(ahead), D * (Store::kFloat ? 4 : 2), true);
      prefetch(t.state(0, ahead), D * 4, true);
      t.prefetch_meta(ahead);
    }
    const int64_t j = a[i], row = r[j];
    float* acc = t.state(0, row);
    const float* gi = g + i * D;
    kept.states(i, row);
    kept.row(i, row);
    float* wi = row_to_move(t, row, wide.data());
    uint32_t bad_s = 0, bad_w = 0;
    adagrad_steps_row(acc, wi, gi, u[i], W == D ? sqp + i * D : sqp + i, W, D, feps, nlr, shares.data(), bad_s,
                      bad_w);
    bad_sum |= bad_s != 0;
    bad_row |= bad_w != 0;
    store_moved(t, row, j, nc[size_t(j)], wi, rounded.data(), unfit);
    t.written(row, nc[size_t(j)]);
  }
  const int64_t failed = bad_row ? 1 : bad_sum ? 2 : why ? why : unfit.any ? 102 : 0;
  if (failed) kept.put_back(r, a, n);
  return failed;
}

}  // namespace het_push
