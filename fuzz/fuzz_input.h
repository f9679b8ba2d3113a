// What the fuzz targets share: splitting one input into the files or fields a parser reads, and a
// scratch directory for the parsers that take a path. Each target is one LLVMFuzzerTestOneInput
// (docs/fuzzing.md); a moeserve::Error (or serve::ApiError) is a clean rejection, anything else
// that escapes is a defect and ends the run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve::fuzz {

// Inputs made of several parts (a tokenizer file, its config, a text) separate them with this
// line; the seed corpora and the dictionaries spell it out.
inline constexpr std::string_view kSectionSeparator = "\n#--moeserve-fuzz--#\n";

// The input's parts, in order (one part when the separator does not occur).
std::vector<std::string_view> split_sections(std::string_view input);

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A directory of this process, created on first use (under $TMPDIR) and emptied on every call,
// so that a run's files never reach the next input.
const std::string& scratch_dir();
void clear_scratch_dir();
// Writes `bytes` to scratch_dir()/name.
void write_scratch_file(const std::string& name, std::string_view bytes);

// Aborts with `what` (libFuzzer records the input): an invariant of the code under test broke.
[[noreturn]] void invariant_failed(const std::string& what);
#define MS_FUZZ_ASSERT(cond, what)                         \
  do {                                                     \
    if (!(cond)) ::moeserve::fuzz::invariant_failed(what); \
  } while (0)

}  // namespace moeserve::fuzz
