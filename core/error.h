// Errors: one exception type whose message names the file, tensor, field or parameter at
// fault. Callers print `what()` on one line and exit non-zero (or answer 4xx in the server).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace moeserve {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace moeserve

// Check an invariant that bad input can break; the message is formatted only on failure.
#define MS_CHECK(cond, ...)                     \
  do {                                          \
    if (!(cond)) ::moeserve::fail(__VA_ARGS__); \
  } while (0)
