#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "core/error.h"

namespace moeserve {

namespace {

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> instance = [] {
    auto l = spdlog::stderr_color_mt("moeserve");
    l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    l->set_level(spdlog::level::info);
    return l;
  }();
  return *instance;
}

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarning:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kCritical:
      return spdlog::level::critical;
  }
  return spdlog::level::info;
}

}  // namespace

void set_log_level(const std::string& name) {
  static const std::pair<const char*, LogLevel> names[] = {
      {"debug", LogLevel::kDebug},  {"info", LogLevel::kInfo},   {"warning", LogLevel::kWarning},
      {"warn", LogLevel::kWarning}, {"error", LogLevel::kError}, {"critical", LogLevel::kCritical}};
  for (const auto& [n, level] : names)
    if (name == n) return logger().set_level(to_spdlog(level));
  fail("--log-level '{}': expected debug, info, warning, error or critical", name);
}

bool log_enabled(LogLevel level) { return logger().should_log(to_spdlog(level)); }

void log_message(LogLevel level, const std::string& message) { logger().log(to_spdlog(level), message); }

}  // namespace moeserve
