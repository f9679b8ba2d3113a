// Safetensors checkpoints, memory-mapped: one file, or shards listed by
// model.safetensors.index.json. Every structural problem is an error naming the file and
// the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace moeserve {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  size_t data_begin = 0;  // byte offset in the file's data section
  size_t data_end = 0;
};

// One .safetensors file, mapped read-only for its lifetime.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::byte* data(const TensorInfo& info) const { return data_ + info.data_begin; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  const std::byte* data_ = nullptr;
  std::map<std::string, TensorInfo> tensors_;
};

// A half-open index range; `end == -1` means "to the end of the dimension".
struct Slice {
  int64_t begin = 0;
  int64_t end = -1;
  static Slice all() { return {}; }
};

// A model directory's weights. Reads convert to fp32 and can take a row/column slice of a
// 2-D tensor so that a rank only ever touches the bytes it owns.
class Checkpoint {
 public:
  static std::unique_ptr<Checkpoint> open(const std::string& directory);

  const std::string& directory() const { return directory_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;
  std::vector<std::string> tensor_names() const;
  // The raw bytes of tensor `name` (TensorInfo's dtype and shape, row-major).
  const std::byte* data(const std::string& name) const;

  // Reads rows x cols of tensor `name` (1-D tensors: rows only), checking that the full
  // shape equals `expected_shape`. fp8 and int4-packed weights are refused by name (the
  // config's quantization_config says which weights are packed: model/packed_weights.h).
  Tensor read_f32(const std::string& name, const Shape& expected_shape, Slice rows = Slice::all(),
                  Slice cols = Slice::all()) const;

 private:
  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  std::string directory_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> index_;
};

}  // namespace moeserve
