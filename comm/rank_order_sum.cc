#include "comm/rank_order_sum.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace moeserve::comm {

namespace {

// out[i] = (((in[0][i] + in[1][i]) + in[2][i]) + ...) for i in [0, count): every rank runs
// the same loop on the same inputs, so every rank gets the same bits.
template <typename T>
void sum_rank_order(const std::vector<const void*>& inputs, size_t offset, size_t count, void* out) {
  T* dst = static_cast<T*>(out);
  const T* first = static_cast<const T*>(inputs[0]) + offset;
  std::copy(first, first + count, dst);
  for (size_t r = 1; r < inputs.size(); ++r) {
    const T* src = static_cast<const T*>(inputs[r]) + offset;
    for (size_t i = 0; i < count; ++i) dst[i] += src[i];
  }
}

void sum_rank_order_bf16(const std::vector<const void*>& inputs, size_t offset, size_t count, void* out) {
  // Accumulate in fp32 in rank order, round once (what NCCL's bf16 ring does per hop differs;
  // this is the reference).
  std::vector<float> acc(count, 0.0f);
  for (const void* input : inputs) {
    const uint16_t* src = static_cast<const uint16_t*>(input) + offset;
    for (size_t i = 0; i < count; ++i) acc[i] += bf16_to_f32(src[i]);
  }
  uint16_t* dst = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < count; ++i) dst[i] = f32_to_bf16(acc[i]);
}

}  // namespace

bool summable(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64 || dtype == DType::I32 || dtype == DType::I64 ||
         dtype == DType::BF16;
}

void sum_inputs(DType dtype, const std::vector<const void*>& inputs, size_t offset, size_t count, void* out,
                const std::string& group) {
  switch (dtype) {
    case DType::F32:
      return sum_rank_order<float>(inputs, offset, count, out);
    case DType::F64:
      return sum_rank_order<double>(inputs, offset, count, out);
    case DType::I32:
      return sum_rank_order<int32_t>(inputs, offset, count, out);
    case DType::I64:
      return sum_rank_order<int64_t>(inputs, offset, count, out);
    case DType::BF16:
      return sum_rank_order_bf16(inputs, offset, count, out);
    default:
      fail("group '{}': cannot sum {} values", group, dtype_name(dtype));
  }
}

}  // namespace moeserve::comm
