// A dynamic table's storage in chunks (het/ps/server/store/chunks.py): a gather and a scatter of slots
// in one pass over them, whatever chunk each slot is in, for rows of any width and element type.
// Python would group the slots by chunk first (a binary search and a filter a chunk); here a
// slot's chunk is a few bit operations (het_push::ChunkStore::locate) and the rows ahead are
// prefetched, as a gather of random rows waits on their latency.
#include "ops.h"
#include "common.h"
#include "push_store.h"

namespace {

struct Parts {
  std::vector<char*> base;
  het_push::ChunkStore at;  // only its locate(): first chunk 2^bits slots, doubling or fixed
  int64_t row_bytes = 0, capacity = 0;
};

// The chunks' pointers, checked: each of the expected size, one width and `type` as `like`.
Parts parts_of(const std::vector<torch::Tensor>& parts, int64_t bits, bool fixed, const torch::Tensor& like) {
  TORCH_CHECK(!parts.empty(), "chunks: expected at least one chunk");
  TORCH_CHECK(bits >= 0 && bits < 40, "chunks: first chunk of 2^", bits, " slots is out of range");
  Parts p;
  p.at.bits = bits, p.at.fixed = fixed;
  const int64_t width = parts[0].size(1);
  for (size_t c = 0; c < parts.size(); ++c) {
    check(parts[c], like.scalar_type(), "chunk");
    const int64_t expected = int64_t(1) << (bits + ((fixed || c == 0) ? 0 : int64_t(c) - 1));
    TORCH_CHECK(parts[c].dim() == 2 && parts[c].size(0) == expected && parts[c].size(1) == width, "chunk ", c,
                ": expected (", expected, ", ", width, "), got ", parts[c].sizes());
    p.base.push_back(static_cast<char*>(parts[c].data_ptr()));
    p.capacity += expected;
  }
  p.row_bytes = width * parts[0].element_size();
  TORCH_CHECK(like.dim() == 2 && like.size(1) == width, "rows: expected (n, ", width, "), got ", like.sizes());
  return p;
}

// The slots, checked: one a row of `rows` (contiguous, of the chunks' type), each in [low, capacity).
const int64_t* checked_slots(const torch::Tensor& slots, const torch::Tensor& rows, const Parts& p, int64_t low) {
  check(slots, torch::kInt64, "slots");
  check(rows, rows.scalar_type(), "rows");
  const int64_t n = slots.numel();
  TORCH_CHECK(rows.size(0) == n, "rows: expected ", n, ", got ", rows.size(0));
  const int64_t* s = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(s[i] >= low && s[i] < p.capacity, "slot ", s[i], " out of range [", low, ", ", p.capacity, ")");
  return s;
}

inline char* slot_ptr(const Parts& p, int64_t slot) {
  auto [c, o] = p.at.locate(slot);
  return p.base[c] + o * p.row_bytes;
}

// out[i] = the row at s[i] (zeros where it is -1), rows of Bytes (0: p.row_bytes).
template <int64_t Bytes>
void gather_each(const Parts& p, const int64_t* s, int64_t n, char* o) {
  const int64_t B = Bytes ? Bytes : p.row_bytes;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && s[i + kAhead] >= 0) prefetch(slot_ptr(p, s[i + kAhead]), B, false);
    if (s[i] >= 0) std::memcpy(o + i * B, slot_ptr(p, s[i]), size_t(B));
    else std::memset(o + i * B, 0, size_t(B));
  }
}

}  // namespace

// out[i] = the row at slots[i]; with `missing`, a row of zeros where slots[i] is -1 (a key not
// stored), which is otherwise out of range.
void chunk_gather(std::vector<torch::Tensor> parts, int64_t bits, bool fixed, torch::Tensor slots,
                  torch::Tensor out, bool missing) {
  const Parts p = parts_of(parts, bits, fixed, out);
  const int64_t n = slots.numel();
  const int64_t* s = checked_slots(slots, out, p, missing ? -1 : 0);
  char* o = static_cast<char*>(out.data_ptr());
  // a row of a known small size copies as one load and store (meta: 8 or 16 bytes a slot)
  switch (p.row_bytes) {
    case 8: return gather_each<8>(p, s, n, o);
    case 16: return gather_each<16>(p, s, n, o);
    default: return gather_each<0>(p, s, n, o);
  }
}

// The row at slots[i] = rows[i] (slots unique and stored: each in [0, capacity)).
void chunk_scatter(std::vector<torch::Tensor> parts, int64_t bits, bool fixed, torch::Tensor slots,
                   torch::Tensor rows) {
  const Parts p = parts_of(parts, bits, fixed, rows);
  const int64_t n = slots.numel();
  const int64_t* s = checked_slots(slots, rows, p, 0);
  const char* r = static_cast<const char*>(rows.data_ptr());
  const int64_t B = p.row_bytes;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch(slot_ptr(p, s[i + kAhead]), B, true);
    std::memcpy(slot_ptr(p, s[i]), r + i * B, size_t(B));
  }
}
