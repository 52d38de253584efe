// A step's unique keys and inverse (het/native/__init__.py's unique_inverse).
#include "common.h"
#include "ops.h"

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
