// Rows stored in half precision (het/ps/halves.py): float32 values rounded to float16 or
// bfloat16, to nearest or stochastically, in one pass; the same bits as the reference's torch
// ops (each float computed with the same operation in the same order).
#include "common.h"
#include "ops.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

namespace {

constexpr int64_t kField = int64_t(0x9E3779B97F4A7C15ULL);  // halves._FIELD
constexpr uint64_t kM1 = 0xBF58476D1CE4E5B9ULL, kM2 = 0x94D049BB133111EBULL;  // partition.mix

// het.ps.partition.mix: splitmix64's finaliser, wrapping products, logical shifts.
inline uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= kM1;
  x ^= x >> 27;
  x *= kM2;
  x ^= x >> 31;
  return x;
}

inline uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

inline float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// halves._stochastic of one value with its 16 random bits r: the float32 value it rounds to,
// which the dtype holds exactly.
template <typename H>
inline float stochastic(float x, uint32_t r) {
  const uint32_t b = bits_of(x);
  if constexpr (std::is_same_v<H, c10::BFloat16>) {
    return float_of((b + r) & ~0xFFFFu);
  } else {
    if (std::fabs(x) < 0x1p-14f) {  // float16's subnormals: steps of 2^-24
      const double scaled = double(x) * 0x1p24, low = std::floor(scaled);
      return float((low + double(double(r) / 65536.0 < scaled - low)) * 0x1p-24);
    }
    return float_of((b + (r & 0x1FFFu)) & ~0x1FFFu);
  }
}

template <typename H>
int64_t round_all(const float* v, uint16_t* out, const int64_t* salt, int64_t n, int64_t D, bool stochastic_) {
  int64_t bad = -1;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t base = stochastic_ ? uint64_t(salt[i]) * uint64_t(kField) : 0;  // the int64 product, wrapped
    uint64_t u = 0;
    for (int64_t c = 0; c < D; ++c) {
      const float x = v[i * D + c];
      float y = x;
      if (stochastic_) {
        if (c % 4 == 0) u = mix(base + uint64_t(c / 4));
        y = stochastic<H>(x, uint32_t(u >> (16 * (c % 4))) & 0xFFFFu);
      }
      const H h(y);  // exact for a stochastically rounded value; else to nearest, ties to even
      if (bad < 0 && std::isinf(float(h)) && std::isfinite(x)) bad = i * D + c;
      out[i * D + c] = h.x;
    }
  }
  return bad;
}

}  // namespace

// values (n, D) float32 into out (n, D) float16 or bfloat16; `salts` (n,) int64 with
// `stochastic`. Returns -1, or the flat index of a finite value the dtype cannot hold (out is
// then written still: the caller refuses the push and writes nothing of it).
int64_t round_rows(torch::Tensor values, torch::Tensor out, torch::Tensor salts, bool stochastic) {
  check(values, torch::kFloat32, "values");
  check(out, out.scalar_type(), "out");
  TORCH_CHECK(out.scalar_type() == torch::kHalf || out.scalar_type() == torch::kBFloat16,
              "out: expected float16 or bfloat16, got ", out.scalar_type());
  TORCH_CHECK(values.dim() == 2 && out.sizes() == values.sizes(), "out: expected ", values.sizes(), ", got ",
              out.sizes());
  const int64_t n = values.size(0), D = values.size(1);
  const int64_t* s = nullptr;
  if (stochastic) {
    check(salts, torch::kInt64, "salts");
    TORCH_CHECK(salts.numel() == n, "salts: expected ", n, ", got ", salts.numel());
    s = salts.data_ptr<int64_t>();
  }
  auto* o = static_cast<uint16_t*>(out.data_ptr());
  return out.scalar_type() == torch::kHalf ? round_all<c10::Half>(values.data_ptr<float>(), o, s, n, D, stochastic)
                                           : round_all<c10::BFloat16>(values.data_ptr<float>(), o, s, n, D, stochastic);
}
