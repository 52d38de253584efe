// het's native core: the worker cache's step (lookup with miss placement, fill, update), a fixed
// table's push on the shard and initial_rows, each in one pass over the keys, where the PyTorch
// reference (het/cache/cache.py, het/ps/table.py) needs dozens of small tensor ops. Same results, bit for bit: every float is computed with the same operations
// in the same order as the reference (compiled with -ffp-contract=off: a multiply-add is fused
// only where torch's kernel fuses it, and square roots are torch's own).
//
// CPU tensors only; the cache keeps the reference for CUDA. Functions update the tensors they
// are given in place.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <vector>

namespace {

constexpr int64_t kProtected = std::numeric_limits<int64_t>::max();
constexpr int64_t kNever = int64_t(1) << 40;           // het.cache.lookahead.NEVER
constexpr int64_t kSoon = (int64_t(1) << 62) + kNever;  // het.cache.cache._SOON
constexpr uint64_t kHash = 0x9E3779B97F4A7C15ull;       // Fibonacci hashing (het.cache.cache._HASH)
constexpr int64_t kGrain = 4096;                        // keys per task of the thread pool

void check(const torch::Tensor& t, torch::ScalarType type, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, ": expected a CPU tensor, got one on ", t.device());
  TORCH_CHECK(t.scalar_type() == type, name, ": expected ", type, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, ": expected a contiguous tensor");
}

constexpr int64_t kAhead = 6;  // keys ahead whose rows are prefetched: random rows are the cost

inline void prefetch(const void* p, int64_t bytes, bool write) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) {
    if (write) __builtin_prefetch(c + b, 1, 3);
    else __builtin_prefetch(c + b, 0, 3);
  }
}

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

Slots slots_of(torch::Tensor keys, torch::Tensor held, torch::Tensor rows, torch::Tensor pending,
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

}  // namespace

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

// het.cache.lookahead.steps_away: a next-use number's steps after `now`, kNever for none or past
inline int64_t steps_away(int64_t number, int64_t now) {
  return number > now && number < kNever ? number - now : kNever;
}

// EmbeddingCache.lookup after its window bookkeeping: find each key in its set; hits are
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

// The local rule that follows the table's Adagrad (EmbeddingCache._server_step): the step the
// server will take with a push of `p`, from the accumulator `a` (W = 1: one per row, the mean
// of the squares; W = D: one per coordinate), written as -step into `out` (may alias nothing).
// The sum of the squares of x[0..D), in 16 lanes the compiler vectorises (a serial sum in
// double was a quarter of the cache's update at dim 128).
inline float sum_squares(const float* x, int64_t D) {
  float lane[16] = {0};
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    for (int l = 0; l < 16; ++l) lane[l] += x[d + l] * x[d + l];
  }
  for (; d < D; ++d) lane[d & 15] += x[d] * x[d];
  float sum = 0;
  for (int l = 0; l < 16; ++l) sum += lane[l];
  return sum;
}

struct Follow {
  float lr, eps;
  int64_t W, D;
  // het.ps.optim.adagrad_factor: one step 1 / (sqrt(a + q) + eps); u > 1 steps of like size
  // 2 / (sqrt(a + q + h) + sqrt(a + h) + 2 eps), h = q / 2u
  float factor(float a, float q, int64_t u) const {
    if (u > 1) {
      const float h = q / float(2 * u);
      return 2.0f / (std::sqrt(a + q + h) + std::sqrt(a + h) + 2.0f * eps);
    }
    return 1.0f / (std::sqrt(a + q) + eps);
  }
  // out[d] = -(p[d] * factor * lr): minus the step the server will take with a push of `p`,
  // the sum of `u` steps whose squares sum to `q`, from the accumulator `a` (W floats each)
  void neg_step(const float* __restrict__ a, const float* __restrict__ p, const float* __restrict__ q, int64_t u,
                float* __restrict__ out) const {
    if (u == 0) {
      std::fill(out, out + D, 0.0f);
    } else if (W == 1) {
      const float f = factor(a[0], q[0], u);
      for (int64_t d = 0; d < D; ++d) out[d] = -(p[d] * f * lr);
    } else if (u > 1) {  // factor's arithmetic, the branch out of the loop: it vectorises
      const float twice_u = float(2 * u), two_eps = 2.0f * eps;
      for (int64_t d = 0; d < D; ++d) {
        const float h = q[d] / twice_u;
        out[d] = -(p[d] * (2.0f / (std::sqrt(a[d] + q[d] + h) + std::sqrt(a[d] + h) + two_eps)) * lr);
      }
    } else {
      for (int64_t d = 0; d < D; ++d) out[d] = -(p[d] * (1.0f / (std::sqrt(a[d] + q[d]) + eps)) * lr);
    }
  }
  // what one step of gradient `g` adds to the squares `q`
  void add_squares(float* q, const float* g) const {
    if (W == 1) {
      q[0] += sum_squares(g, D) / float(D);
    } else {
      for (int64_t d = 0; d < D; ++d) q[d] += g[d] * g[d];
    }
  }
};

// EmbeddingCache.fill: take the rows the PS sent for keys[index]; a stale hit's row is the
// server's minus its pending gradient sum's step (local_lr times it, or with `acc` given (n, W),
// the step the server's Adagrad will take, from the state sent beside the rows). Returns every
// key's row and (stale hits refreshed, their squared drift, their refreshed squared norm).
std::vector<torch::Tensor> cache_fill(torch::Tensor slot, torch::Tensor hit, torch::Tensor index,
                                      torch::Tensor sent, torch::Tensor sent_clocks, torch::Tensor rows,
                                      torch::Tensor pending, torch::Tensor clock, double local_lr,
                                      torch::Tensor acc, torch::Tensor sent_state, torch::Tensor sq,
                                      torch::Tensor updates, double lr, double eps) {
  check(slot, torch::kInt64, "slot");
  check(hit, torch::kBool, "hit");
  check(index, torch::kInt64, "index");
  check(sent, torch::kFloat32, "rows sent");
  check(sent_clocks, torch::kInt64, "clocks sent");
  check(rows, torch::kFloat32, "cache rows");
  check(pending, torch::kFloat32, "pending");
  check(clock, torch::kInt64, "clock");
  check(acc, torch::kFloat32, "acc");
  check(sent_state, torch::kFloat32, "state sent");
  check(sq, torch::kFloat32, "sq");
  check(updates, torch::kInt64, "updates");
  const int64_t n = slot.numel(), m = index.numel(), D = rows.size(1), W = acc.dim() == 2 ? acc.size(1) : 0;
  TORCH_CHECK(sq.sizes() == acc.sizes(), "sq: expected the shape of acc, ", acc.sizes(), ", got ", sq.sizes());
  TORCH_CHECK(sent.size(0) == m && (m == 0 || sent.size(1) == D), "rows sent: expected (", m, ", ", D,
              "), got ", sent.sizes());
  TORCH_CHECK(sent_clocks.numel() == m, "clocks sent: expected ", m, ", got ", sent_clocks.numel());
  TORCH_CHECK(hit.numel() == n, "hit: expected ", n, " marks, got ", hit.numel());
  TORCH_CHECK(W == 0 || W == 1 || W == D, "acc: expected width 0, 1 or ", D, ", got ", W);
  TORCH_CHECK(W == 0 || (acc.size(0) == rows.size(0) && sent_state.dim() == 2 && sent_state.size(0) == m &&
                         sent_state.size(1) == W),
              "state sent: expected (", m, ", ", W, "), got ", sent_state.sizes());
  for (int64_t j = 0; j < m; ++j) {  // the reply's positions: a bad one must not write elsewhere
    const int64_t i = index.data_ptr<int64_t>()[j];
    TORCH_CHECK(i >= 0 && i < n, "index: expected positions in [0, ", n, "), got ", i);
  }
  const int64_t* sl = slot.data_ptr<int64_t>();
  const bool* h = hit.data_ptr<bool>();
  const int64_t* ix = index.data_ptr<int64_t>();
  const float* src = sent.data_ptr<float>();
  const int64_t* sc = sent_clocks.data_ptr<int64_t>();
  float* r = rows.data_ptr<float>();
  const float* p = pending.data_ptr<float>();
  int64_t* ck = clock.data_ptr<int64_t>();
  float* a = W ? acc.data_ptr<float>() : nullptr;
  const float* ss = W ? sent_state.data_ptr<float>() : nullptr;
  const float* q = W ? sq.data_ptr<float>() : nullptr;
  const int64_t* u = updates.data_ptr<int64_t>();
  const float llr = float(local_lr);  // torch multiplies a float tensor by a Python float in float
  const Follow follow{float(lr), float(eps), W, D};
  auto out = torch::empty({n, D}, rows.options());
  float* o = out.data_ptr<float>();
  int64_t stale = 0;
  for (int64_t j = 0; j < m; ++j) stale += sl[ix[j]] >= 0 && h[ix[j]];
  const int threads = at::get_num_threads();
  std::vector<double> drift(threads, 0.0), norm(threads, 0.0);
  at::parallel_for(0, m, kGrain, [&](int64_t b, int64_t e) {  // index holds distinct keys
    const int tid = at::get_thread_num();
    std::vector<float> fresh(D);
    for (int64_t j = b; j < e; ++j) {
      if (j + kAhead < e && sl[ix[j + kAhead]] >= 0) {
        prefetch(r + sl[ix[j + kAhead]] * D, D * 4, true);
        if (h[ix[j + kAhead]]) prefetch(p + sl[ix[j + kAhead]] * D, D * 4, false);
      }
      const int64_t i = ix[j], t = sl[i];
      const float* s = src + j * D;
      if (t < 0) {
        std::copy(s, s + D, o + i * D);
        continue;
      }
      float* dst = r + t * D;
      if (W) std::copy(ss + j * W, ss + (j + 1) * W, a + t * W);
      if (h[i]) {
        const float* pt = p + t * D;
        if (W) {
          follow.neg_step(a + t * W, pt, q + t * W, u[t], fresh.data());
          for (int64_t d = 0; d < D; ++d) fresh[d] = s[d] + fresh[d];
        } else {
          for (int64_t d = 0; d < D; ++d) fresh[d] = s[d] - llr * pt[d];
        }
        float change[16] = {0};
        int64_t d = 0;
        for (; d + 16 <= D; d += 16) {
          for (int l = 0; l < 16; ++l) {
            const float diff = dst[d + l] - fresh[d + l];
            change[l] += diff * diff;
          }
        }
        for (; d < D; ++d) change[d & 15] += (dst[d] - fresh[d]) * (dst[d] - fresh[d]);
        for (int l = 0; l < 16; ++l) drift[tid] += change[l];
        norm[tid] += sum_squares(fresh.data(), D);
        std::copy(fresh.begin(), fresh.end(), dst);
      } else {
        std::copy(s, s + D, dst);
      }
      ck[t] = sc[j];
    }
  });
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i + kAhead < e && sl[i + kAhead] >= 0) prefetch(r + sl[i + kAhead] * D, D * 4, false);
      if (sl[i] >= 0) std::copy(r + sl[i] * D, r + (sl[i] + 1) * D, o + i * D);
    }
  });
  double drift_sq = 0, norm_sq = 0;
  for (int i = 0; i < threads; ++i) drift_sq += drift[i], norm_sq += norm[i];
  auto stats = torch::tensor({double(stale), drift_sq, norm_sq}, torch::kFloat64);
  return {out, stats};
}

// EmbeddingCache.update: apply one step's gradients to the cached rows (row -= local_lr * g, or
// with `acc` (n, W) the change of the step the server's Adagrad will take with the pending sum),
// accumulate them, and take the rows with more than `bound` unpushed updates (with their clocks
// advanced by the updates when the copy counts its own updates as seen (`own_seen`: its local
// rule is the server's), or cleared when `clear_clock`; their
// accumulators as the server's will be), then the gradients of keys that bypassed the cache or
// lost their slot. Returns keys, grads, counts and the number of rows taken from the cache.
std::vector<torch::Tensor> cache_update(torch::Tensor keys, torch::Tensor slot, torch::Tensor grads,
                                        torch::Tensor tkeys, torch::Tensor held, torch::Tensor rows,
                                        torch::Tensor pending, torch::Tensor clock, torch::Tensor updates,
                                        double local_lr, double bound, bool own_seen, bool clear_clock,
                                        torch::Tensor acc, torch::Tensor sq, double lr, double eps) {
  check(keys, torch::kInt64, "keys");
  check(slot, torch::kInt64, "slot");
  check(grads, torch::kFloat32, "grads");
  check(tkeys, torch::kInt64, "cache keys");
  check(held, torch::kBool, "held");
  check(rows, torch::kFloat32, "rows");
  check(pending, torch::kFloat32, "pending");
  check(clock, torch::kInt64, "clock");
  check(updates, torch::kInt64, "updates");
  check(acc, torch::kFloat32, "acc");
  check(sq, torch::kFloat32, "sq");
  const int64_t n = keys.numel(), D = rows.size(1), W = acc.dim() == 2 ? acc.size(1) : 0;
  TORCH_CHECK(sq.sizes() == acc.sizes(), "sq: expected the shape of acc, ", acc.sizes(), ", got ", sq.sizes());
  TORCH_CHECK(grads.size(0) == n && (n == 0 || grads.size(1) == D), "grads: expected (", n, ", ", D, "), got ",
              grads.sizes());
  TORCH_CHECK(W == 0 || ((W == 1 || W == D) && acc.size(0) == rows.size(0)), "acc: expected (", rows.size(0),
              ", 1 or ", D, "), got ", acc.sizes());
  const int64_t* k = keys.data_ptr<int64_t>();
  const int64_t* sl = slot.data_ptr<int64_t>();
  const float* g = grads.data_ptr<float>();
  const int64_t* tk = tkeys.data_ptr<int64_t>();
  const bool* hd = held.data_ptr<bool>();
  float* r = rows.data_ptr<float>();
  float* p = pending.data_ptr<float>();
  int64_t* ck = clock.data_ptr<int64_t>();
  int64_t* u = updates.data_ptr<int64_t>();
  float* ac = W ? acc.data_ptr<float>() : nullptr;
  const float nlr = float(-local_lr);
  const Follow follow{float(lr), float(eps), W, D};
  float* q = W ? sq.data_ptr<float>() : nullptr;
  std::vector<uint8_t> live(n);
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {  // distinct keys: distinct slots
    std::vector<float> before(W ? D : 0), after(W ? D : 0);
    for (int64_t i = b; i < e; ++i) {
      if (i + kAhead < e && sl[i + kAhead] >= 0) {
        const int64_t ta = sl[i + kAhead];
        prefetch(r + ta * D, D * 4, true);
        prefetch(p + ta * D, D * 4, true);
        __builtin_prefetch(tk + ta, 0, 3);  // the slot's columns: random reads past L2 as well
        __builtin_prefetch(hd + ta, 0, 3);
        __builtin_prefetch(u + ta, 1, 3);
        if (W == 1) {
          __builtin_prefetch(ac + ta, 0, 3);
          __builtin_prefetch(q + ta, 1, 3);
        }
      }
      const int64_t t = sl[i];
      live[i] = t >= 0 && hd[t] && tk[t] == k[i];
      if (!live[i]) continue;
      const float* __restrict__ gi = g + i * D;
      float* __restrict__ rt = r + t * D;
      float* __restrict__ pt = p + t * D;
      if (W == 1) {  // row += step(before) - step(after), in one pass: one factor each
        float* qt = q + t;
        const float fb = u[t] ? follow.factor(ac[t], qt[0], u[t]) : 0.0f;
        qt[0] += sum_squares(gi, D) / float(D);
        const float fa = follow.factor(ac[t], qt[0], u[t] + 1), lr = follow.lr;
        for (int64_t d = 0; d < D; ++d) {
          const float before_d = pt[d], after_d = before_d + gi[d];
          pt[d] = after_d;
          rt[d] += -(after_d * fa * lr) - -(before_d * fb * lr);
        }
      } else if (W) {  // the same per coordinate
        follow.neg_step(ac + t * W, pt, q + t * W, u[t], before.data());
        for (int64_t d = 0; d < D; ++d) pt[d] += gi[d];
        follow.add_squares(q + t * W, gi);
        follow.neg_step(ac + t * W, pt, q + t * W, u[t] + 1, after.data());
        for (int64_t d = 0; d < D; ++d) rt[d] += after[d] - before[d];
      } else {
        for (int64_t d = 0; d < D; ++d) {
          const float step = gi[d] * nlr;
          rt[d] += step;
          pt[d] += gi[d];
        }
      }
      u[t] += 1;
    }
  });
  int64_t due = 0, gone = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!live[i]) ++gone;
    else due += double(u[sl[i]]) > bound;
  }
  auto out_keys = torch::empty({due + gone}, keys.options());
  auto out_grads = torch::empty({due + gone, D}, grads.options());
  auto out_counts = torch::empty({due + gone}, keys.options());
  auto out_sq = torch::zeros({due + gone, W}, grads.options());
  int64_t* ok = out_keys.data_ptr<int64_t>();
  float* og = out_grads.data_ptr<float>();
  int64_t* oc = out_counts.data_ptr<int64_t>();
  float* osq = W ? out_sq.data_ptr<float>() : nullptr;
  int64_t a = 0, b = due;  // rows taken first, then the gradients of keys without a slot
  for (int64_t i = 0; i < n; ++i) {
    if (!live[i]) {
      ok[b] = k[i];
      oc[b] = 1;
      std::copy(g + i * D, g + (i + 1) * D, og + b * D);
      if (W) follow.add_squares(osq + b * W, g + i * D);
      ++b;
      continue;
    }
    const int64_t t = sl[i];
    if (!(double(u[t]) > bound)) continue;
    ok[a] = tk[t];
    oc[a] = u[t];
    if (W) {  // the squares travel with the push; the accumulator is as the server's will be
      for (int64_t w = 0; w < W; ++w) ac[t * W + w] += q[t * W + w];
      std::copy(q + t * W, q + (t + 1) * W, osq + a * W);
      std::fill(q + t * W, q + (t + 1) * W, 0.0f);
    }
    std::copy(p + t * D, p + (t + 1) * D, og + a * D);
    std::fill(p + t * D, p + (t + 1) * D, 0.0f);
    if (own_seen) ck[t] += u[t];
    else if (clear_clock) ck[t] = -1;
    u[t] = 0;
    ++a;
  }
  return {out_keys, out_grads, out_counts, torch::tensor({due}, keys.options()), out_sq};
}

// Whether every float of x[0 .. n) is finite: an exponent of all ones is inf or NaN. Bit tests
// the compiler vectorises, where a loop of std::isfinite runs one float at a time.
bool all_finite(const float* x, int64_t n) {
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

// het.ps.checks.all_finite: whether every float of a contiguous float32 tensor is finite.
bool all_finite_op(torch::Tensor x) {
  check(x, torch::kFloat32, "x");
  return all_finite(x.data_ptr<float>(), x.numel());
}

// The square roots of an (m, D) block, by torch's kernel, as the reference's `sqrt_` takes them
// (the same bits: torch's vectorised sqrt is not always IEEE's correctly rounded one).
torch::Tensor torch_sqrt(float* values, int64_t m, int64_t D) {
  return torch::from_blob(values, {m, D}, torch::kFloat32).sqrt();
}

// table_push's SGD in place, in one pass over the gradients in order (duplicates one after
// another): each row's old value, clock and mark are kept aside before it changes, the new
// value checked as it is written (rows prefetched ahead); if any value is not finite or a clock
// would pass max_clock, every row is put back, last change first. The same floats as the
// general path, without reading the rows twice.
int64_t sgd_push_in_place(float* w, int64_t* ck, bool* tc, const int64_t* r, const int64_t* a, const float* g,
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

// TableRows.push for a fixed table, all or nothing: the new rows and optimizer state of the
// unique `rows` are computed aside and checked first (every value finite, no clock past
// max_clock), and written only if they pass. `at` gives each gradient's place in `rows`, and
// `inverse` each count's. SGD applies the gradients in order, duplicates one after another;
// Adagrad and Adam take one gradient per row (duplicates summed by the caller). The floats follow
// het.ps.optim's tensor ops: torch's index_add_(alpha) is a fused multiply-add (its kernel:
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
    // het.ps.optim.Adagrad with a push of several steps (Pushed): row j's gradient sums steps[j]
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

// A lazy reply's rows (het.ps.table.TableRows.rows_to_send): the rows idx whose `touched` mark
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

// torch.unique(keys, sorted=True, return_inverse=True) of int64 keys: the distinct keys in
// ascending order and each key's position among them. A radix sort (8-bit digits, least
// significant first; a digit every key shares is skipped: ids below 2^24 take 3 passes) where
// torch sorts by comparisons; integers, so the same tensors exactly.
std::vector<torch::Tensor> unique_inverse(torch::Tensor keys) {
  check(keys, torch::kInt64, "keys");
  const int64_t n = keys.numel();
  auto inverse_t = torch::empty(keys.sizes(), keys.options());
  if (n == 0) return {torch::empty({0}, keys.options()), inverse_t};
  constexpr uint64_t kSign = uint64_t(1) << 63;  // flipped: int64 order as unsigned order
  const int64_t* k = keys.data_ptr<int64_t>();
  std::vector<uint64_t> a(n), b(n);
  std::vector<int64_t> at(n), bt(n);
  std::vector<std::array<int64_t, 256>> count(8);
  for (auto& c : count) c.fill(0);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t v = uint64_t(k[i]) ^ kSign;
    a[i] = v;
    at[i] = i;
    for (int p = 0; p < 8; ++p) ++count[p][(v >> (8 * p)) & 255];
  }
  for (int p = 0; p < 8; ++p) {
    auto& c = count[p];
    if (c[(a[0] >> (8 * p)) & 255] == n) continue;  // one digit for all: the order stands
    int64_t offset = 0;
    for (auto& x : c) {
      const int64_t here = x;
      x = offset;
      offset += here;
    }
    for (int64_t i = 0; i < n; ++i) {  // stable: equal digits keep the previous passes' order
      const int64_t to = c[(a[i] >> (8 * p)) & 255]++;
      b[to] = a[i];
      bt[to] = at[i];
    }
    a.swap(b);
    at.swap(bt);
  }
  int64_t m = 1;
  for (int64_t i = 1; i < n; ++i) m += a[i] != a[i - 1];
  auto unique_t = torch::empty({m}, keys.options());
  int64_t* u = unique_t.data_ptr<int64_t>();
  int64_t* inv = inverse_t.data_ptr<int64_t>();
  int64_t r = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || a[i] != a[i - 1]) u[++r] = int64_t(a[i] ^ kSign);
    inv[at[i]] = r;
  }
  return {unique_t, inverse_t};
}

// het.ps.table.initial_rows after its counters: row i, column c is splitmix64 of
// (counters[i] * dim + c) ^ salt, its top 24 bits scaled to [-scale, scale), in float64 as numpy
// computes it, then rounded to float32.
inline void initial_row(uint64_t counter, int64_t dim, uint64_t salt, double scale, float* o) {
  const uint64_t first = counter * uint64_t(dim);
  for (int64_t c = 0; c < dim; ++c) {
    uint64_t x = ((first + uint64_t(c)) ^ salt) + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    double unit = double(x >> 40);
    unit *= 2.0 / double(1 << 24);
    unit -= 1;
    unit *= scale;
    o[c] = float(unit);
  }
}

torch::Tensor initial_rows(torch::Tensor counters, int64_t dim, int64_t salt, double scale) {
  check(counters, torch::kInt64, "counters");
  const int64_t n = counters.numel();
  auto out = torch::empty({n, dim}, counters.options().dtype(torch::kFloat32));
  const uint64_t* ctr = reinterpret_cast<const uint64_t*>(counters.data_ptr<int64_t>());
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n, std::max<int64_t>(1, kGrain / std::max<int64_t>(dim, 1)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) initial_row(ctr[i], dim, uint64_t(salt), scale, o + i * dim);
  });
  return out;
}

// het.ps.table.initial_counters of one key: the key itself, or where key * dim wraps (a negative
// key, or one at or past 2^64 / dim), splitmix64's finaliser of it (het.ps.partition.mix).
inline uint64_t initial_counter(int64_t key, int64_t dim) {
  const uint64_t k = uint64_t(key);
  bool wide = key < 0;
  if (dim > 1) {
    const uint64_t top = ~uint64_t(0), d = uint64_t(dim);
    wide = wide || k >= top / d + (top % d == d - 1);  // floor(2^64 / dim), as 2^64 = top + 1
  }
  if (!wide) return k;
  uint64_t x = k;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// het.ps.replies: one shard's lazy reply, its rows, clocks and optimizer state put together in one
// pass. Row i of the n it answers is built here where bit i of `bits` is set (little bit order,
// np.packbits's): the initial row of its key (initial_rows of initial_counters), clock 0 and the
// initial state `init` (W floats, none when W = 0); else it is the next of the k rows, clocks and
// states sent. Shape: sent (k, D), bits (ceil(n / 8),), keys (n,), clocks (k,), state (k, W),
// init (W,) -> (n, D), (n,), (n, W).
std::vector<torch::Tensor> lazy_reply(torch::Tensor sent, torch::Tensor bits, torch::Tensor keys,
                                      torch::Tensor clocks, torch::Tensor state, torch::Tensor init, int64_t salt,
                                      double scale) {
  check(sent, torch::kFloat32, "sent rows");
  check(bits, torch::kUInt8, "built bits");
  check(keys, torch::kInt64, "keys");
  check(clocks, torch::kInt64, "clocks");
  check(state, torch::kFloat32, "state");
  check(init, torch::kFloat32, "initial state");
  TORCH_CHECK(sent.dim() == 2, "sent rows: expected (k, D), got ", sent.sizes());
  const int64_t n = keys.numel(), k = sent.size(0), D = sent.size(1), W = init.numel();
  TORCH_CHECK(bits.numel() == (n + 7) / 8, "built bits: expected ", (n + 7) / 8, " bytes for ", n, " rows, got ",
              bits.numel());
  TORCH_CHECK(clocks.numel() == k, "clocks: expected one for each of the ", k, " rows sent, got ", clocks.numel());
  TORCH_CHECK(W == 0 || (state.dim() == 2 && state.size(0) == k && state.size(1) == W), "state: expected (", k,
              ", ", W, "), got ", state.sizes());
  const uint8_t* bt = bits.data_ptr<uint8_t>();
  int64_t marked = 0;
  for (int64_t i = 0; i < n; ++i) marked += (bt[i >> 3] >> (i & 7)) & 1;
  TORCH_CHECK(marked == n - k, "built bits: expected ", n - k, " rows marked, got ", marked);
  auto rows_t = torch::empty({n, D}, sent.options());
  auto clocks_t = torch::empty({n}, clocks.options());
  auto state_t = torch::empty({n, W}, sent.options());
  const int64_t* ky = keys.data_ptr<int64_t>();
  const int64_t* ck = clocks.data_ptr<int64_t>();
  const float* src = sent.data_ptr<float>();
  const float* st = W ? state.data_ptr<float>() : nullptr;
  const float* in = W ? init.data_ptr<float>() : nullptr;
  float* o = rows_t.data_ptr<float>();
  int64_t* oc = clocks_t.data_ptr<int64_t>();
  float* os = state_t.data_ptr<float>();
  for (int64_t i = 0, a = 0; i < n; ++i) {
    if ((bt[i >> 3] >> (i & 7)) & 1) {
      initial_row(initial_counter(ky[i], D), D, uint64_t(salt), scale, o + i * D);
      oc[i] = 0;
      if (W) std::copy(in, in + W, os + i * W);
    } else {
      std::memcpy(o + i * D, src + a * D, D * sizeof(float));
      oc[i] = ck[a];
      if (W) std::copy(st + a * W, st + (a + 1) * W, os + i * W);
      ++a;
    }
  }
  return {rows_t, clocks_t, state_t};
}

// EmbeddingCache.announce: the slots holding `keys` (a step announced as number `number`) will
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

// het.cache.lookahead.Lookahead's index, kept up to date one step at a time instead of rebuilt:
// per key, the numbers of the announced steps that hold it, oldest first (a linked list in a
// pool), in an open-addressing table (linear probing, deletion by backward shift). Steps leave
// in announcement order (looked up, or dropped as too old), so a key's next use is its head.
class Window {
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "het's native core: the worker cache's step in one pass over the keys";
  m.attr("SOURCE_HASH") = HET_SOURCE_HASH;
  m.def("cache_sets", &cache_sets);
  m.def("cache_lookup", &cache_lookup);
  m.def("cache_fill", &cache_fill);
  m.def("cache_update", &cache_update);
  m.def("initial_rows", &initial_rows);
  m.def("lazy_reply", &lazy_reply);
  m.def("unique_inverse", &unique_inverse);
  m.def("table_push", &table_push);
  m.def("gather_rows", &gather_rows);
  m.def("gather_touched", &gather_touched);
  m.def("cache_soon", &cache_soon);
  m.def("all_finite", &all_finite_op);
  pybind11::class_<Window>(m, "Window")
      .def(pybind11::init<>())
      .def("announce", &Window::announce)
      .def("forget", &Window::forget)
      .def("next_use", &Window::next_use)
      .def("clear", &Window::clear)
      .def("__len__", &Window::size);
}
