// Where a push's rows live (table.cpp's push_rows reads and writes rows only through these):
// a fixed table's tensors, or a dynamic table's chunks (het/ps/server/store/chunks.py).
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "halves.h"

namespace het_push {

// Where a push's rows live. A fixed table: one weight tensor, one tensor a state, a clock and a
// mark a row. A dynamic table (het/ps/server/store/chunks.py): slots in chunks, a slot's optimizer
// state packed after one another in one record of another chunk list, and its meta (clock, last
// step) two integers of a third, 32-bit until het widens them to 64. Either in float32 or in
// half precision. The push below reads and writes rows only through these, so all take the
// same floats.
struct FlatStore {
  static constexpr bool kFloat = true;  // rows are float32: SGD pushes in place (Adagrad and Adam do on any rows)
  float* w;
  std::vector<float*> st;
  int64_t* ck;
  bool* tc;
  int64_t D;
  float* row(int64_t r) const { return w + r * D; }
  const void* row_at(int64_t r) const { return w + r * D; }
  void load_row(int64_t r, float* dst) const { std::copy(w + r * D, w + (r + 1) * D, dst); }
  float* state(int i, int64_t r) const { return st[size_t(i)] + r * D; }
  int64_t clock(int64_t r) const { return ck[r]; }
  int64_t limit(int64_t max_clock) const { return max_clock; }
  struct Undo {
    int64_t clock;
    bool mark;
  };
  Undo undo(int64_t r) const { return {ck[r], tc[r]}; }
  void restore(int64_t r, Undo u) const { ck[r] = u.clock, tc[r] = u.mark; }
  void prefetch_meta(int64_t r) const { __builtin_prefetch(ck + r, 1, 3), __builtin_prefetch(tc + r, 1, 3); }
  void written(int64_t r, int64_t clock) const { ck[r] = clock, tc[r] = true; }
};

// A dynamic table's chunks (het/ps/server/store/chunks.py): where a slot lives, and its meta.
struct ChunkMeta {
  std::vector<void*> meta;
  bool wide;             // meta in int64 (else int32)
  int64_t bits;          // log2 of the first chunk's slots
  bool fixed;            // every chunk that size (else each as large as all before it)
  int64_t step;
  // chunk c holds slots [start(c), start(c) + size(c))
  std::pair<size_t, int64_t> locate(int64_t r) const {
    const uint64_t q = uint64_t(r) >> bits;
    if (fixed) return {size_t(q), r - int64_t(q << bits)};
    if (q == 0) return {0, r};
    const int c = 64 - __builtin_clzll(q);  // q in [2^(c-1), 2^c): chunk c starts at first << (c - 1)
    return {size_t(c), r - (int64_t(1) << (bits + c - 1))};
  }
  int64_t get(int64_t r, int col) const {
    auto [c, o] = locate(r);
    return wide ? static_cast<int64_t*>(meta[c])[o * 2 + col] : static_cast<int32_t*>(meta[c])[o * 2 + col];
  }
  void set(int64_t r, int col, int64_t v) const {
    auto [c, o] = locate(r);
    if (wide) static_cast<int64_t*>(meta[c])[o * 2 + col] = v;
    else static_cast<int32_t*>(meta[c])[o * 2 + col] = int32_t(v);
  }
  int64_t clock(int64_t r) const { return get(r, 0); }
  int64_t limit(int64_t max_clock) const {
    return wide ? max_clock : std::min<int64_t>(max_clock, std::numeric_limits<int32_t>::max());
  }
  struct Undo {
    int64_t clock, last;
  };
  Undo undo(int64_t r) const { return {get(r, 0), get(r, 1)}; }
  void restore(int64_t r, Undo u) const { set(r, 0, u.clock), set(r, 1, u.last); }
  void prefetch_meta(int64_t r) const {
    auto [c, o] = locate(r);
    __builtin_prefetch(static_cast<char*>(meta[c]) + o * (wide ? 16 : 8), 1, 3);
  }
  void written(int64_t r, int64_t clock) const {  // the last step that updated it: the largest named
    set(r, 0, clock);
    set(r, 1, std::max(get(r, 1), step));
  }
};

// A dynamic table's rows (T: float, or a half dtype's bits) and a slot's S states of D floats
// packed in a record of SW, chunk by chunk.
template <typename T>
struct ChunkRows : ChunkMeta {
  std::vector<T*> w;
  std::vector<float*> st;
  int64_t D, SW, S;
  T* at(int64_t r) const {
    auto [c, o] = locate(r);
    return w[c] + o * D;
  }
  const void* row_at(int64_t r) const { return at(r); }
  float* state(int i, int64_t r) const {
    auto [c, o] = locate(r);
    return st[c] + o * SW + i * D;
  }
};

// A dynamic table's float32 rows.
struct ChunkStore : ChunkRows<float> {
  static constexpr bool kFloat = true;
  float* row(int64_t r) const { return at(r); }
  void load_row(int64_t r, float* dst) const {
    const float* src = at(r);
    std::copy(src, src + D, dst);
  }
};

// A dynamic table whose rows are stored in half precision (H as HalfStore's), each rounded as
// HalfStore rounds it, by its key: the push's j-th row (slot rows[j]) is keys[j].
template <typename H>
struct ChunkHalfStore : ChunkRows<uint16_t> {
  static constexpr bool kFloat = false;
  const int64_t* keys;
  bool stochastic;
  void load_row(int64_t r, float* dst) const { het_halves::widen_row<H>(at(r), dst, D); }
  int64_t key_of(int64_t, int64_t j) const { return keys[j]; }
  int64_t round(int64_t r, int64_t j, int64_t clock, const float* values, uint16_t* out) const {
    const int64_t salt = stochastic ? het_halves::salt_of(key_of(r, j), clock) : 0;
    return het_halves::round_row<H>(values, out, salt, D, stochastic);
  }
  void store_row(int64_t r, const uint16_t* bits) const { std::copy(bits, bits + D, at(r)); }
  void copy_bits(int64_t r, uint16_t* dst) const {
    const uint16_t* src = at(r);
    std::copy(src, src + D, dst);
  }
};

// A fixed table whose rows are stored in half precision (H: c10::Half or c10::BFloat16; their
// bits here): a push reads each row widened to float32, computes as for a float32 table, and
// writes it rounded (het/ps/protocol/halves.py: stochastically by the row's key and new clock, or to
// nearest). Key of local row r: r * shards + index.
template <typename H>
struct HalfStore {
  static constexpr bool kFloat = false;
  uint16_t* w;
  std::vector<float*> st;
  int64_t* ck;
  bool* tc;
  int64_t D, shards, index;
  bool stochastic;
  const void* row_at(int64_t r) const { return w + r * D; }
  void load_row(int64_t r, float* dst) const {
    het_halves::widen_row<H>(w + r * D, dst, D);
  }
  int64_t key_of(int64_t r, int64_t) const { return r * shards + index; }
  // row r (the push's j-th) rounded from `values` into out (D); -1, or a column its dtype cannot hold
  int64_t round(int64_t r, int64_t j, int64_t clock, const float* values, uint16_t* out) const {
    const int64_t salt = stochastic ? het_halves::salt_of(key_of(r, j), clock) : 0;
    return het_halves::round_row<H>(values, out, salt, D, stochastic);
  }
  void store_row(int64_t r, const uint16_t* bits) const { std::copy(bits, bits + D, w + r * D); }
  void copy_bits(int64_t r, uint16_t* dst) const { std::copy(w + r * D, w + (r + 1) * D, dst); }
  float* state(int i, int64_t r) const { return st[size_t(i)] + r * D; }
  int64_t clock(int64_t r) const { return ck[r]; }
  int64_t limit(int64_t max_clock) const { return max_clock; }
  using Undo = FlatStore::Undo;
  Undo undo(int64_t r) const { return {ck[r], tc[r]}; }
  void restore(int64_t r, Undo u) const { ck[r] = u.clock, tc[r] = u.mark; }
  void prefetch_meta(int64_t r) const { __builtin_prefetch(ck + r, 1, 3), __builtin_prefetch(tc + r, 1, 3); }
  void written(int64_t r, int64_t clock) const { ck[r] = clock, tc[r] = true; }
};

// A push's failure, as table_push returns it; 101: a clock would pass what the store's meta
// holds (32 bits), not max_clock: the caller widens it and pushes again; 102: a row value its
// half-precision dtype cannot hold.
inline int64_t clock_failure(int64_t clock, int64_t max_clock, int64_t limit) {
  return clock > max_clock ? 100 : clock > limit ? 101 : 0;
}

}  // namespace het_push
