// A request's keys routed to the shards, and the shards' reply rows put back in the keys' order, on
// the client (het/ps/protocol/partition.py's split, het/ps/client/replies.py's merge): each in one pass over
// the keys, where torch's ops take a sort and an indexed assignment.
#include "common.h"
#include "ops.h"

// The positions of `values` grouped by `values mod shards` (the floor's remainder, as
// torch.remainder takes it), each group in the values' order: a stable counting sort. Returns the
// positions (n,) and how many go to each shard (shards,).
std::vector<torch::Tensor> shard_order(torch::Tensor values, int64_t shards) {
  check(values, torch::kInt64, "values");
  TORCH_CHECK(shards >= 1, "shards: expected at least 1, got ", shards);
  const int64_t n = values.numel();
  const int64_t* v = values.data_ptr<int64_t>();
  thread_local std::vector<int64_t> of;
  if (of.size() < size_t(n)) of.resize(size_t(n));
  auto counts = torch::zeros({shards}, torch::kInt64);
  int64_t* c = counts.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t s = v[i] % shards;
    s += s < 0 ? shards : 0;
    of[size_t(i)] = s;
    ++c[s];
  }
  std::vector<int64_t> next(size_t(shards), 0);
  for (int64_t s = 1; s < shards; ++s) next[size_t(s)] = next[size_t(s - 1)] + c[s - 1];
  auto order = torch::empty({n}, torch::kInt64);
  int64_t* o = order.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) o[next[size_t(of[size_t(i)])]++] = i;
  return {order, counts};
}

// out[idx[i]] = src[i] for each row i of `src` (k, D): a shard's reply rows put at their keys'
// positions in the result `out` (n, D), the rows kAhead ahead prefetched for writing. Every
// index is checked against out's rows first.
void scatter_rows(torch::Tensor src, torch::Tensor idx, torch::Tensor out) {
  check(src, torch::kFloat32, "src");
  check(idx, torch::kInt64, "idx");
  check(out, torch::kFloat32, "out");
  const int64_t k = idx.numel(), n = out.size(0), D = out.dim() == 2 ? out.size(1) : -1;
  TORCH_CHECK(out.dim() == 2 && src.dim() == 2 && src.size(0) == k && src.size(1) == D, "src: expected (", k, ", ",
              D, "), got ", src.sizes());
  const int64_t* p = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < k; ++i) TORCH_CHECK(p[i] >= 0 && p[i] < n, "row ", p[i], " out of range [0, ", n, ")");
  const float* s = src.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < k; ++i) {
    if (i + kAhead < k) prefetch(o + p[i + kAhead] * D, D * 4, true);
    std::copy(s + i * D, s + (i + 1) * D, o + p[i] * D);
  }
}
