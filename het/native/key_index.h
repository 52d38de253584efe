// A dynamic table's key index on a shard (het/ps/server/store/index.py's native form), bound to Python
// in module.cpp: int64 key -> storage slot, and each slot's key.
//
// Memory is the point: a shard of a 10^9-row table holds hundreds of millions of keys. Each key
// costs 8 bytes once, in a slot -> key array (the storage slot's key, which eviction and saves
// need anyway); the hash table holds no key, only a 4-byte slot and a 1-byte control a bucket
// (empty, deleted, or full with 7 bits of the key's hash, as Abseil's SwissTable does). A probe
// scans control bytes, which are contiguous, and reads a key only where its 7 bits match (1 in
// 128 of the other full buckets). Linear probing, any capacity (a hash's bucket is its high bits
// times the capacity, Lemire's reduction), filled to 7/8 and rebuilt at about 0.65 of the new
// capacity: 5 / load bytes a key, 5.7 to 7.7 (a power-of-two table swings from 5.7 to 11.4).
// Deleted buckets are tombstones until the next rebuild, which counts them as load.
//
// A lookup runs in three stages a few keys apart, so that the random reads of a batch overlap:
// hash and prefetch the control byte and slot; find the first matching bucket and prefetch its
// key; compare. Hidden like pybind11's own types, which its binding derives from.
#pragma once

#include <memory>
#include <tuple>

#include "common.h"

class __attribute__((visibility("hidden"))) KeyIndex {
 public:
  KeyIndex() { rebuild(kMinBuckets); }

  // the slot of each key, -1 where none is held
  torch::Tensor lookup(torch::Tensor keys) const {
    check(keys, torch::kInt64, "keys");
    const int64_t n = keys.numel();
    auto out = torch::empty({n}, torch::kInt64);
    const int64_t* k = keys.data_ptr<int64_t>();
    int64_t* o = out.data_ptr<int64_t>();
    constexpr int64_t D = 8;  // keys between one stage and the next
    std::vector<uint64_t> h(size_t(std::min<int64_t>(n, 3 * D)));
    std::vector<size_t> at(h.size());
    const size_t ring = h.size();
    for (int64_t i = 0; i < n + 2 * D; ++i) {
      if (i < n) {  // stage 1: the hash, its control byte and slot on their way
        const size_t r = size_t(i) % ring;
        h[r] = mix(k[i]);
        at[r] = home(h[r]);
        __builtin_prefetch(ctrl_.get() + at[r], 0, 3);
        __builtin_prefetch(slot_.get() + at[r], 0, 3);
      }
      const int64_t j = i - D;
      if (j >= 0 && j < n) {  // stage 2: the first bucket that may hold it, its key on its way
        const size_t r = size_t(j) % ring;
        const uint8_t tag = tag_of(h[r]);
        size_t b = at[r];
        while (ctrl_[b] != kEmpty && ctrl_[b] != tag) b = next(b);
        at[r] = b;
        if (ctrl_[b] == tag) __builtin_prefetch(key_ptr(slot_[b]), 0, 3);
      }
      const int64_t m = i - 2 * D;
      if (m >= 0 && m < n) {  // stage 3: that bucket's key, and on along the probe if it differs
        const size_t r = size_t(m) % ring;
        const int64_t b = find_from(k[m], tag_of(h[r]), at[r]);
        o[m] = b < 0 ? -1 : int64_t(slot_[size_t(b)]);
      }
    }
    return out;
  }

  // add `keys` (distinct, none held) at `slots`
  void insert(torch::Tensor keys, torch::Tensor slots) {
    check(keys, torch::kInt64, "keys");
    check(slots, torch::kInt64, "slots");
    const int64_t n = keys.numel();
    TORCH_CHECK(slots.numel() == n, "slots: expected one per key (", n, "), got ", slots.numel());
    const int64_t* k = keys.data_ptr<int64_t>();
    const int64_t* s = slots.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i)
      TORCH_CHECK(s[i] >= 0 && s[i] < kNoSlot, "slots: expected 0 <= slot < 2^32 - 1, got ", s[i]);
    if (8 * uint64_t(live_ + deleted_ + n) > 7 * uint64_t(cap_)) rebuild(target(live_ + n));
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) __builtin_prefetch(ctrl_.get() + home(mix(k[i + kAhead])), 1, 3);
      const uint64_t h = mix(k[i]);
      const uint8_t tag = tag_of(h);
      size_t b = home(h);
      int64_t free = -1;  // the first deleted bucket on the way, reused
      for (; ctrl_[b] != kEmpty; b = next(b)) {
        if (ctrl_[b] == kDeleted) {
          if (free < 0) free = int64_t(b);
        } else if (ctrl_[b] == tag) {
          TORCH_CHECK(key_of(slot_[b]) != k[i], "key index: key ", k[i], " is held already");
        }
      }
      if (free >= 0) {
        b = size_t(free);
        --deleted_;
      }
      ctrl_[b] = tag;
      slot_[b] = uint32_t(s[i]);
      set_key(s[i], k[i]);
      slots_ = std::max(slots_, s[i] + 1);
      ++live_;
    }
  }

  // forget `keys` (distinct, all held)
  void remove(torch::Tensor keys) {
    check(keys, torch::kInt64, "keys");
    const int64_t n = keys.numel();
    const int64_t* k = keys.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t h = mix(k[i]);
      const int64_t b = find_from(k[i], tag_of(h), home(h));
      TORCH_CHECK(b >= 0, "key index: key ", k[i], " is not held");
      ctrl_[size_t(b)] = kDeleted;
      --live_;
      ++deleted_;
    }
    if (cap_ > kMinBuckets && 4 * uint64_t(live_) < uint64_t(cap_)) rebuild(target(live_));  // give memory back
  }

  // the key of each slot (each one held)
  torch::Tensor keys_of(torch::Tensor slots) const {
    check(slots, torch::kInt64, "slots");
    const int64_t n = slots.numel();
    auto out = torch::empty({n}, torch::kInt64);
    const int64_t* s = slots.data_ptr<int64_t>();
    int64_t* o = out.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(s[i] >= 0 && s[i] < int64_t(chunks_.size()) * kChunk, "slots: ", s[i], " was never given a key");
      o[i] = key_of(uint32_t(s[i]));
    }
    return out;
  }

  // every held (key, slot), in bucket order
  std::tuple<torch::Tensor, torch::Tensor> items() const {
    auto keys = torch::empty({live_}, torch::kInt64), slots = torch::empty({live_}, torch::kInt64);
    int64_t* k = keys.data_ptr<int64_t>();
    int64_t* s = slots.data_ptr<int64_t>();
    int64_t j = 0;
    for (size_t b = 0; b < cap_; ++b) {
      if (ctrl_[b] < kFull) continue;
      s[j] = slot_[b];
      k[j++] = key_of(slot_[b]);
    }
    return {keys, slots};
  }

  int64_t size() const { return live_; }
  int64_t buckets() const { return int64_t(cap_); }
  int64_t deleted() const { return deleted_; }
  int64_t rebuilds() const { return rebuilds_; }
  // bytes held: the buckets' controls and slots, and the slot -> key array up to the highest slot
  // given (a chunk's pages past it are not written, so not resident)
  int64_t nbytes() const { return int64_t(cap_) * 5 + slots_ * 8; }

 private:
  static constexpr uint8_t kEmpty = 0, kDeleted = 1, kFull = 0x80;  // full: 0x80 | 7 bits of hash
  static constexpr size_t kMinBuckets = 1024;
  static constexpr int64_t kChunkBits = 16, kChunk = int64_t(1) << kChunkBits;  // slots -> keys, 512 KiB a chunk
  static constexpr int64_t kNoSlot = int64_t(0xFFFFFFFF);

  std::unique_ptr<uint8_t[]> ctrl_;
  std::unique_ptr<uint32_t[]> slot_;
  size_t cap_ = 0;
  int64_t live_ = 0, deleted_ = 0, rebuilds_ = 0, slots_ = 0;  // slots_: 1 + the highest slot given a key
  std::vector<std::unique_ptr<int64_t[]>> chunks_;

  static uint64_t mix(int64_t key) {  // splitmix64's finaliser: every bit of the key in every bit
    uint64_t z = uint64_t(key) + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  static uint8_t tag_of(uint64_t h) { return uint8_t(kFull | (h & 0x7F)); }  // the low bits; home() uses the high
  size_t home(uint64_t h) const { return size_t((unsigned __int128)h * cap_ >> 64); }
  size_t next(size_t b) const { return b + 1 == cap_ ? 0 : b + 1; }
  static size_t target(int64_t keys) {  // the capacity a rebuild takes for `keys`: a load of about 0.65
    return std::max(kMinBuckets, size_t(double(keys) / 0.65) + 1);
  }
  const int64_t* key_ptr(uint32_t slot) const { return chunks_[slot >> kChunkBits].get() + (slot & (kChunk - 1)); }
  int64_t key_of(uint32_t slot) const { return *key_ptr(slot); }
  void set_key(int64_t slot, int64_t key) {
    const size_t c = size_t(slot >> kChunkBits);
    while (chunks_.size() <= c) chunks_.emplace_back(new int64_t[kChunk]);
    chunks_[c][slot & (kChunk - 1)] = key;
  }
  // the bucket of `key` probing from `b`, -1 if it is not held
  int64_t find_from(int64_t key, uint8_t tag, size_t b) const {
    for (; ctrl_[b] != kEmpty; b = next(b))
      if (ctrl_[b] == tag && key_of(slot_[b]) == key) return int64_t(b);
    return -1;
  }
  // a table of `capacity` buckets with every held key, and no tombstones: the held slots are
  // marked first, then their keys read in slot order (sequential, where reading them in bucket
  // order would be a random read a key)
  void rebuild(size_t capacity) {
    std::vector<bool> held(chunks_.size() * size_t(kChunk));
    for (size_t b = 0; b < cap_; ++b)
      if (ctrl_[b] >= kFull) held[slot_[b]] = true;
    ctrl_.reset();  // the old table goes before the new one is taken: the peak is the new one and the marks
    slot_.reset();
    cap_ = capacity;
    ctrl_.reset(new uint8_t[cap_]());
    slot_.reset(new uint32_t[cap_]);
    deleted_ = 0;
    ++rebuilds_;
    for (size_t s = 0; s < held.size(); ++s) {
      if (!held[s]) continue;
      const uint64_t h = mix(key_of(uint32_t(s)));
      size_t b = home(h);
      while (ctrl_[b] != kEmpty) b = next(b);
      ctrl_[b] = tag_of(h);
      slot_[b] = uint32_t(s);
    }
  }
};
