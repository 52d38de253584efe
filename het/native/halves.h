// Rows stored in half precision (het/ps/halves.py): float32 values rounded to float16 or
// bfloat16, to nearest or stochastically; the same bits as the reference's torch ops (each
// float computed with the same operation in the same order). halves.cpp binds a pass over
// rows; table.cpp's push rounds the rows it wrote with it.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace het_halves {

constexpr uint64_t kField = 0x9E3779B97F4A7C15ULL;  // halves._FIELD
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

// halves.salts: a row's salt from its key and its clock after the push.
inline int64_t salt_of(int64_t key, int64_t clock) {
  return int64_t(mix(uint64_t(key) * kField + uint64_t(clock)));
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

// One row of D values into out; `salt` used when stochastic. Returns -1, or the column of a
// finite value the dtype cannot hold (float16 past 65504).
template <typename H>
inline int64_t round_row(const float* v, uint16_t* out, int64_t salt, int64_t D, bool stochastic_) {
  int64_t bad = -1;
  const uint64_t base = stochastic_ ? uint64_t(salt) * kField : 0;  // the int64 product, wrapped
  uint64_t u = 0;
  for (int64_t c = 0; c < D; ++c) {
    const float x = v[c];
    float y = x;
    if (stochastic_) {
      if (c % 4 == 0) u = mix(base + uint64_t(c / 4));
      y = stochastic<H>(x, uint32_t(u >> (16 * (c % 4))) & 0xFFFFu);
    }
    const H h(y);  // exact for a stochastically rounded value; else to nearest, ties to even
    if (bad < 0 && std::isinf(float(h)) && std::isfinite(x)) bad = c;
    out[c] = h.x;
  }
  return bad;
}

template <typename H>
inline float widen(uint16_t bits) {
  return float(H(bits, typename H::from_bits_t{}));
}

}  // namespace het_halves
