#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace moeserve {

namespace {

using json = nlohmann::json;

// Parses JSON and rejects duplicate keys in the top-level object (a duplicated tensor name
// would otherwise silently shadow the first).
json parse_json_rejecting_duplicate_keys(const std::string& text, const std::string& path) {
  std::set<std::string> top_level_keys;
  int depth = 0;
  std::string duplicate;
  json::parser_callback_t callback = [&](int d, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && d == 1) {
      const std::string key = parsed.get<std::string>();
      if (!top_level_keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    depth = d;
    return true;
  };
  json root;
  try {
    root = json::parse(text, callback);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond double
    fail("{}: invalid safetensors header JSON: {}", path, e.what());
  }
  MS_CHECK(duplicate.empty(), "{}: duplicate tensor '{}' in header", path, duplicate);
  return root;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  MS_CHECK(in.good(), "{}: cannot open", path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

namespace {

// safetensors' own MAX_HEADER_SIZE: a longer header is a corrupt length field.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The bytes a tensor of `shape` and `dtype` takes; an error if the count overflows.
size_t tensor_bytes(const Shape& shape, DType dtype, const std::string& path, const std::string& name) {
  uint64_t bytes = dtype_size(dtype);
  for (const int64_t d : shape) {
    MS_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes),
             "{}: tensor '{}': shape {} {} has more bytes than 2^64 (element count overflows)", path, name,
             dtype_name(dtype), shape_str(shape));
  }
  return bytes;
}

TensorInfo parse_tensor_entry(const std::string& path, const std::string& name, const json& entry, size_t data_size) {
  MS_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") && entry.contains("data_offsets"),
           "{}: tensor '{}': header entry needs dtype, shape and data_offsets", path, name);
  TensorInfo info;
  info.name = name;
  const json& dtype = entry.at("dtype");
  MS_CHECK(dtype.is_string() && parse_dtype(dtype.get<std::string>(), &info.dtype), "{}: tensor '{}': unknown dtype {}",
           path, name, dtype.dump());
  const json& shape = entry.at("shape");
  MS_CHECK(shape.is_array(), "{}: tensor '{}': shape must be an array", path, name);
  for (const auto& d : shape) {
    MS_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
             "{}: tensor '{}': bad dimension {} in shape", path, name, d.dump());
    info.shape.push_back(d.get<int64_t>());
  }
  const json& offsets = entry.at("data_offsets");
  MS_CHECK(
      offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(),
      "{}: tensor '{}': data_offsets must be two non-negative integers", path, name);
  info.data_begin = offsets[0].get<size_t>();
  info.data_end = offsets[1].get<size_t>();
  MS_CHECK(info.data_begin <= info.data_end, "{}: tensor '{}': data_offsets [{}, {}] are out of order (begin > end)",
           path, name, info.data_begin, info.data_end);
  MS_CHECK(info.data_end <= data_size,
           "{}: tensor '{}': data_offsets [{}, {}] outside the data section ({} bytes; file truncated?)", path, name,
           info.data_begin, info.data_end, data_size);
  const size_t expected = tensor_bytes(info.shape, info.dtype, path, name);
  MS_CHECK(info.data_end - info.data_begin == expected,
           "{}: tensor '{}': {} bytes of data for shape {} {} (expected {})", path, name,
           info.data_end - info.data_begin, dtype_name(info.dtype), shape_str(info.shape), expected);
  return info;
}

// No two tensors share a byte of the data section (gaps between them are allowed).
void check_no_overlap(const std::string& path, const std::map<std::string, TensorInfo>& tensors) {
  std::vector<const TensorInfo*> by_offset;
  for (const auto& [name, info] : tensors) {
    if (info.data_end > info.data_begin) by_offset.push_back(&info);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data_begin < b->data_begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    MS_CHECK(cur.data_begin >= prev.data_end,
             "{}: tensor '{}': data_offsets [{}, {}] overlap those of tensor '{}' [{}, {}]", path, cur.name,
             cur.data_begin, cur.data_end, prev.name, prev.data_begin, prev.data_end);
  }
}

}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY);
  MS_CHECK(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("{}: cannot stat", path);
  }
  const size_t file_size = static_cast<size_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    fail("{}: truncated file ({} bytes, the 8-byte header length is missing)", path, file_size);
  }
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  MS_CHECK(mapping != MAP_FAILED, "{}: mmap failed: {}", path, std::strerror(errno));
  file->mapping_ = mapping;
  file->mapping_size_ = file_size;
  const auto* bytes = static_cast<const std::byte*>(mapping);

  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes, 8);  // little-endian on every supported host
  MS_CHECK(header_size <= file_size - 8, "{}: header length {} runs past the end of the file ({} bytes)", path,
           header_size, file_size);
  MS_CHECK(header_size <= kMaxHeaderBytes, "{}: header length {} is over the safetensors limit of {} bytes", path,
           header_size, kMaxHeaderBytes);
  const std::string header_text(reinterpret_cast<const char*>(bytes + 8), header_size);
  const json header = parse_json_rejecting_duplicate_keys(header_text, path);
  MS_CHECK(header.is_object(), "{}: safetensors header must be a JSON object", path);
  file->data_ = bytes + 8 + header_size;
  const size_t data_size = file_size - 8 - header_size;

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    file->tensors_.emplace(name, parse_tensor_entry(path, name, entry, data_size));
  }
  check_no_overlap(path, file->tensors_);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& directory) {
  namespace fs = std::filesystem;
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->directory_ = directory;
  const fs::path dir(directory);
  const fs::path index_path = dir / "model.safetensors.index.json";
  const fs::path single_path = dir / "model.safetensors";

  if (fs::exists(index_path)) {
    const std::string index_file = index_path.string();
    json index;
    try {
      index = json::parse(read_text_file(index_file));
    } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond double
      fail("{}: invalid JSON: {}", index_file, e.what());
    }
    MS_CHECK(index.contains("weight_map") && index.at("weight_map").is_object(), "{}: missing field 'weight_map'",
             index_file);
    std::map<std::string, const SafetensorsFile*> opened;
    for (const auto& [name, shard] : index.at("weight_map").items()) {
      MS_CHECK(shard.is_string(), "{}: tensor '{}': shard name must be a string", index_file, name);
      const std::string shard_name = shard.get<std::string>();
      MS_CHECK(shard_name.find('/') == std::string::npos && shard_name.find("..") == std::string::npos,
               "{}: tensor '{}': shard '{}' must be a file name in the checkpoint directory", index_file, name,
               shard_name);
      auto it = opened.find(shard_name);
      if (it == opened.end()) {
        ckpt->files_.push_back(SafetensorsFile::open((dir / shard_name).string()));
        it = opened.emplace(shard_name, ckpt->files_.back().get()).first;
      }
      const auto& tensors = it->second->tensors();
      auto found = tensors.find(name);
      MS_CHECK(found != tensors.end(), "{}: tensor '{}' listed in the index is missing from {}", index_file, name,
               it->second->path());
      ckpt->index_[name] = Entry{it->second, &found->second};
    }
    // A tensor in a shard that the index does not list, or that two shards both hold.
    for (const auto& file : ckpt->files_) {
      for (const auto& [name, info] : file->tensors()) {
        auto entry = ckpt->index_.find(name);
        MS_CHECK(entry != ckpt->index_.end(), "{}: tensor '{}' is not listed in {}", file->path(), name, index_file);
        MS_CHECK(entry->second.file == file.get(), "{}: duplicate tensor '{}' (also in {})", file->path(), name,
                 entry->second.file->path());
      }
    }
  } else if (fs::exists(single_path)) {
    ckpt->files_.push_back(SafetensorsFile::open(single_path.string()));
    for (const auto& [name, info] : ckpt->files_.back()->tensors())
      ckpt->index_[name] = Entry{ckpt->files_.back().get(), &info};
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", directory);
  }
  return ckpt;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    // Quantized variants are recognised and refused with the reason.
    if (index_.count(name + "_packed") || index_.count(name.substr(0, name.rfind('.')) + ".weight_packed"))
      fail(
          "{}: tensor '{}' is int4-packed (compressed-tensors pack-quantized), but config.json's "
          "quantization_config does not quantize it (its ignore list?)",
          directory_, name);
    fail("{}: missing tensor '{}'", directory_, name);
  }
  return *it->second.info;
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  info(name);
  return index_.at(name).file->path();
}

const std::byte* Checkpoint::data(const std::string& name) const {
  const TensorInfo& ti = info(name);
  return index_.at(name).file->data(ti);
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, entry] : index_) names.push_back(name);
  return names;
}

namespace {

// A tensor read_f32 can convert: the expected shape, 1-D or 2-D, a float dtype it reads.
void check_weight_tensor(const TensorInfo& ti, const std::string& path, const std::string& name,
                         const Shape& expected_shape) {
  MS_CHECK(ti.shape == expected_shape, "{}: tensor '{}' has shape {}, expected {}", path, name, shape_str(ti.shape),
           shape_str(expected_shape));
  if (ti.dtype == DType::F8_E4M3 || ti.dtype == DType::F8_E5M2)
    fail("{}: tensor '{}' is {}, but config.json's quantization_config does not quantize it", path, name,
         dtype_name(ti.dtype));
  MS_CHECK(ti.dtype == DType::F32 || ti.dtype == DType::BF16 || ti.dtype == DType::F16,
           "{}: tensor '{}' has dtype {}; weights must be F32, BF16 or F16", path, name, dtype_name(ti.dtype));
  MS_CHECK(ti.shape.size() == 1 || ti.shape.size() == 2, "{}: tensor '{}': expected a 1-D or 2-D tensor, got {}", path,
           name, shape_str(ti.shape));
}

}  // namespace

Tensor Checkpoint::read_f32(const std::string& name, const Shape& expected_shape, Slice rows, Slice cols) const {
  const TensorInfo& ti = info(name);
  const std::string& path = file_of(name);
  check_weight_tensor(ti, path, name, expected_shape);
  const int64_t num_rows = ti.shape[0];
  const int64_t num_cols = ti.shape.size() == 2 ? ti.shape[1] : 1;
  if (rows.end < 0) rows.end = num_rows;
  if (cols.end < 0) cols.end = num_cols;
  MS_CHECK(0 <= rows.begin && rows.begin <= rows.end && rows.end <= num_rows && 0 <= cols.begin &&
               cols.begin <= cols.end && cols.end <= num_cols,
           "{}: tensor '{}': slice rows [{}, {}) cols [{}, {}) outside shape {}", path, name, rows.begin, rows.end,
           cols.begin, cols.end, shape_str(ti.shape));
  const int64_t out_rows = rows.end - rows.begin;
  const int64_t out_cols = cols.end - cols.begin;
  Tensor out(DType::F32, ti.shape.size() == 2 ? Shape{out_rows, out_cols} : Shape{out_rows});
  const auto* base = index_.at(name).file->data(ti);
  const size_t elem = dtype_size(ti.dtype);
  for (int64_t r = 0; r < out_rows; ++r) {
    const std::byte* src = base + ((rows.begin + r) * num_cols + cols.begin) * elem;
    convert_to_f32(ti.dtype, src, out.f32() + r * out_cols, static_cast<size_t>(out_cols));
  }
  return out;
}

}  // namespace moeserve
