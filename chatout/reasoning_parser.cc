#include "chatout/reasoning_parser.h"

#include <fmt/format.h>

#include "chatout/markers.h"
#include "core/error.h"

namespace moeserve::chatout {

namespace {
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
}  // namespace

ReasoningParser::ReasoningParser(ReasoningOptions options) : options_(std::move(options)) {}

std::vector<std::string> ReasoningParser::end_markers() const {
  std::vector<std::string> markers = options_.implicit_ends;
  markers.emplace_back(kThinkClose);
  return markers;
}

std::string ReasoningParser::feed(std::string_view text, OutputDelta& out) {
  if (state_ == State::kAfter) return std::string(text);
  buffer_ += text;
  if (state_ == State::kStart) {
    const std::string_view head = trim(buffer_);
    // Wait while the text so far could still be the model's own "<think>".
    if (head.size() < kThinkOpen.size() && kThinkOpen.substr(0, head.size()) == head) return {};
    if (head.rfind(kThinkOpen, 0) == 0) buffer_.erase(0, buffer_.find(kThinkOpen) + kThinkOpen.size());
    state_ = State::kReasoning;
  }
  const std::vector<std::string> markers = end_markers();
  const MarkerMatch m = find_first(buffer_, markers);
  if (!m.found()) {
    const size_t keep = partial_marker_length(buffer_, markers);
    out.reasoning += buffer_.substr(0, buffer_.size() - keep);
    buffer_.erase(0, buffer_.size() - keep);
    return {};
  }
  out.reasoning += buffer_.substr(0, m.pos);
  const bool closed = buffer_.compare(m.pos, m.length, kThinkClose) == 0;
  std::string rest = buffer_.substr(closed ? m.pos + m.length : m.pos);
  buffer_.clear();
  state_ = State::kAfter;
  return rest;
}

std::string ReasoningParser::finish(OutputDelta& out) {
  if (state_ != State::kAfter) out.reasoning += buffer_;
  buffer_.clear();
  state_ = State::kAfter;
  return {};
}

const std::vector<std::string>& reasoning_parser_names() {
  static const std::vector<std::string> names = {"kimi_k2", "deepseek_r1"};
  return names;
}

ReasoningOptions reasoning_options(std::string_view name) {
  if (name == "kimi_k2") return {{"<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"}};
  if (name == "deepseek_r1") return {};
  throw Error(fmt::format("--reasoning-parser: unknown parser '{}' (known: {})", name,
                          fmt::join(reasoning_parser_names(), ", ")));
}

}  // namespace moeserve::chatout
