#include "serve/output_processor.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve::serve {

OutputProcessor::OutputProcessor(const tokenizer::Tokenizer& tokenizer, OutputLimits limits)
    : limits_(std::move(limits)), detokenizer_(tokenizer, limits_.skip_special_tokens) {}

size_t OutputProcessor::held_back_length() const {
  size_t keep = 0;
  for (const std::string& stop : limits_.stop)
    for (size_t len = std::min(stop.size() - 1, held_.size()); len > keep; --len)
      if (held_.compare(held_.size() - len, len, stop, 0, len) == 0) {
        keep = len;
        break;
      }
  return keep;
}

OutputProcessor::Update OutputProcessor::push(int32_t token, bool stops) {
  MS_CHECK(!finished_, "output processor: token after the request finished");
  Update update;
  update.text_offset = decoded_bytes_;
  ++generated_;
  const bool stop_token = stops || std::find(limits_.stop_token_ids.begin(), limits_.stop_token_ids.end(), token) !=
                                       limits_.stop_token_ids.end();
  if (!stop_token) {
    const std::string piece = detokenizer_.push(token);
    decoded_bytes_ += static_cast<int64_t>(piece.size());
    held_ += piece;
    // The earliest stop string in the held text ends the output before it.
    size_t first = std::string::npos;
    for (const std::string& stop : limits_.stop) first = std::min(first, held_.find(stop));
    if (first != std::string::npos) {
      update.text = held_.substr(0, first);
      held_.clear();
      update.finish_reason = "stop";
      finished_ = true;
      return update;
    }
  }
  if (stop_token || generated_ >= limits_.max_tokens) {
    update.text = held_ + detokenizer_.flush();
    held_.clear();
    update.finish_reason = stop_token ? "stop" : "length";
    finished_ = true;
    return update;
  }
  const size_t keep = held_back_length();
  update.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return update;
}

}  // namespace moeserve::serve
