// The lookahead window's index of announced steps (het/cache/lookahead.py), bound to Python in
// module.cpp. Hidden like pybind11's own types, which its binding derives from.
#pragma once

#include "cache.h"

// het.cache.lookahead.Lookahead's index, kept up to date one step at a time instead of rebuilt:
// per key, the numbers of the announced steps that hold it, oldest first (a linked list in a
// pool), in an open-addressing table (linear probing, deletion by backward shift). Steps leave
// in announcement order (looked up, or dropped as too old), so a key's next use is its head.
class __attribute__((visibility("hidden"))) Window {
 public:
  Window() { rehash(1 << 12); }

  // the unique keys of the step numbered `number` (numbers grow)
  void announce(torch::Tensor keys, int64_t number) {
    check(keys, torch::kInt64, "keys");
    const int64_t* k = keys.data_ptr<int64_t>();
    const int64_t n = keys.numel();
    if (2 * (used_ + n) > table_.size()) rehash(2 * std::max<size_t>(table_.size(), size_t(2 * (used_ + n))));
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) __builtin_prefetch(&table_[home(k[i + kAhead])], 1, 3);
      Slot& s = table_[find_or_add(k[i])];
      const int32_t e = new_entry(number);
      if (s.head < 0) s.head = e;
      else pool_[s.tail].next = e;
      s.tail = e;
    }
  }

  // the oldest step, numbered `number`, with these keys, leaves the window
  void forget(torch::Tensor keys, int64_t number) {
    check(keys, torch::kInt64, "keys");
    const int64_t* k = keys.data_ptr<int64_t>();
    const int64_t n = keys.numel();
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) __builtin_prefetch(&table_[home(k[i + kAhead])], 1, 3);
      const int64_t at = find(k[i]);
      if (at < 0) continue;
      Slot& s = table_[at];
      if (pool_[s.head].step != number) continue;
      const int32_t e = s.head;
      s.head = pool_[e].next;
      pool_[e].next = free_;
      free_ = e;
      if (s.head < 0) erase(size_t(at));
    }
  }

  // each key's next announced step, kNever if none
  torch::Tensor next_use(torch::Tensor keys) {
    check(keys, torch::kInt64, "keys");
    auto out = torch::empty_like(keys);
    const int64_t* k = keys.data_ptr<int64_t>();
    int64_t* o = out.data_ptr<int64_t>();
    const int64_t n = keys.numel();
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) __builtin_prefetch(&table_[home(k[i + kAhead])], 0, 3);
      const int64_t at = find(k[i]);
      o[i] = at < 0 ? kNever : pool_[table_[at].head].step;
    }
    return out;
  }

  void clear() {
    for (auto& s : table_) s.head = -1;
    used_ = 0;
    pool_.clear();
    free_ = -1;
  }
  int64_t size() const { return int64_t(used_); }

 private:
  struct Slot {
    int64_t key;
    int32_t head = -1, tail = -1;  // head < 0: an empty slot
  };
  struct Entry {
    int64_t step;
    int32_t next;
  };
  std::vector<Slot> table_;
  size_t used_ = 0, shift_ = 52;
  std::vector<Entry> pool_;
  int32_t free_ = -1;

  size_t home(int64_t key) const { return size_t((uint64_t(key) * kHash) >> shift_); }
  int64_t find(int64_t key) const {
    const size_t mask = table_.size() - 1;
    for (size_t i = home(key);; i = (i + 1) & mask) {
      if (table_[i].head < 0) return -1;
      if (table_[i].key == key) return int64_t(i);
    }
  }
  size_t find_or_add(int64_t key) {
    const size_t mask = table_.size() - 1;
    for (size_t i = home(key);; i = (i + 1) & mask) {
      if (table_[i].head < 0) {
        table_[i].key = key;
        ++used_;
        return i;  // its head is set by the caller
      }
      if (table_[i].key == key) return i;
    }
  }
  void erase(size_t i) {  // backward shift: no tombstones
    const size_t mask = table_.size() - 1;
    for (size_t j = (i + 1) & mask; table_[j].head >= 0; j = (j + 1) & mask) {
      const size_t k = home(table_[j].key);
      const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
      if (stays) continue;
      table_[i] = table_[j];
      i = j;
    }
    table_[i].head = -1;
    --used_;
  }
  int32_t new_entry(int64_t step) {
    int32_t e = free_;
    if (e >= 0) {
      free_ = pool_[e].next;
      pool_[e] = {step, -1};
    } else {
      TORCH_CHECK(pool_.size() < size_t(std::numeric_limits<int32_t>::max()), "lookahead window: too many entries");
      e = int32_t(pool_.size());
      pool_.push_back({step, -1});
    }
    return e;
  }
  void rehash(size_t capacity) {  // a power of two
    size_t cap = 1;
    while (cap < capacity) cap <<= 1;
    std::vector<Slot> old(cap);
    std::swap(old, table_);
    shift_ = 64 - size_t(__builtin_ctzll(cap));
    used_ = 0;
    for (const auto& s : old) {
      if (s.head < 0) continue;
      Slot& t = table_[find_or_add(s.key)];
      t.head = s.head;
      t.tail = s.tail;
    }
  }
};
