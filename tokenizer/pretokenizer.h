// Pre-tokenization: cuts a text segment (between added tokens) into the pieces that BPE merges
// separately. A chain of steps, each applied to every piece of the previous step:
//  - Split: a regex, and what to do with its matches (Hugging Face's SplitDelimiterBehavior,
//    plus kMatchesOnly for tiktoken, which keeps the matches and drops the text between them);
//  - ByteLevel: Hugging Face's ByteLevel pre-tokenizer (optional prefix space, optional GPT-2
//    split regex). Pieces stay raw bytes: the byte-level alphabet is applied to the vocab instead.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace moeserve::tokenizer {

enum class SplitBehavior {
  kIsolated,            // matches and gaps are separate pieces
  kRemoved,             // gaps are pieces, matches vanish
  kMergedWithPrevious,  // a match joins the piece before it
  kMergedWithNext,      // a match joins the piece after it
  kContiguous,          // consecutive matches (or gaps) form one piece
  kMatchesOnly,         // matches are pieces, gaps vanish (tiktoken)
};

class PreTokenizer {
 public:
  void add_split(Regex regex, SplitBehavior behavior, bool invert);
  void add_byte_level(bool add_prefix_space, bool use_regex);
  bool empty() const { return steps_.empty(); }

  // Cuts `text` into `pieces` (cleared first). Pieces view `text`, or `arena` for pieces that a
  // step had to rewrite (a prefix space).
  void split(std::string_view text, std::vector<std::string_view>& pieces, std::deque<std::string>& arena) const;

 private:
  struct Step {
    enum class Kind { kSplit, kByteLevel } kind;
    Regex regex;
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;
    bool use_regex = false;
  };
  void apply_split(const Step& step, std::string_view piece, std::vector<std::string_view>& out) const;

  std::vector<Step> steps_;
};

// The GPT-2 split regex that ByteLevel uses when "use_regex" is true.
extern const char* const kGpt2SplitPattern;

}  // namespace moeserve::tokenizer
