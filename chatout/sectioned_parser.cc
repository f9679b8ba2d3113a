#include "chatout/sectioned_parser.h"

#include <nlohmann/json.hpp>

#include "chatout/markers.h"

namespace moeserve::chatout {

namespace {

// Characters an argument text may be followed by before CALL_END: spaces, line breaks and
// DeepSeek V3's closing "```" fence. Held back while streaming, dropped at CALL_END.
bool is_tail_char(char c) { return is_space(c) || c == '`'; }

size_t tail_length(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && is_tail_char(text[text.size() - 1 - n])) ++n;
  return n;
}

class SectionedParser final : public ToolCallParser {
 public:
  SectionedParser(SectionFormat format, ToolParserOptions options)
      : ToolCallParser(std::move(options)), format_(std::move(format)) {}

  void feed(std::string_view text, OutputDelta& out) override {
    buffer_ += text;
    while (step(out)) {
    }
  }

  void finish(OutputDelta& out) override {
    if (state_ == State::kText || state_ == State::kSection) {
      if (state_ == State::kText || stray_started_ || !is_blank(buffer_)) out.content += buffer_;
    } else {  // a call the output left unfinished
      if (index_ >= 0)
        mark_invalid(index_);
      else
        mark_rejected();
      out.content += raw_ + buffer_;
    }
    buffer_.clear();
    raw_.clear();
    state_ = State::kText;
  }

  std::vector<std::string> call_start_markers() const override { return format_.section_begin; }

 private:
  enum class State { kText, kSection, kHeader, kArgs, kRejected };

  // One transition, when the buffer allows it; false: wait for more text.
  bool step(OutputDelta& out) {
    switch (state_) {
      case State::kText:
        return in_text(out);
      case State::kSection:
        return in_section(out);
      case State::kHeader:
        return in_header(out);
      case State::kArgs:
        return in_args(out);
      case State::kRejected:
        return in_rejected(out);
    }
    return false;
  }

  // Moves buffer_[0, n) out, keeping a copy in raw_ (the call's text, should it be rejected).
  std::string take(size_t n) {
    std::string piece = buffer_.substr(0, n);
    buffer_.erase(0, n);
    raw_ += piece;
    return piece;
  }

  bool in_text(OutputDelta& out) {
    const MarkerMatch m = find_first(buffer_, format_.section_begin);
    if (!m.found()) {
      const size_t keep = partial_marker_length(buffer_, format_.section_begin);
      out.content += buffer_.substr(0, buffer_.size() - keep);
      buffer_.erase(0, buffer_.size() - keep);
      return false;
    }
    out.content += buffer_.substr(0, m.pos);
    buffer_.erase(0, m.pos + m.length);
    state_ = State::kSection;
    return true;
  }

  bool in_section(OutputDelta& out) {
    std::vector<std::string> markers = format_.section_end;
    markers.push_back(format_.call_begin);
    const MarkerMatch m = find_first(buffer_, markers);
    // Text between the markers is content, unless it is only spaces: a blank start waits
    // (wherever the pieces were cut, a stretch is either all spaces or sent whole).
    if (!m.found()) {
      const size_t release = buffer_.size() - partial_marker_length(buffer_, markers);
      if (!stray_started_ && is_blank(std::string_view(buffer_).substr(0, release))) return false;
      out.content += buffer_.substr(0, release);
      buffer_.erase(0, release);
      stray_started_ = true;
      return false;
    }
    const std::string stray = buffer_.substr(0, m.pos);
    if (stray_started_ || !is_blank(stray)) out.content += stray;
    stray_started_ = false;
    const bool call = buffer_.compare(m.pos, m.length, format_.call_begin) == 0;
    buffer_.erase(0, m.pos);
    raw_.clear();
    take(m.length);
    state_ = call ? State::kHeader : State::kText;
    if (!call) raw_.clear();
    return true;
  }

  bool in_header(OutputDelta& out) {
    const size_t args = buffer_.find(format_.args_begin);
    const size_t end = buffer_.find(format_.call_end);
    if (end != std::string::npos && (args == std::string::npos || end < args)) {
      reject_until_end(out);  // CALL_END before the arguments: no call
      return true;
    }
    if (args == std::string::npos) return false;
    const std::optional<CallHeader> header = format_.parse_header(buffer_.substr(0, args));
    take(args + format_.args_begin.size());
    if (!header || !tool_known(header->name)) {
      state_ = State::kRejected;
      index_ = -1;
      return true;
    }
    index_ = begin_call(header->name, header->id, out);
    args_.clear();
    sent_ = 0;
    state_ = State::kArgs;
    return true;
  }

  bool in_args(OutputDelta& out) {
    const size_t end = buffer_.find(format_.call_end);
    const bool closed = end != std::string::npos;
    // A partial CALL_END stays in the buffer; leading spaces are never sent; the tail (spaces,
    // the fence) waits until more arguments follow it or CALL_END drops it.
    args_ += take(closed ? end : buffer_.size() - partial_marker_length(buffer_, {format_.call_end}));
    while (sent_ == 0 && !args_.empty() && is_space(args_.front())) args_.erase(0, 1);
    const size_t keep = tail_length(args_);
    if (args_.size() - keep > sent_) {
      out.add_arguments(index_, args_.substr(sent_, args_.size() - keep - sent_));
      sent_ = args_.size() - keep;
    }
    if (!closed) return false;
    take(format_.call_end.size());
    const std::string arguments = args_.substr(0, sent_);
    if (!nlohmann::json::accept(arguments)) {
      mark_invalid(index_);
      out.content += raw_;  // the client sees what the model wrote
    }
    end_call();
    return true;
  }

  bool in_rejected(OutputDelta& out) {
    if (buffer_.find(format_.call_end) == std::string::npos) return false;
    reject_until_end(out);
    return true;
  }

  void reject_until_end(OutputDelta& out) {
    take(buffer_.find(format_.call_end) + format_.call_end.size());
    mark_rejected();
    out.content += raw_;
    end_call();
  }

  void end_call() {
    raw_.clear();
    index_ = -1;
    state_ = State::kSection;
  }

  SectionFormat format_;
  State state_ = State::kText;
  std::string buffer_;          // arrived, not yet consumed
  std::string raw_;             // the current call's text so far
  std::string args_;            // the current call's arguments so far
  size_t sent_ = 0;             // of args_, the characters sent
  int index_ = -1;              // the current call's index (-1: none sent)
  bool stray_started_ = false;  // in the section, text between markers that is not blank was sent
};

}  // namespace

std::unique_ptr<ToolCallParser> make_sectioned_parser(SectionFormat format, ToolParserOptions options) {
  return std::make_unique<SectionedParser>(std::move(format), std::move(options));
}

}  // namespace moeserve::chatout
