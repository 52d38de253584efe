// Rows stored in half precision (het/ps/protocol/halves.py, halves.h): float32 values rounded to float16
// or bfloat16 in one pass.
#include "common.h"
#include "halves.h"
#include "ops.h"

// The value the last half push of the calling thread refused (102): halves.refuse names it.
double refused_value() { return het_halves::refused; }

// values (n, D) float32 into out (n, D) float16 or bfloat16; `salts` (n,) int64 with
// `stochastic`. Returns -1, or the flat index of a finite value the dtype cannot hold (out is
// then written still: the caller refuses the push and writes nothing of it).
int64_t round_rows(torch::Tensor values, torch::Tensor out, torch::Tensor salts, bool stochastic) {
  check(values, torch::kFloat32, "values");
  check(out, out.scalar_type(), "out");
  const bool half = out.scalar_type() == torch::kHalf;
  TORCH_CHECK(half || out.scalar_type() == torch::kBFloat16, "out: expected float16 or bfloat16, got ",
              out.scalar_type());
  TORCH_CHECK(values.dim() == 2 && out.sizes() == values.sizes(), "out: expected ", values.sizes(), ", got ",
              out.sizes());
  const int64_t n = values.size(0), D = values.size(1);
  const int64_t* s = nullptr;
  if (stochastic) {
    check(salts, torch::kInt64, "salts");
    TORCH_CHECK(salts.numel() == n, "salts: expected ", n, ", got ", salts.numel());
    s = salts.data_ptr<int64_t>();
  }
  const float* v = values.data_ptr<float>();
  auto* o = static_cast<uint16_t*>(out.data_ptr());
  int64_t bad = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t salt = stochastic ? s[i] : 0;
    const int64_t c = half ? het_halves::round_row<c10::Half>(v + i * D, o + i * D, salt, D, stochastic)
                           : het_halves::round_row<c10::BFloat16>(v + i * D, o + i * D, salt, D, stochastic);
    if (bad < 0 && c >= 0) bad = i * D + c;
  }
  return bad;
}
