// A hot request's keys and counts on the shard (het/ps/server/store/fixed.py's FixedRows.wire_pull and
// wire_push), read as they travel in one pass each: what the checked path (het/ps/protocol/checks.py,
// het/ps/protocol/limits.py, het/ps/protocol/partition.py) does in several tensor ops and a copy. Each answers
// only what it proves in range; anything else is None, and the checked path then names what is
// wrong (nothing has changed yet).
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "common.h"

namespace py = pybind11;

namespace {

// The local rows of keys k (K: int32_t or int64_t) on shard `index` of `shards`: k / shards,
// where every key lies in [0, rows) and k % shards == index; else false.
template <typename K>
bool local_rows(const K* k, int64_t n, int64_t rows, int64_t shards, int64_t index, int64_t* out) {
  bool bad = false;
  if (shards == 1) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t key = k[i];
      bad |= key < 0 || key >= rows;
      out[i] = key;
    }
    return !bad;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = k[i];
    bad |= key < 0 || key >= rows || key % shards != index;
    out[i] = key / shards;
  }
  return !bad;
}

// Counts c (C: uint8_t, int16_t, int32_t or int64_t) widened into `out`, where each lies in
// [0, most]; else false.
template <typename C>
bool widen_counts(const C* c, int64_t n, int64_t most, int64_t* out) {
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t count = c[i];
    bad |= count < 0 || count > most;
    out[i] = count;
  }
  return !bad;
}

}  // namespace

// A fixed table's keys as a request carries them (1-D int32 or int64, at least one), as the
// int64 local rows of shard `index` of `shards` (het.ps.protocol.partition.local_rows) of a table of
// `rows` keys; None where any key is out of [0, rows) or another shard's.
py::object wire_rows(torch::Tensor keys, int64_t rows, int64_t shards, int64_t index) {
  TORCH_CHECK(keys.dim() == 1 && keys.is_contiguous() && keys.device().is_cpu(), "keys: expected a 1-D CPU tensor");
  TORCH_CHECK(shards >= 1 && index >= 0 && index < shards, "shard ", index, " of ", shards);
  const int64_t n = keys.numel();
  auto out = torch::empty({n}, keys.options().dtype(torch::kInt64));
  int64_t* o = out.data_ptr<int64_t>();
  bool ok;
  if (keys.scalar_type() == torch::kInt32) ok = local_rows(keys.data_ptr<int32_t>(), n, rows, shards, index, o);
  else if (keys.scalar_type() == torch::kInt64) ok = local_rows(keys.data_ptr<int64_t>(), n, rows, shards, index, o);
  else return py::none();
  if (!ok) return py::none();
  return py::cast(out);
}

// A push's counts as they travel (1-D uint8, int16, int32 or int64) widened to int64
// (het.ps.protocol.integers.widen); None where any lies outside [0, most].
py::object wire_counts(torch::Tensor counts, int64_t most) {
  TORCH_CHECK(counts.dim() == 1 && counts.is_contiguous() && counts.device().is_cpu(),
              "counts: expected a 1-D CPU tensor");
  const int64_t n = counts.numel();
  auto out = torch::empty({n}, counts.options().dtype(torch::kInt64));
  int64_t* o = out.data_ptr<int64_t>();
  bool ok;
  switch (counts.scalar_type()) {
    case torch::kUInt8: ok = widen_counts(counts.data_ptr<uint8_t>(), n, most, o); break;
    case torch::kInt16: ok = widen_counts(counts.data_ptr<int16_t>(), n, most, o); break;
    case torch::kInt32: ok = widen_counts(counts.data_ptr<int32_t>(), n, most, o); break;
    case torch::kInt64: ok = widen_counts(counts.data_ptr<int64_t>(), n, most, o); break;
    default: return py::none();
  }
  if (!ok) return py::none();
  return py::cast(out);
}
