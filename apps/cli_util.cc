#include "apps/cli_util.h"

#include <cstdio>
#include <fstream>

#include "core/error.h"

namespace moeserve::apps {

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(start, comma - start);
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    MS_CHECK(used == item.size() && !item.empty() && value >= 0 && value <= INT32_MAX,
             "{}: '{}' is not a non-negative token id", what, item);
    ids.push_back(static_cast<int32_t>(value));
    start = comma + 1;
  }
  return ids;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  return out;
}

void write_npy(const std::string& path, const Tensor& tensor) {
  MS_CHECK(tensor.dtype() == DType::F32, "{}: only F32 tensors can be written", path);
  std::string shape = "(";
  for (size_t i = 0; i < tensor.rank(); ++i)
    shape += std::to_string(tensor.dim(i)) + (tensor.rank() == 1 ? "," : (i + 1 < tensor.rank() ? ", " : ""));
  shape += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  MS_CHECK(out.good(), "{}: cannot open for writing", path);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(tensor.raw()), static_cast<std::streamsize>(tensor.nbytes()));
  MS_CHECK(out.good(), "{}: write failed", path);
}

std::string human_count(double count) {
  const char* units[] = {"", " K", " M", " B", " T"};
  int u = 0;
  while (count >= 1000.0 && u < 4) {
    count /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%s", count, units[u]);
  return buf;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", bytes, units[u]);
  return buf;
}

}  // namespace moeserve::apps
