// Environment switches: the MOESERVE_* variables that change a default (docs/serving.md
// lists them). Plain C++17: the CUDA translation units read them too.
#pragma once

#include <cstdlib>
#include <cstring>

namespace moeserve {

// Unset: `fallback`; "0": false; any other value: true.
inline bool env_switch(const char* name, bool fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::strcmp(value, "0") != 0;
}

// Unset: `fallback`; else the value as an integer (0 when it is not a number).
inline int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::atoi(value);
}

}  // namespace moeserve
