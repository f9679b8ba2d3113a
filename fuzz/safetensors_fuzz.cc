// Fuzz target: a safetensors checkpoint (model/safetensors). The input is model.safetensors, or
// index.json + shards when it has sections (see fuzz_input.h): shard i is "s<i>.safetensors".
// Invariants of an accepted checkpoint: every tensor's bytes lie in its file's data section,
// match dtype x shape, overlap no other tensor's, and read_f32 reads them (ASan checks the reads).
#include <algorithm>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "model/safetensors.h"

namespace {

using moeserve::fuzz::split_sections;

void write_checkpoint(std::string_view input) {
  moeserve::fuzz::clear_scratch_dir();
  const std::vector<std::string_view> parts = split_sections(input);
  if (parts.size() == 1) return moeserve::fuzz::write_scratch_file("model.safetensors", parts[0]);
  moeserve::fuzz::write_scratch_file("model.safetensors.index.json", parts[0]);
  for (size_t i = 1; i < parts.size(); ++i)
    moeserve::fuzz::write_scratch_file("s" + std::to_string(i) + ".safetensors", parts[i]);
}

// Elements of `shape`, or -1 when over `limit` (read_f32 of huge tensors would only cost time).
int64_t elements_up_to(const moeserve::Shape& shape, int64_t limit) {
  int64_t n = 1;
  for (const int64_t d : shape) {
    if (d != 0 && n > limit / d) return -1;
    n *= d;
  }
  return n;
}

void check_tensors(const moeserve::Checkpoint& checkpoint) {
  std::vector<const moeserve::TensorInfo*> by_offset;
  for (const std::string& name : checkpoint.tensor_names()) {
    const moeserve::TensorInfo& info = checkpoint.info(name);
    MS_FUZZ_ASSERT(info.data_begin <= info.data_end, name + ": data_offsets out of order accepted");
    const int64_t elements = elements_up_to(info.shape, int64_t{1} << 20);
    if (elements >= 0)
      MS_FUZZ_ASSERT(
          info.data_end - info.data_begin == static_cast<size_t>(elements) * moeserve::dtype_size(info.dtype),
          name + ": byte count differs from dtype x shape");
    if (info.data_end > info.data_begin) by_offset.push_back(&info);
    if (elements < 0 || elements > (int64_t{1} << 16)) continue;
    try {
      const moeserve::Tensor t = checkpoint.read_f32(name, info.shape);
      MS_FUZZ_ASSERT(t.numel() == elements, name + ": read_f32 returned another element count");
    } catch (const moeserve::Error&) {  // a dtype or rank read_f32 refuses
    }
  }
  // Overlaps only within one file: shards are separate files.
  std::sort(by_offset.begin(), by_offset.end(), [&](const auto* a, const auto* b) {
    return std::pair(checkpoint.file_of(a->name), a->data_begin) <
           std::pair(checkpoint.file_of(b->name), b->data_begin);
  });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (checkpoint.file_of(by_offset[i]->name) == checkpoint.file_of(by_offset[i - 1]->name))
      MS_FUZZ_ASSERT(by_offset[i]->data_begin >= by_offset[i - 1]->data_end,
                     by_offset[i]->name + ": overlapping data_offsets accepted");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_checkpoint(moeserve::fuzz::as_text(data, size));
  std::unique_ptr<moeserve::Checkpoint> checkpoint;
  try {
    checkpoint = moeserve::Checkpoint::open(moeserve::fuzz::scratch_dir());
  } catch (const moeserve::Error&) {
    return 0;
  }
  check_tensors(*checkpoint);
  return 0;
}
