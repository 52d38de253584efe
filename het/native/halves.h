// Rows stored in half precision (het/ps/protocol/halves.py): float32 values rounded to float16 or
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
#include <vector>

#ifdef __F16C__
#include <immintrin.h>
#endif

namespace het_halves {

constexpr uint64_t kField = 0x9E3779B97F4A7C15ULL;  // halves._FIELD
constexpr uint64_t kM1 = 0xBF58476D1CE4E5B9ULL, kM2 = 0x94D049BB133111EBULL;  // partition.mix

// het.ps.protocol.partition.mix: splitmix64's finaliser, wrapping products, logical shifts.
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

// The value a half push of this thread last refused (102) because its dtype cannot hold it: in
// the row of the least key, as the reference names it (halves.refuse).
inline thread_local float refused = 0.0f;

// Each of D columns' 16 random bits: column c takes the (c % 4)-th quarter, lowest first, of
// mix(base + c / 4) (halves._stochastic), so the words read as 16-bit values are the columns' bits.
inline void random_bits(uint64_t base, int64_t D, uint16_t* r) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "columns' bits read from words' quarters");
  thread_local std::vector<uint64_t> words;
  const int64_t q = (D + 3) / 4;
  if (words.size() < size_t(q)) words.resize(size_t(q));
  uint64_t* u = words.data();
  for (int64_t k = 0; k < q; ++k) u[k] = mix(base + uint64_t(k));
  std::memcpy(r, u, size_t(D) * 2);
}

// bfloat16's bits of float32 bits b, as c10::BFloat16(float): NaN to 0x7FC0, else to nearest,
// ties to even (exact where b's low 16 bits are 0, as a stochastically rounded value's are).
inline uint16_t bf16_bits(uint32_t b) {
  const bool nan = (b & 0x7FFFFFFFu) > 0x7F800000u;
  return nan ? uint16_t(0x7FC0) : uint16_t((b + (((b >> 16) & 1u) + 0x7FFFu)) >> 16);
}

// One row of D values into out; `salt` used when stochastic. Returns -1, or the column of a
// finite value the dtype cannot hold (float16 past 65504). Whole-row passes the compiler
// vectorises: the random bits, the rounding, the conversion (float16: F16C's, eight at a time,
// where the build has it, the instruction c10::Half's conversion takes one at a time), the check.
template <typename H>
inline int64_t round_row(const float* v, uint16_t* out, int64_t salt, int64_t D, bool stochastic_) {
  constexpr bool bf16 = std::is_same_v<H, c10::BFloat16>;
  thread_local std::vector<uint16_t> rand;
  thread_local std::vector<float> cut;  // float16: the values stochastically rounded, in float32
  if (stochastic_) {
    if (rand.size() < size_t(D)) rand.resize(size_t(D));
    random_bits(uint64_t(salt) * kField, D, rand.data());  // the int64 product, wrapped
  }
  const uint16_t* r = rand.data();
  if constexpr (bf16) {
    if (stochastic_) {
      for (int64_t c = 0; c < D; ++c) out[c] = bf16_bits((bits_of(v[c]) + r[c]) & ~0xFFFFu);
    } else {
      for (int64_t c = 0; c < D; ++c) out[c] = bf16_bits(bits_of(v[c]));
    }
  } else {
    const float* y = v;
    if (stochastic_) {
      if (cut.size() < size_t(D)) cut.resize(size_t(D));
      float* s = cut.data();
      for (int64_t c = 0; c < D; ++c) s[c] = float_of((bits_of(v[c]) + (r[c] & 0x1FFFu)) & ~0x1FFFu);
      for (int64_t c = 0; c < D; ++c) {
        if (std::fabs(v[c]) < 0x1p-14f) s[c] = stochastic<H>(v[c], r[c]);  // subnormals: a rarer path
      }
      y = s;
    }
    int64_t c = 0;
#ifdef __F16C__
    for (; c + 8 <= D; c += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(y + c), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), h);
    }
#endif
    for (; c < D; ++c) out[c] = H(y[c]).x;  // exact for a stochastically rounded value; else to nearest
  }
  constexpr uint16_t kInf = bf16 ? 0x7F80 : 0x7C00;
  uint32_t any = 0;
  for (int64_t c = 0; c < D; ++c) {
    any |= uint32_t((out[c] & 0x7FFFu) == kInf) & uint32_t((bits_of(v[c]) & 0x7F800000u) != 0x7F800000u);
  }
  if (!any) return -1;
  for (int64_t c = 0; c < D; ++c) {
    if ((out[c] & 0x7FFFu) == kInf && std::isfinite(v[c])) return c;
  }
  return -1;
}

template <typename H>
inline float widen(uint16_t bits) {
  return float(H(bits, typename H::from_bits_t{}));
}

// A row of D values widened into out: exact either way (float16: F16C's conversion, eight at a
// time, where the build has it, the instruction c10::Half's takes one at a time).
template <typename H>
inline void widen_row(const uint16_t* bits, float* out, int64_t D) {
  int64_t c = 0;
#ifdef __F16C__
  if constexpr (std::is_same_v<H, c10::Half>) {
    for (; c + 8 <= D; c += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + c));
      _mm256_storeu_ps(out + c, _mm256_cvtph_ps(h));
    }
  }
#endif
  for (; c < D; ++c) out[c] = widen<H>(bits[c]);
}

}  // namespace het_halves
