// Initial rows (het/ps/protocol/initial.py) and a lazy reply's rows, clocks and state put together on
// the client (het/ps/client/replies.py).
#include "common.h"
#include "ops.h"

// het.ps.protocol.initial.initial_rows after its counters: row i, column c is splitmix64 of
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

// het.ps.protocol.initial.initial_counters of one key: the key itself, or where key * dim wraps (a negative
// key, or one at or past 2^64 / dim), splitmix64's finaliser of it (het.ps.protocol.partition.mix).
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

// het.ps.client.replies: one shard's lazy reply, its rows, clocks and optimizer state put together in one
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
