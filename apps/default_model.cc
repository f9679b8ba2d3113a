#include "apps/default_model.h"

#include <fmt/format.h>

#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"

#ifndef MOESERVE_SOURCE_DIR
#define MOESERVE_SOURCE_DIR ""
#endif

namespace moeserve::apps {

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> candidates() {
  std::vector<fs::path> places;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path bin = exe.parent_path();
    places.push_back(bin / ".." / ".." / "models" / "default");                  // <repo>/build/bin
    places.push_back(bin / ".." / "share" / "moeserve" / "models" / "default");  // <prefix>/bin
  }
  if (std::string_view(MOESERVE_SOURCE_DIR).size() > 0)
    places.push_back(fs::path(MOESERVE_SOURCE_DIR) / "models" / "default");
  return places;
}

}  // namespace

std::string default_model_directory() {
  const std::vector<fs::path> places = candidates();
  std::string looked;
  for (const fs::path& place : places) {
    std::error_code ec;
    if (fs::is_regular_file(place / "config.json", ec) && fs::is_regular_file(place / "model.safetensors", ec))
      return fs::weakly_canonical(place, ec).string();
    looked += (looked.empty() ? "" : ", ") + place.lexically_normal().string();
  }
  fail(
      "the default model (models/default: config.json and model.safetensors) is not in {}; pass --model DIR "
      "(a Hugging Face model directory) or --model synthetic:tiny (random weights)",
      looked.empty() ? std::string("any known place") : looked);
}

std::string resolve_model_spec(const std::string& spec) { return spec.empty() ? default_model_directory() : spec; }

}  // namespace moeserve::apps
