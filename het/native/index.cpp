// An export's dynamic-table key index (het/export/index.py): each key's row, from its
// splitmix64 hash's bucket in a directory and a search of that bucket's few hashes.
//
// Three stages a few keys apart, so that the random reads of a memory-mapped index overlap: hash
// the key and prefetch its directory entry; read the bucket's bounds and prefetch its hashes;
// search them. The same result as the NumPy reference (HashIndex.lookup), key for key.
#include "common.h"
#include "ops.h"

namespace {

inline uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

template <typename Dir>
void lookup(const uint64_t* hashes, int64_t n, const Dir* dir, int64_t bits, const int64_t* keys, int64_t m,
            int64_t* out) {
  constexpr int64_t kStage = 8;  // keys between one stage and the next
  std::vector<uint64_t> h(m);
  std::vector<int64_t> lo(m), hi(m);
  const int shift = 64 - static_cast<int>(bits);
  auto bucket = [&](uint64_t x) -> int64_t { return bits ? static_cast<int64_t>(x >> shift) : 0; };
  for (int64_t i = 0; i < m + 2 * kStage; ++i) {
    if (i < m) {  // stage 1: the hash, and its directory entry on its way
      h[i] = splitmix64(static_cast<uint64_t>(keys[i]));
      __builtin_prefetch(dir + bucket(h[i]), 0, 3);
    }
    int64_t j = i - kStage;
    if (j >= 0 && j < m) {  // stage 2: the bucket's bounds, and its hashes on their way
      int64_t b = bucket(h[j]);
      lo[j] = static_cast<int64_t>(dir[b]);
      hi[j] = static_cast<int64_t>(dir[b + 1]);
      if (lo[j] < n) __builtin_prefetch(hashes + lo[j], 0, 3);
    }
    int64_t k = i - 2 * kStage;
    if (k >= 0 && k < m) {  // stage 3: the first hash >= h in [lo, hi)
      int64_t a = lo[k], z = hi[k];
      while (a < z) {
        int64_t mid = (a + z) >> 1;
        if (hashes[mid] < h[k]) a = mid + 1;
        else z = mid;
      }
      out[k] = (a < n && hashes[a] == h[k]) ? a : -1;
    }
  }
}

}  // namespace

torch::Tensor index_lookup(torch::Tensor hashes, torch::Tensor directory, int64_t bits, torch::Tensor keys) {
  check(hashes, torch::kInt64, "hashes");
  check(keys, torch::kInt64, "keys");
  TORCH_CHECK(bits >= 0 && bits < 64, "bits: expected 0..63, got ", bits);
  TORCH_CHECK(directory.dim() == 1 && directory.numel() == (int64_t{1} << bits) + 1,
              "directory: expected 2^bits + 1 entries, got ", directory.numel());
  auto out = torch::empty({keys.numel()}, torch::kInt64);
  const auto* h = reinterpret_cast<const uint64_t*>(hashes.data_ptr<int64_t>());
  if (directory.scalar_type() == torch::kInt32) {  // uint32 entries, seen as int32
    check(directory, torch::kInt32, "directory");
    lookup(h, hashes.numel(), reinterpret_cast<const uint32_t*>(directory.data_ptr<int32_t>()), bits,
           keys.data_ptr<int64_t>(), keys.numel(), out.data_ptr<int64_t>());
  } else {
    check(directory, torch::kInt64, "directory");
    lookup(h, hashes.numel(), directory.data_ptr<int64_t>(), bits, keys.data_ptr<int64_t>(), keys.numel(),
           out.data_ptr<int64_t>());
  }
  return out;
}
