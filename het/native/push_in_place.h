// The pushes that change a table's rows where they live (table.cpp's push_rows takes them where
// they apply): SGD on float32 rows, and Adagrad with one gradient a row. Each keeps the old
// values it overwrites and puts them back if the push fails, so a push is all or nothing without
// copying every row aside and back.
#pragma once
#include <cstring>
#include <vector>

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

// Adagrad in place, one gradient per row (`a` a permutation of the slots), in two passes over
// the gradients in order, the sums or rows ahead prefetched: the first adds each gradient's
// squares to its row's sums and keeps the new sums aside in slot order, whose square roots torch
// then takes in one call (its bits, as the general path's); the second moves each row by
// lr * g / (sqrt + eps), a row stored in half precision widened as it is read and rounded as it
// is written (by its key and new clock). Each row's and sum's old value, and its meta, are kept
// aside before they change; if any value is not finite, a clock would pass max_clock or what the
// store's meta holds, or a half row's value its dtype cannot hold (102, after the others),
// everything is put back, last change first. The same floats and failures as the general path,
// without copying every row and sum aside and back.
template <typename Store>
int64_t adagrad_push_in_place(const Store& t, const int64_t* r, const int64_t* a, const float* g,
                              const int64_t* inv, const int64_t* cn, int64_t counted, int64_t n, int64_t D,
                              float nlr, float feps, int64_t max_clock) {
  constexpr uint32_t kExponent = 0x7f800000u;
  thread_local std::vector<float> undo, roots;  // undo: float32 rows' (n, D) old values, then (n, D) sums
  thread_local std::vector<typename Store::Undo> undo_meta;
  thread_local std::vector<int64_t> nc;
  const int64_t kept = Store::kFloat ? n * D : 0;  // a half row's old bits are kept in old_bits
  if (undo.size() < size_t(kept + n * D)) undo.resize(size_t(kept + n * D));
  if (roots.size() < size_t(n * D)) roots.resize(size_t(n * D));
  if (undo_meta.size() < size_t(n)) undo_meta.resize(size_t(n));
  if (nc.size() < size_t(n)) nc.resize(size_t(n));
  float* old_rows = undo.data();
  float* old_sums = old_rows + kept;
  uint32_t bad_sum = 0, bad_row = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      prefetch(t.state(0, r[a[i + kAhead]]), D * 4, true);
      t.prefetch_meta(r[a[i + kAhead]]);
    }
    const int64_t j = a[i], row = r[j];
    float* acc = t.state(0, row);
    float* root = roots.data() + j * D;
    const float* gi = g + i * D;
    std::copy(acc, acc + D, old_sums + i * D);
    for (int64_t d = 0; d < D; ++d) {
      const float sq = gi[d] * gi[d];
      const float after = acc[d] + sq;
      uint32_t bits;
      std::memcpy(&bits, &after, 4);
      bad_sum |= uint32_t((bits & kExponent) == kExponent);
      acc[d] = after;
      root[d] = after;
    }
    nc[size_t(j)] = t.clock(row);
  }
  for (int64_t k = 0; k < counted; ++k) nc[size_t(inv[k])] += cn[k];
  const int64_t limit = t.limit(max_clock);
  int64_t why = 0;
  for (int64_t j = 0; j < n && why != 100; ++j) why = std::max(why, clock_failure(nc[size_t(j)], max_clock, limit));
  torch::from_blob(roots.data(), {n, D}, torch::kFloat32).sqrt_();  // torch's own kernel, as the reference's
  thread_local std::vector<uint16_t> old_bits;  // half rows: their old bits
  thread_local std::vector<float> wide;         // ... and one row widened, then rounded into `rounded`
  thread_local std::vector<uint16_t> rounded;
  if constexpr (!Store::kFloat) {
    if (old_bits.size() < size_t(n * D)) old_bits.resize(size_t(n * D));
    if (wide.size() < size_t(D)) wide.resize(size_t(D)), rounded.resize(size_t(D));
  }
  int64_t unfit = 0, unfit_slot = n;  // half rows: a value the dtype cannot hold (102, after the failures above)
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch(t.row_at(r[a[i + kAhead]]), D * (Store::kFloat ? 4 : 2), true);
    const int64_t j = a[i], row = r[j];
    const float* rj = roots.data() + j * D;
    const float* gi = g + i * D;
    float* wi;
    if constexpr (Store::kFloat) {
      wi = t.row(row);
      std::copy(wi, wi + D, old_rows + i * D);
    } else {
      wi = wide.data();
      t.load_row(row, wi);
      t.copy_bits(row, old_bits.data() + i * D);
    }
    for (int64_t d = 0; d < D; ++d) {
      const float q = gi[d] / (rj[d] + feps);
      const float after = std::fma(q, nlr, wi[d]);
      uint32_t bits;
      std::memcpy(&bits, &after, 4);
      bad_row |= uint32_t((bits & kExponent) == kExponent);
      wi[d] = after;
    }
    if constexpr (!Store::kFloat) {  // rounded by the row's key and new clock, as the general path
      const int64_t c = t.round(row, j, nc[size_t(j)], wi, rounded.data());
      if (c < 0) {
        t.store_row(row, rounded.data());
      } else if (j < unfit_slot) {  // named as the reference names it: the first in slot order
        unfit = 102, unfit_slot = j;
        het_halves::refused = wi[c];
      }
    }
    undo_meta[size_t(i)] = t.undo(row);
    t.written(row, nc[size_t(j)]);
  }
  const int64_t failed = bad_row ? 1 : bad_sum ? 2 : why ? why : unfit;
  if (failed) {
    for (int64_t i = n - 1; i >= 0; --i) {  // put back, last change first
      const int64_t row = r[a[i]];
      if constexpr (Store::kFloat) std::copy(old_rows + i * D, old_rows + (i + 1) * D, t.row(row));
      else t.store_row(row, old_bits.data() + i * D);
      std::copy(old_sums + i * D, old_sums + (i + 1) * D, t.state(0, row));
      t.restore(row, undo_meta[size_t(i)]);
    }
  }
  return failed;
}

}  // namespace het_push
