// What a serving-loop request streamed: its token ids, read until its last event.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "serve/request_stream.h"

namespace moeserve::serve {

// Every token id the request streams until its last event; an error event fails the test
// (and is the last).
inline std::vector<int32_t> streamed_tokens(RequestStream& stream) {
  std::vector<int32_t> tokens;
  for (bool done = false; !done;) {
    std::vector<OutputEvent> events;
    stream.wait(events, std::chrono::milliseconds(1000));
    for (const auto& e : events) {
      EXPECT_EQ(e.error_status, 0) << e.error;
      tokens.insert(tokens.end(), e.token_ids.begin(), e.token_ids.end());
      done = done || e.last();
    }
  }
  return tokens;
}

}  // namespace moeserve::serve
