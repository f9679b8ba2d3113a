// The fp32 CPU reference backend: every op of ops/ops.h, multi-threaded over the global
// ThreadPool, with a fixed summation order so results do not depend on the thread count.
//
// CpuNumerics::kBf16 ("--backend cpu-bf16") is the CUDA backend's numerics on the host: the same
// fp32 arithmetic, but every value the CUDA kernels store in bf16 (weights other than the
// router's, activations, the KV cache, each op's bf16 intermediates: silu(gate), x * rsqrt in
// RMSNorm, each expert's down projection) is rounded to bf16 at the same point. Buffers stay
// fp32. It differs from a GPU only by fp32 summation order and transcendental ulps, so it is
// the tight CPU oracle for the CUDA engine; the plain backend stays the fp32 reference.
#pragma once

#include <memory>

#include "backend/cpu/sampling.h"
#include "ops/ops.h"

namespace moeserve::cpu {

enum class CpuNumerics { kFp32, kBf16 };

std::unique_ptr<ops::Backend> make_cpu_backend(CpuNumerics numerics = CpuNumerics::kFp32);

// Shared helpers, also used by tests.
float dot(const float* a, const float* b, int64_t n);

}  // namespace moeserve::cpu
