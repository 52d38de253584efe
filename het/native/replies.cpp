// A reply's rows on the shard (het/ps/server/store/kernels.py's NativeReplies): a fixed table's rows
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

// The rows `from` of `weight` copied whole, in order, the rows ahead prefetched, into `out`'s
// first rows (at least as many of dim D: a reused reply buffer), or into a new tensor when `out`
// is empty; the rows written.
static torch::Tensor gather_into(const torch::Tensor& weight, const std::vector<int64_t>& from, torch::Tensor out) {
  const int64_t sent = int64_t(from.size()), D = weight.size(1);
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
  for (int64_t j = 0; j < sent; ++j) {
    if (j + kAhead < sent) prefetch(w + from[j + kAhead] * D, D * 4, false);
    std::copy(w + from[j] * D, w + (from[j] + 1) * D, o + j * D);
  }
  return out;
}

// A lazy reply's rows (het.ps.server.store.fixed.FixedRows.rows_to_send): the rows idx whose `touched` mark
// is set, in order, and `built` (n,) uint8, 1 where a row was left for the client to build.
// The rows go into `out`'s first rows (at least n of dim D: a reused reply buffer), or into a new
// tensor when `out` is empty; the rows written are returned.
std::vector<torch::Tensor> gather_touched(torch::Tensor weight, torch::Tensor touched, torch::Tensor idx,
                                          torch::Tensor out) {
  check(weight, torch::kFloat32, "weight");
  check(touched, torch::kBool, "touched");
  check(idx, torch::kInt64, "idx");
  const int64_t n = idx.numel(), rows = weight.size(0);
  TORCH_CHECK(touched.numel() == rows, "touched: expected ", rows, " marks, got ", touched.numel());
  const int64_t* k = idx.data_ptr<int64_t>();
  const bool* tc = touched.data_ptr<bool>();
  auto built_t = torch::empty({n}, idx.options().dtype(torch::kUInt8));
  uint8_t* built = built_t.data_ptr<uint8_t>();
  std::vector<int64_t> from;
  from.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(k[i] >= 0 && k[i] < rows, "row ", k[i], " out of range [0, ", rows, ")");
    built[i] = !tc[k[i]];
    if (!built[i]) from.push_back(k[i]);
  }
  return {gather_into(weight, from, out), built_t};
}

// A lazy pull's whole reply from a fixed float32 table, in one pass over its keys
// (het.ps.server.store.fixed.FixedRows.pull_reply): the rows idx whose `touched` mark is set, gathered as
// gather_touched gathers them; their clocks in the narrowest of uint8, int16, int32 and int64 that
// holds them all (het.ps.protocol.integers.narrow); and the built marks a bit a row, the first row's
// in the lowest bit (het.ps.protocol.messages.pack_marks).
std::vector<torch::Tensor> pull_touched(torch::Tensor weight, torch::Tensor touched, torch::Tensor clocks,
                                        torch::Tensor idx, torch::Tensor out) {
  check(weight, torch::kFloat32, "weight");
  check(touched, torch::kBool, "touched");
  check(clocks, torch::kInt64, "clocks");
  check(idx, torch::kInt64, "idx");
  const int64_t n = idx.numel(), rows = weight.size(0);
  TORCH_CHECK(touched.numel() == rows && clocks.numel() == rows, "touched, clocks: expected ", rows,
              " each, got ", touched.numel(), ", ", clocks.numel());
  const int64_t* k = idx.data_ptr<int64_t>();
  const bool* tc = touched.data_ptr<bool>();
  const int64_t* c = clocks.data_ptr<int64_t>();
  auto packed = torch::zeros({(n + 7) / 8}, idx.options().dtype(torch::kUInt8));
  uint8_t* marks = packed.data_ptr<uint8_t>();
  std::vector<int64_t> from;
  from.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(k[i] >= 0 && k[i] < rows, "row ", k[i], " out of range [0, ", rows, ")");
    if (i + kAhead < n && k[i + kAhead] >= 0 && k[i + kAhead] < rows) {
      __builtin_prefetch(tc + k[i + kAhead], 0, 3);
      __builtin_prefetch(c + k[i + kAhead], 0, 3);
    }
    if (tc[k[i]]) from.push_back(k[i]);
    else marks[i >> 3] |= uint8_t(1u << (i & 7));
  }
  const int64_t sent = int64_t(from.size());
  int64_t lo = 0, hi = 0;
  std::vector<int64_t> sent_clocks(size_t(sent), 0);
  for (int64_t j = 0; j < sent; ++j) {
    sent_clocks[j] = c[from[j]];
    lo = j ? std::min(lo, sent_clocks[j]) : sent_clocks[j];
    hi = j ? std::max(hi, sent_clocks[j]) : sent_clocks[j];
  }
  const auto type = lo >= 0 && hi <= 255 ? torch::kUInt8
                    : lo >= -32768 && hi <= 32767 ? torch::kInt16
                    : lo >= -(int64_t(1) << 31) && hi < (int64_t(1) << 31) ? torch::kInt32 : torch::kInt64;
  auto clocks_out = torch::from_blob(sent_clocks.data(), {sent}, idx.options()).to(type, false, true);
  return {gather_into(weight, from, out), clocks_out, packed};
}
