#include "fuzz/fuzz_input.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace moeserve::fuzz {

std::vector<std::string_view> split_sections(std::string_view input) {
  std::vector<std::string_view> parts;
  for (;;) {
    const size_t at = input.find(kSectionSeparator);
    parts.push_back(input.substr(0, at));
    if (at == std::string_view::npos) return parts;
    input.remove_prefix(at + kSectionSeparator.size());
  }
}

const std::string& scratch_dir() {
  // Never destroyed: the exit handler that removes it runs after static destructors would.
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    auto* path = new std::string(std::string(tmp && *tmp ? tmp : "/tmp") + "/moeserve-fuzz-XXXXXX");
    if (::mkdtemp(path->data()) == nullptr) invariant_failed("cannot create the scratch directory " + *path);
    std::atexit([] { std::filesystem::remove_all(*dir); });  // libFuzzer ends through exit(), also on a crash
    return path;
  }();
  return *dir;
}

void clear_scratch_dir() {
  for (const auto& entry : std::filesystem::directory_iterator(scratch_dir())) std::filesystem::remove_all(entry);
}

void write_scratch_file(const std::string& name, std::string_view bytes) {
  std::ofstream out(scratch_dir() + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) invariant_failed("cannot write " + scratch_dir() + "/" + name);
}

void invariant_failed(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant failed: %s\n", what.c_str());
  std::abort();
}

}  // namespace moeserve::fuzz
