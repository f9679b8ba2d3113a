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

int64_t code_points(const std::string& utf8) {
  int64_t n = 0;
  for (unsigned char c : utf8) n += (c & 0xC0) != 0x80;  // every byte but continuation bytes
  return n;
}

OutputProcessor::Update OutputProcessor::push(int32_t token, bool stops) {
  MS_CHECK(!finished_, "output processor: token after the request finished");
  Update update;
  update.text_offset = decoded_chars_;
  ++generated_;
  const bool may_stop = generated_ >= limits_.min_tokens;  // vLLM: no stop check before min_tokens
  const auto stop_id = std::find(limits_.stop_token_ids.begin(), limits_.stop_token_ids.end(), token);
  const bool stop_token = stops || (may_stop && stop_id != limits_.stop_token_ids.end());
  if (!stop_token) {
    const std::string piece = detokenizer_.push(token);
    decoded_chars_ += code_points(piece);
    held_ += piece;
    // The earliest stop string in the held text ends the output before it (or after it).
    size_t first = std::string::npos;
    const std::string* matched = nullptr;
    for (const std::string& stop : limits_.stop)
      if (const size_t at = held_.find(stop); may_stop && at < first) {
        first = at;
        matched = &stop;
      }
    if (matched != nullptr) {
      update.text = held_.substr(0, first + (limits_.include_stop_str_in_output ? matched->size() : 0));
      held_.clear();
      update.finish_reason = "stop";
      update.stop_string = *matched;
      finished_ = true;
      return update;
    }
  }
  if (stop_token || generated_ >= limits_.max_tokens) {
    update.text = held_ + detokenizer_.flush();
    held_.clear();
    update.finish_reason = stop_token ? "stop" : "length";
    if (stop_token && static_cast<size_t>(stop_id - limits_.stop_token_ids.begin()) < limits_.client_stop_token_ids)
      update.stop_token = token;
    finished_ = true;
    return update;
  }
  const size_t keep = held_back_length();
  update.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return update;
}

}  // namespace moeserve::serve
