// The worker cache's fill and update (het/cache/torch_step.py's fill and update).
#include "adagrad.h"
#include "ops.h"

// TorchStep.fill: take the rows the PS sent for keys[index]; a stale hit's row is the
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

// TorchStep.update: apply one step's gradients to the cached rows (row -= local_lr * g, or
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
  const int64_t Q = sq.dim() == 2 ? sq.size(1) : 0;  // squares: beside the accumulator, or a row's alone (Adam)
  TORCH_CHECK(sq.sizes() == acc.sizes() || (W == 0 && Q == 1 && sq.size(0) == rows.size(0)),
              "sq: expected the shape of acc, ", acc.sizes(), ", or (", rows.size(0), ", 1), got ", sq.sizes());
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
  float* q = Q ? sq.data_ptr<float>() : nullptr;
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
        if (Q) q[t] += sum_squares(gi, D) / float(D);  // Adam's: pushed with the row
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
  auto out_sq = torch::zeros({due + gone, Q}, grads.options());
  int64_t* ok = out_keys.data_ptr<int64_t>();
  float* og = out_grads.data_ptr<float>();
  int64_t* oc = out_counts.data_ptr<int64_t>();
  float* osq = Q ? out_sq.data_ptr<float>() : nullptr;
  int64_t a = 0, b = due;  // rows taken first, then the gradients of keys without a slot
  for (int64_t i = 0; i < n; ++i) {
    if (!live[i]) {
      ok[b] = k[i];
      oc[b] = 1;
      std::copy(g + i * D, g + (i + 1) * D, og + b * D);
      if (W) follow.add_squares(osq + b * W, g + i * D);
      else if (Q) osq[b] = sum_squares(g + i * D, D) / float(D);
      ++b;
      continue;
    }
    const int64_t t = sl[i];
    if (!(double(u[t]) > bound)) continue;
    ok[a] = tk[t];
    oc[a] = u[t];
    if (Q) {  // the squares travel with the push; an accumulator is as the server's will be
      for (int64_t w = 0; w < W; ++w) ac[t * W + w] += q[t * W + w];
      std::copy(q + t * Q, q + (t + 1) * Q, osq + a * Q);
      std::fill(q + t * Q, q + (t + 1) * Q, 0.0f);
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
