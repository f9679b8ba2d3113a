// Qwen3 (and Qwen2.5, Hermes): the format of its chat template's tool-call instructions and of
// vLLM's hermes / SGLang's qwen25 parsers, one JSON object per call:
//
//   <tool_call>\n{"name": "NAME", "arguments": {json}}\n</tool_call>
//
// Once `{"name": "NAME", "arguments": ` has arrived the arguments are streamed, less the tail
// from the spaces before the last "}" (which may be the object's own). A call whose keys come
// in another order is parsed whole at </tool_call>.
#include <nlohmann/json.hpp>

#include "chatout/markers.h"
#include "chatout/tool_call_parser.h"

namespace moeserve::chatout {

namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

enum class Match { kNeedMore, kNo, kYes };

// Matches `{"name": "NAME", "arguments": ` at the start of `text` (spaces anywhere between).
class HeaderScanner {
 public:
  explicit HeaderScanner(std::string_view text) : text_(text) {}

  Match scan(std::string& name, size_t& length) {
    for (std::string_view token : {"{", "\"name\"", ":"})
      if (Match m = literal(token); m != Match::kYes) return m;
    if (Match m = string_value(name); m != Match::kYes) return m;
    for (std::string_view token : {",", "\"arguments\"", ":"})
      if (Match m = literal(token); m != Match::kYes) return m;
    skip_spaces();
    if (pos_ == text_.size()) return Match::kNeedMore;
    length = pos_;
    return Match::kYes;
  }

 private:
  void skip_spaces() {
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
  }

  Match literal(std::string_view token) {
    skip_spaces();
    const std::string_view rest = text_.substr(pos_);
    if (rest.size() < token.size()) return token.substr(0, rest.size()) == rest ? Match::kNeedMore : Match::kNo;
    if (rest.substr(0, token.size()) != token) return Match::kNo;
    pos_ += token.size();
    return Match::kYes;
  }

  Match string_value(std::string& out) {
    skip_spaces();
    if (pos_ == text_.size()) return Match::kNeedMore;
    if (text_[pos_] != '"') return Match::kNo;
    for (size_t i = pos_ + 1; i < text_.size(); ++i) {
      if (text_[i] == '\\') {
        ++i;
        continue;
      }
      if (text_[i] != '"') continue;
      const auto parsed = nlohmann::json::parse(text_.substr(pos_, i + 1 - pos_), nullptr, false);
      if (!parsed.is_string()) return Match::kNo;
      out = parsed.get<std::string>();
      pos_ = i + 1;
      return Match::kYes;
    }
    return Match::kNeedMore;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// The streamable part of an argument region: up to the spaces before its last "}".
size_t streamable_length(std::string_view region) {
  size_t end = region.rfind('}');
  if (end == std::string_view::npos) end = region.size();
  while (end > 0 && is_space(region[end - 1])) --end;
  return end;
}

class Qwen3Parser final : public ToolCallParser {
 public:
  using ToolCallParser::ToolCallParser;

  void feed(std::string_view text, OutputDelta& out) override {
    buffer_ += text;
    while (in_call_ ? call_step(out) : text_step(out)) {
    }
  }

  void finish(OutputDelta& out) override {
    if (in_call_) {
      if (index_ >= 0)
        mark_invalid(index_);
      else
        mark_rejected();
      out.content += std::string(kOpen);
    }
    out.content += buffer_;
    buffer_.clear();
    in_call_ = false;
  }

  std::vector<std::string> call_start_markers() const override { return {std::string(kOpen)}; }

 private:
  bool text_step(OutputDelta& out) {
    const size_t open = buffer_.find(kOpen);
    if (open == std::string::npos) {
      const size_t keep = partial_marker_length(buffer_, {std::string(kOpen)});
      out.content += buffer_.substr(0, buffer_.size() - keep);
      buffer_.erase(0, buffer_.size() - keep);
      return false;
    }
    out.content += buffer_.substr(0, open);
    buffer_.erase(0, open + kOpen.size());
    in_call_ = true;
    index_ = -1;
    header_ = Match::kNeedMore;
    sent_ = 0;
    return true;
  }

  // buffer_ holds the call's body so far (after <tool_call>).
  bool call_step(OutputDelta& out) {
    const size_t close = buffer_.find(kClose);
    if (header_ == Match::kNeedMore) scan_header(out);
    if (index_ >= 0) stream_arguments(close, out);
    if (close == std::string::npos) return false;
    end_call(close, out);
    return true;
  }

  void scan_header(OutputDelta& out) {
    std::string name;
    header_ = HeaderScanner(buffer_).scan(name, header_length_);
    if (header_ == Match::kYes && tool_known(name)) index_ = begin_call(name, "", out);
    if (header_ == Match::kYes && index_ < 0) header_ = Match::kNo;  // unknown tool: judged whole at the end
  }

  void stream_arguments(size_t close, OutputDelta& out) {
    const std::string_view body = std::string_view(buffer_).substr(0, close);
    std::string_view region = body.substr(std::min(header_length_, body.size()));
    if (close == std::string::npos)  // a partial "</tool_call>" may end the text
      region.remove_suffix(std::min(region.size(), partial_marker_length(region, {std::string(kClose)})));
    const size_t n = streamable_length(region);
    if (n > sent_) {
      out.add_arguments(index_, std::string(region.substr(sent_, n - sent_)));
      sent_ = n;
    }
  }

  void end_call(size_t close, OutputDelta& out) {
    const std::string body = buffer_.substr(0, close);
    buffer_.erase(0, close + kClose.size());
    in_call_ = false;
    const auto call = nlohmann::json::parse(body, nullptr, false);
    const bool valid = call.is_object() && call.contains("name") && call["name"].is_string() &&
                       call.contains("arguments") && tool_known(call["name"].get<std::string>());
    if (index_ < 0 && valid) {  // keys in another order: the whole call at once
      const auto& args = call["arguments"];
      const int index = begin_call(call["name"].get<std::string>(), "", out);
      out.add_arguments(index, args.is_string() ? args.get<std::string>() : args.dump());
      return;
    }
    // The arguments sent must be JSON by themselves too (not `{...}, "extra": 1`).
    const std::string_view region = std::string_view(body).substr(std::min(header_length_, body.size()));
    if (index_ >= 0 && valid && nlohmann::json::accept(region.substr(0, streamable_length(region)))) return;
    if (index_ >= 0)
      mark_invalid(index_);
    else
      mark_rejected();
    out.content += std::string(kOpen) + body + std::string(kClose);
  }

  std::string buffer_;
  bool in_call_ = false;
  int index_ = -1;  // the current call's index once its first piece was sent
  Match header_ = Match::kNeedMore;
  size_t header_length_ = 0;
  size_t sent_ = 0;  // argument characters sent
};

}  // namespace

std::unique_ptr<ToolCallParser> make_qwen3_parser(ToolParserOptions options) {
  return std::make_unique<Qwen3Parser>(std::move(options));
}

}  // namespace moeserve::chatout
