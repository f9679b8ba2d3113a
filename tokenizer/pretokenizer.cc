#include "tokenizer/pretokenizer.h"

#include <algorithm>

namespace moeserve::tokenizer {

const char* const kGpt2SplitPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void PreTokenizer::add_split(Regex regex, SplitBehavior behavior, bool invert) {
  steps_.push_back(Step{Step::Kind::kSplit, std::move(regex), behavior, invert});
}

void PreTokenizer::add_byte_level(bool add_prefix_space, bool use_regex) {
  Step step{Step::Kind::kByteLevel, Regex(kGpt2SplitPattern, "ByteLevel pre-tokenizer")};
  step.add_prefix_space = add_prefix_space;
  step.use_regex = use_regex;
  steps_.push_back(std::move(step));
}

namespace {

struct Segment {
  size_t begin, end;
  bool is_match;
};

}  // namespace

void PreTokenizer::apply_split(const Step& step, std::string_view piece, std::vector<std::string_view>& out) const {
  if (step.behavior == SplitBehavior::kMatchesOnly && !step.invert) {
    step.regex.for_each_match(piece, [&](size_t b, size_t e) { out.push_back(piece.substr(b, e - b)); });
    return;
  }
  // Matches and the gaps between them, in order, covering the whole piece.
  thread_local std::vector<Segment> segments;
  segments.clear();
  size_t previous_end = 0;
  step.regex.for_each_match(piece, [&](size_t b, size_t e) {
    if (b > previous_end) segments.push_back({previous_end, b, step.invert});
    segments.push_back({b, e, !step.invert});
    previous_end = e;
  });
  if (previous_end < piece.size()) segments.push_back({previous_end, piece.size(), step.invert});

  // The rules below follow Hugging Face's NormalizedString::split.
  thread_local std::vector<Segment> merged;
  merged.clear();
  bool previous_match = false;
  switch (step.behavior) {
    case SplitBehavior::kIsolated:
      merged = segments;
      break;
    case SplitBehavior::kRemoved:
    case SplitBehavior::kMatchesOnly:
      for (const Segment& s : segments) {
        const bool keep = step.behavior == SplitBehavior::kRemoved ? !s.is_match : s.is_match;
        if (keep) merged.push_back(s);
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Segment& s : segments) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case SplitBehavior::kContiguous:
      for (const Segment& s : segments) {
        if (s.is_match == previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
  }
  for (const Segment& s : merged) out.push_back(piece.substr(s.begin, s.end - s.begin));
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces,
                         std::deque<std::string>& arena) const {
  pieces.clear();
  if (!text.empty()) pieces.push_back(text);
  thread_local std::vector<std::string_view> next;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view piece : pieces) {
      if (step.kind == Step::Kind::kSplit) {
        apply_split(step, piece, next);
        continue;
      }
      if (step.add_prefix_space && (piece.empty() || piece.front() != ' ')) {
        std::string& prefixed = arena.emplace_back();
        prefixed.reserve(piece.size() + 1);
        prefixed += ' ';
        prefixed.append(piece);
        piece = prefixed;
      }
      if (step.use_regex) {
        apply_split(step, piece, next);  // Isolated, as Hugging Face's ByteLevel does
      } else {
        next.push_back(piece);
      }
    }
    pieces.swap(next);
  }
}

}  // namespace moeserve::tokenizer
