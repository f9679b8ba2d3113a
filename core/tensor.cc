#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace moeserve {

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  for (int64_t d : shape_) MS_CHECK(d >= 0, "negative tensor dimension in shape {}", shape_str(shape_));
  const size_t bytes = std::max<size_t>(nbytes(), 1);
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  storage_ = std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

float* Tensor::f32() {
  MS_CHECK(dtype_ == DType::F32, "tensor is {}, not F32", dtype_name(dtype_));
  return static_cast<float*>(raw());
}
const float* Tensor::f32() const { return const_cast<Tensor*>(this)->f32(); }
int32_t* Tensor::i32() {
  MS_CHECK(dtype_ == DType::I32, "tensor is {}, not I32", dtype_name(dtype_));
  return static_cast<int32_t*>(raw());
}
const int32_t* Tensor::i32() const { return const_cast<Tensor*>(this)->i32(); }

Tensor Tensor::reshaped(Shape shape) const {
  MS_CHECK(shape_numel(shape) == numel(), "cannot reshape {} to {}", shape_str(shape_), shape_str(shape));
  Tensor out = *this;
  out.shape_ = std::move(shape);
  return out;
}

}  // namespace moeserve
