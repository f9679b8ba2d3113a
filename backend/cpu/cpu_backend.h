// The fp32 CPU reference backend: every op of ops/ops.h, multi-threaded over the global
// ThreadPool, with a fixed summation order so results do not depend on the thread count.
#pragma once

#include <memory>

#include "backend/cpu/sampling.h"
#include "ops/ops.h"

namespace moeserve::cpu {

std::unique_ptr<ops::Backend> make_cpu_backend();

// Shared helpers, also used by tests.
float dot(const float* a, const float* b, int64_t n);

}  // namespace moeserve::cpu
