// Host tensors: an owning, 64-byte aligned buffer with a dtype and a row-major shape.
// Ops take raw pointers (see ops/ops.h); Tensor only owns and describes memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace moeserve {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  // Zero-initialised.
  Tensor(DType dtype, Shape shape);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool empty() const { return storage_ == nullptr; }

  void* raw() { return storage_.get(); }
  const void* raw() const { return storage_.get(); }
  float* f32();
  const float* f32() const;
  int32_t* i32();
  const int32_t* i32() const;

  // Same storage, new shape with the same element count.
  Tensor reshaped(Shape shape) const;

 private:
  DType dtype_ = DType::F32;
  Shape shape_;
  std::shared_ptr<std::byte> storage_;
};

}  // namespace moeserve
