// Levelled logging to stderr (spdlog, header-only over the header-only fmt: no shared library
// at run time). `--log-level` of `serve` sets the level by SGLang's names; messages below it are
// formatted not at all.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>

namespace moeserve {

enum class LogLevel { kDebug, kInfo, kWarning, kError, kCritical };

// "debug", "info", "warning" (or "warn"), "error", "critical"; throws Error for other names.
void set_log_level(const std::string& name);
bool log_enabled(LogLevel level);
void log_message(LogLevel level, const std::string& message);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(level)) log_message(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace moeserve
