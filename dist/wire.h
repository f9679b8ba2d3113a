// Bytes on the wire between moeserve processes: little-endian host layout (every process of a
// cluster runs the same binary on the same architecture; the handshake compares versions), a
// u64 length before each vector or string. The reader names the field it was reading when a
// message is short, so that a truncated frame fails with a message saying where.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace moeserve::dist {

class ByteWriter {
 public:
  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    append(&value, sizeof(T));
  }
  template <typename T>
  void put_vector(const std::vector<T>& values) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<uint64_t>(values.size());
    append(values.data(), values.size() * sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    append(s.data(), s.size());
  }
  void append(const void* data, size_t bytes) {
    if (bytes == 0) return;
    const size_t old = bytes_.size();
    bytes_.resize(old + bytes);
    std::memcpy(bytes_.data() + old, data, bytes);
  }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

class ByteReader {
 public:
  ByteReader(const std::vector<std::byte>& bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}

  template <typename T>
  T get(const char* field) {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    take(&value, sizeof(T), field);
    return value;
  }
  template <typename T>
  std::vector<T> get_vector(const char* field) {
    const uint64_t n = get<uint64_t>(field);
    MS_CHECK(n <= (bytes_.size() - offset_) / sizeof(T), "{}: field '{}' claims {} elements, {} bytes are left", what_,
             field, n, bytes_.size() - offset_);
    std::vector<T> values(n);
    take(values.data(), n * sizeof(T), field);
    return values;
  }
  std::string get_string(const char* field) {
    const std::vector<char> chars = get_vector<char>(field);
    return {chars.begin(), chars.end()};
  }
  void take(void* out, size_t bytes, const char* field) {
    MS_CHECK(bytes <= bytes_.size() - offset_, "{}: message ends inside field '{}' ({} bytes needed, {} left)", what_,
             field, bytes, bytes_.size() - offset_);
    if (bytes) std::memcpy(out, bytes_.data() + offset_, bytes);
    offset_ += bytes;
  }
  void expect_end() const {
    MS_CHECK(offset_ == bytes_.size(), "{}: {} bytes left after the last field", what_, bytes_.size() - offset_);
  }

 private:
  const std::vector<std::byte>& bytes_;
  std::string what_;
  size_t offset_ = 0;
};

}  // namespace moeserve::dist
