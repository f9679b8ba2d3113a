// A step's token bitmask (structured output), filled while the step runs: the step loop
// submits the step first and fills the rows of its constrained requests afterwards (their
// grammars' next tokens), while the ranks run the forward; the last stage waits for it only
// after the LM head, right before the bitmask op (SGLang's and vLLM's overlap: the mask is
// needed only for the draw). Shared by the step loop (the filler) and every last-stage rank
// of the batch (readers); thread-safe.
//
//   auto mask = std::make_shared<TokenBitmask>(rows, words);  // every id allowed
//   batch.token_bitmask = mask; engine.submit(plan);           // the ranks start the forward
//   constraint.fill_next_mask(mask->row(r)); mask->publish();  // the ranks may now read it
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"

namespace moeserve {

class TokenBitmask {
 public:
  // [rows, words]: bit id % 32 of word id / 32 set when `id` may come next; all set at first.
  TokenBitmask(int64_t rows, int64_t words)
      : rows_(rows), words_(words), bits_(static_cast<size_t>(rows * words), -1) {}

  int64_t rows() const { return rows_; }
  int64_t words() const { return words_; }
  // The filler's view of row `r`, until publish().
  std::span<int32_t> row(int64_t r) {
    MS_CHECK(r >= 0 && r < rows_, "token bitmask: row {} of {}", r, rows_);
    return {bits_.data() + r * words_, static_cast<size_t>(words_)};
  }

  // The filler: the words are final (publish) or will never be (fail: readers throw `error`).
  // Only the first call counts.
  void publish() { settle(""); }
  void fail(const std::string& error) { settle(error.empty() ? "unknown error" : error); }
  bool settled() const {
    std::lock_guard lock(mutex_);
    return settled_;
  }

  // The readers: blocks until published and returns [rows * words]; throws the filler's error.
  std::span<const int32_t> wait() const {
    std::unique_lock lock(mutex_);
    settled_changed_.wait(lock, [&] { return settled_; });
    MS_CHECK(error_.empty(), "structured output: the step's token bitmask was not filled: {}", error_);
    return bits_;
  }

 private:
  void settle(const std::string& error) {
    {
      std::lock_guard lock(mutex_);
      if (settled_) return;
      settled_ = true;
      error_ = error;
    }
    settled_changed_.notify_all();
  }

  int64_t rows_, words_;
  std::vector<int32_t> bits_;
  mutable std::mutex mutex_;
  mutable std::condition_variable settled_changed_;
  bool settled_ = false;
  std::string error_;
};

}  // namespace moeserve
