// A reply's rows on the shard (het/ps/store/kernels.py's NativeReplies): a fixed table's rows
// gathered whole, the rows ahead prefetched, into reused buffers.
#include "common.h"
#include "ops.h"

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

// A lazy reply's rows (het.ps.store.fixed.FixedRows.rows_to_send): the rows idx whose `touched` mark
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
