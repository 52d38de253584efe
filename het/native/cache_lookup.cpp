// The worker cache's lookup (find, touch, miss placement, eviction), the sets of keys, and an
// announced step's next-use marks (het/cache/torch_step.py's lookup, set_of and announce).
#include "cache.h"
#include "ops.h"

// The set of each key (EmbeddingCache.set_of).
torch::Tensor cache_sets(torch::Tensor keys, int64_t num_sets) {
  check(keys, torch::kInt64, "keys");
  auto out = torch::empty_like(keys);
  const int64_t* k = keys.data_ptr<int64_t>();
  int64_t* s = out.data_ptr<int64_t>();
  at::parallel_for(0, keys.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) s[i] = set_of(k[i], num_sets);
  });
  return out;
}

// TorchStep.lookup after its window bookkeeping: find each key in its set; hits are
// touched; misses take the lowest-scored unprotected way of their set, or bypass. With `nxt`
// (each key's next announced use; empty: no window) every key found or placed marks its slot's
// next use (`soon`), and with `ahead` (steps announced) misses go soonest needed first (a stable
// order, as argsort(stable=True)) and Belady's rule weighs the window. Returns slot, hit, clocks
// to sync, the writeback (keys, grads, counts) of evicted rows with unpushed updates, and the
// counts [hits, placed, evictions].
std::vector<torch::Tensor> cache_lookup(torch::Tensor keys, torch::Tensor nxt, torch::Tensor tkeys,
                                        torch::Tensor held, torch::Tensor rows, torch::Tensor pending,
                                        torch::Tensor clock, torch::Tensor updates, torch::Tensor last_use,
                                        torch::Tensor uses, torch::Tensor score, int64_t ways, int64_t step,
                                        int64_t protect, bool lfu, torch::Tensor soon, int64_t now, bool ahead,
                                        torch::Tensor sq) {
  check(keys, torch::kInt64, "keys");
  check(sq, torch::kFloat32, "sq");
  Slots c = slots_of(tkeys, held, rows, pending, clock, updates, last_use, uses, score);
  const int64_t n = keys.numel(), num_sets = tkeys.numel() / ways, D = c.dim;
  const int64_t* k = keys.data_ptr<int64_t>();
  auto slot_t = torch::empty({n}, keys.options());
  auto hit_t = torch::empty({n}, keys.options().dtype(torch::kBool));
  int64_t* slot = slot_t.data_ptr<int64_t>();
  bool* hit = hit_t.data_ptr<bool>();
  std::vector<int64_t> sets(n);
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {  // find: reads only
    for (int64_t i = b; i < e; ++i) {
      if (i + kAhead < e) {
        const int64_t ahead = set_of(k[i + kAhead], num_sets) * ways;
        prefetch(c.keys + ahead, ways * 8, false);
        prefetch(c.held + ahead, ways, false);
      }
      const int64_t base = set_of(k[i], num_sets) * ways;
      sets[i] = base;
      int64_t found = -1;
      for (int64_t w = 0; w < ways; ++w) {
        if (c.held[base + w] && c.keys[base + w] == k[i]) { found = base + w; break; }
      }
      slot[i] = found;
      hit[i] = found >= 0;
    }
  });
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {  // touch the hits: uses + 1, last use now
    if (i + kAhead < n && slot[i + kAhead] >= 0) {  // the slot columns: random, past L2
      const int64_t ta = slot[i + kAhead];
      __builtin_prefetch(c.last_use + ta, 1, 3);
      __builtin_prefetch(c.uses + ta, 1, 3);
      __builtin_prefetch(c.score + ta, 1, 3);
    }
    const int64_t t = slot[i];
    if (t < 0) continue;
    ++hits;
    c.last_use[t] = step;
    c.uses[t] += 1;
    c.score[t] = policy_score(lfu, step, c.uses[t]);
  }
  // with a window: each slot's next announced use (EmbeddingCache.soon), steps away from `now`
  // as het.cache.lookahead.steps_away counts them, read here for the few slots a miss weighs
  const bool marks = nxt.numel() > 0, window = marks && ahead;
  if (marks) {
    check(nxt, torch::kInt64, "nxt");
    check(soon, torch::kInt64, "soon");
    TORCH_CHECK(nxt.numel() == n, "nxt: expected one per key (", n, "), got ", nxt.numel());
    TORCH_CHECK(soon.numel() == tkeys.numel(), "soon: expected one per slot (", tkeys.numel(), "), got ",
                soon.numel());
  }
  const int64_t* nx = marks ? nxt.data_ptr<int64_t>() : nullptr;
  int64_t* sn = marks ? soon.data_ptr<int64_t>() : nullptr;
  std::vector<int64_t> misses;  // in key order, or soonest needed first (stable)
  misses.reserve(size_t(n - hits));
  for (int64_t i = 0; i < n; ++i) if (!hit[i]) misses.push_back(i);
  if (window) {
    std::stable_sort(misses.begin(), misses.end(),
                     [&](int64_t a, int64_t b) { return steps_away(nx[a], now) < steps_away(nx[b], now); });
  }
  // misses are placed in rounds in the reference (the r-th miss of each set in round r); sets
  // are independent, so one pass in order gives the same choices; victims are listed by round
  std::vector<int32_t> rank_in_set(num_sets, 0);
  struct Victim { int64_t round, seq, slot, key; bool held; };
  std::vector<Victim> victims;
  int64_t placed = 0;
  for (int64_t j = 0; j < int64_t(misses.size()); ++j) {
    if (j + kAhead < int64_t(misses.size())) {  // the set a later miss weighs
      const int64_t ahead = sets[misses[j + kAhead]];
      prefetch(c.score + ahead, ways * 8, false);
      prefetch(c.last_use + ahead, ways * 8, false);
      if (window) prefetch(sn + ahead, ways * 8, false);
    }
    const int64_t i = misses[j], base = sets[i];
    const int64_t round = rank_in_set[base / ways]++;
    if (round >= ways) continue;  // the reference runs `ways` rounds: later misses bypass
    int64_t best = 0, victim = 0;
    for (int64_t w = 0; w < ways; ++w) {
      const int64_t t = base + w;
      int64_t s = c.score[t];
      if (window && steps_away(sn[t], now) < kNever) s = kSoon - steps_away(sn[t], now);
      if (c.last_use[t] > step - protect) s = kProtected;
      if (w == 0 || s < victim) { victim = s; best = w; }
    }
    bool ok = victim != kProtected;
    if (window) ok = ok && ((victim <= kSoon - kNever) || (steps_away(nx[i], now) < kSoon - victim));
    if (!ok) continue;
    const int64_t t = base + best;
    victims.push_back({round, j, t, c.keys[t], c.held[t]});
    c.keys[t] = k[i];
    c.held[t] = true;
    c.clock[t] = -1;
    c.last_use[t] = step;
    c.uses[t] = 1;
    c.score[t] = policy_score(lfu, step, 1);
    slot[i] = t;
    ++placed;
  }
  std::stable_sort(victims.begin(), victims.end(),
                   [](const Victim& a, const Victim& b) { return a.round < b.round; });
  int64_t evictions = 0, dirty = 0;
  for (const auto& v : victims) {
    evictions += v.held;
    dirty += v.held && c.updates[v.slot] > 0;
  }
  auto wb_keys = torch::empty({dirty}, keys.options());
  auto wb_grads = torch::empty({dirty, D}, rows.options());
  auto wb_counts = torch::empty({dirty}, keys.options());
  const int64_t W = sq.dim() == 2 ? sq.size(1) : 0;  // the pending squares (a rule that follows Adagrad)
  auto wb_sq = torch::empty({dirty, W}, rows.options());
  int64_t* wk = wb_keys.data_ptr<int64_t>();
  float* wg = wb_grads.data_ptr<float>();
  int64_t* wc = wb_counts.data_ptr<int64_t>();
  float* sqp = W ? sq.data_ptr<float>() : nullptr;
  float* wsq = W ? wb_sq.data_ptr<float>() : nullptr;
  int64_t m = 0;
  for (const auto& v : victims) {
    if (!(v.held && c.updates[v.slot] > 0)) continue;
    wk[m] = v.key;
    wc[m] = c.updates[v.slot];
    std::copy(c.pending + v.slot * D, c.pending + (v.slot + 1) * D, wg + m * D);
    std::fill(c.pending + v.slot * D, c.pending + (v.slot + 1) * D, 0.0f);
    if (W) {
      std::copy(sqp + v.slot * W, sqp + (v.slot + 1) * W, wsq + m * W);
      std::fill(sqp + v.slot * W, sqp + (v.slot + 1) * W, 0.0f);
    }
    c.updates[v.slot] = 0;
    ++m;
  }
  auto clocks_t = torch::empty({n}, keys.options());
  int64_t* clocks = clocks_t.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && hit[i + kAhead]) __builtin_prefetch(c.clock + slot[i + kAhead], 0, 3);
    clocks[i] = hit[i] ? c.clock[slot[i]] : -1;
  }
  if (marks) {
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n && slot[i + kAhead] >= 0) __builtin_prefetch(sn + slot[i + kAhead], 1, 3);
      if (slot[i] >= 0) sn[slot[i]] = nx[i];
    }
  }
  auto counts = torch::tensor({hits, placed, evictions}, keys.options());
  return {slot_t, hit_t, clocks_t, wb_keys, wb_grads, wb_counts, counts, wb_sq};
}

// TorchStep.announce: the slots holding `keys` (a step announced as number `number`) will
// be used then at the latest: soon = min(soon, number).
void cache_soon(torch::Tensor keys, torch::Tensor tkeys, torch::Tensor held, torch::Tensor soon, int64_t ways,
                int64_t number) {
  check(keys, torch::kInt64, "keys");
  check(tkeys, torch::kInt64, "cache keys");
  check(held, torch::kBool, "held");
  check(soon, torch::kInt64, "soon");
  const int64_t n = keys.numel(), num_sets = tkeys.numel() / ways;
  const int64_t* k = keys.data_ptr<int64_t>();
  const int64_t* tk = tkeys.data_ptr<int64_t>();
  const bool* hd = held.data_ptr<bool>();
  int64_t* sn = soon.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {  // the set a later key searches, and its marks: random, past L2
      const int64_t ahead = set_of(k[i + kAhead], num_sets) * ways;
      prefetch(tk + ahead, ways * 8, false);
      prefetch(hd + ahead, ways, false);
      prefetch(sn + ahead, ways * 8, true);
    }
    const int64_t base = set_of(k[i], num_sets) * ways;
    for (int64_t w = 0; w < ways; ++w) {
      if (hd[base + w] && tk[base + w] == k[i]) {
        sn[base + w] = std::min(sn[base + w], number);
        break;
      }
    }
  }
}
