// What every part of het's native core shares: the includes, argument checks and prefetching.
//
// het's native core (the other files here) runs the hot paths in one pass over the keys where
// the PyTorch reference (het/cache/torch_step.py, het/ps/server/store/kernels.py, het/ps/protocol/initial.py,
// het/ps/client/replies.py) needs dozens of small tensor ops. Same results, bit for bit: every float
// is computed with the same operations in the same order as the reference (compiled with
// -ffp-contract=off: a multiply-add is fused only where torch's kernel fuses it, and square roots
// are torch's own). CPU tensors only; functions update the tensors they are given in place.
#pragma once

#include <ATen/Parallel.h>
#include <torch/types.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

constexpr int64_t kGrain = 4096;  // keys per task of the thread pool
constexpr int64_t kAhead = 6;     // keys ahead whose rows are prefetched: random rows are the cost

inline void check(const torch::Tensor& t, torch::ScalarType type, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, ": expected a CPU tensor, got one on ", t.device());
  TORCH_CHECK(t.scalar_type() == type, name, ": expected ", type, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, ": expected a contiguous tensor");
}

inline void prefetch(const void* p, int64_t bytes, bool write) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) {
    if (write) __builtin_prefetch(c + b, 1, 3);
    else __builtin_prefetch(c + b, 0, 3);
  }
}
