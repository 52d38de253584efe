// The worker cache's slot layout and scores, shared by its lookup and the lookahead window
// (het/cache/cache.py, het/cache/policy.py).
#pragma once

#include "common.h"

constexpr int64_t kProtected = std::numeric_limits<int64_t>::max();
constexpr int64_t kNever = int64_t(1) << 40;           // het.cache.lookahead.NEVER
constexpr int64_t kSoon = (int64_t(1) << 62) + kNever;  // het.cache.torch_step._SOON
constexpr uint64_t kHash = 0x9E3779B97F4A7C15ull;       // Fibonacci hashing (het.cache.cache._HASH)

inline int64_t policy_score(bool lfu, int64_t step, int64_t uses) {
  // het.cache.policy: LRU scores the last use; LFU packs (uses, last use)
  if (!lfu) return step;
  return (std::min<int64_t>(uses, (int64_t(1) << 29) - 1) << 32) | step;
}

inline int64_t set_of(int64_t key, int64_t num_sets) {
  uint64_t high = (uint64_t(key) * kHash) >> 32;  // the product wraps mod 2^64, as torch's int64 does
  return int64_t((high * uint64_t(num_sets)) >> 32);
}

struct Slots {  // the cache's per-slot tensors, as raw pointers
  int64_t* keys;
  bool* held;
  float* rows;
  float* pending;
  int64_t* clock;
  int64_t* updates;
  int64_t* last_use;
  int64_t* uses;
  int64_t* score;
  int64_t dim;
};

inline Slots slots_of(torch::Tensor keys, torch::Tensor held, torch::Tensor rows, torch::Tensor pending,
                      torch::Tensor clock, torch::Tensor updates, torch::Tensor last_use, torch::Tensor uses,
                      torch::Tensor score) {
  check(keys, torch::kInt64, "keys");
  check(held, torch::kBool, "held");
  check(rows, torch::kFloat32, "rows");
  check(pending, torch::kFloat32, "pending");
  for (auto* t : {&clock, &updates, &last_use, &uses, &score}) check(*t, torch::kInt64, "slot column");
  return {keys.data_ptr<int64_t>(), held.data_ptr<bool>(), rows.data_ptr<float>(), pending.data_ptr<float>(),
          clock.data_ptr<int64_t>(), updates.data_ptr<int64_t>(), last_use.data_ptr<int64_t>(),
          uses.data_ptr<int64_t>(), score.data_ptr<int64_t>(), rows.size(1)};
}

// het.cache.lookahead.steps_away: a next-use number's steps after `now`, kNever for none or past
inline int64_t steps_away(int64_t number, int64_t now) {
  return number > now && number < kNever ? number - now : kNever;
}
