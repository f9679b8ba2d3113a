#include "spec/speculative_options.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace moeserve::spec {

namespace {
constexpr int64_t kDefaultDrafts = 4;
constexpr int64_t kMaxDraftTokens = 64;  // a verify step's tokens per sequence
}  // namespace

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kNgram:
      return "NGRAM";
    case Algorithm::kNextn:
      return "NEXTN";
    default:
      return "NONE";
  }
}

namespace {
Algorithm algorithm_of(const std::string& flag) {
  std::string name = flag;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
  if (name.empty() || name == "NONE") return Algorithm::kNone;
  if (name == "NEXTN" || name == "EAGLE") return Algorithm::kNextn;
  if (name == "EAGLE3" || name == "DFLASH" || name == "STANDALONE")
    fail("--speculative-algorithm {}: not implemented yet (available: NGRAM, NEXTN)", flag);
  MS_CHECK(name == "NGRAM", "--speculative-algorithm '{}': unknown (available: NGRAM, NEXTN)", flag);
  return Algorithm::kNgram;
}
}  // namespace

SpeculativeOptions speculative_options(const SpeculativeFlags& flags) {
  SpeculativeOptions o;
  o.algorithm = algorithm_of(flags.algorithm);
  if (!o.enabled()) {
    MS_CHECK(flags.num_draft_tokens == 0 && flags.num_steps == 0 && !flags.fixed_drafts,
             "--speculative-num-draft-tokens / --speculative-num-steps / --speculative-fixed-drafts need "
             "--speculative-algorithm");
    return o;
  }
  MS_CHECK(flags.num_draft_tokens >= 0 && flags.num_steps >= 0,
           "--speculative-num-draft-tokens and --speculative-num-steps must be >= 0");
  if (flags.num_draft_tokens > 0 && flags.num_steps > 0)
    MS_CHECK(flags.num_draft_tokens == flags.num_steps + 1,
             "--speculative-num-draft-tokens {} with --speculative-num-steps {}: a chain verifies num_steps + 1 "
             "tokens (give one of them)",
             flags.num_draft_tokens, flags.num_steps);
  o.num_draft_tokens = flags.num_draft_tokens > 0 ? flags.num_draft_tokens
                       : flags.num_steps > 0      ? flags.num_steps + 1
                                                  : kDefaultDrafts + 1;
  MS_CHECK(o.num_draft_tokens >= 2 && o.num_draft_tokens <= kMaxDraftTokens,
           "--speculative-num-draft-tokens {} must be in [2, {}] (the last token and at least one draft)",
           o.num_draft_tokens, kMaxDraftTokens);
  o.adaptive = !flags.fixed_drafts;
  o.ngram_min_match_window = flags.ngram_min_match_window;
  o.ngram_max_match_window = flags.ngram_max_match_window;
  MS_CHECK(o.ngram_min_match_window >= 1 && o.ngram_min_match_window <= o.ngram_max_match_window,
           "--speculative-ngram-min-match-window-size {} must be in [1, --speculative-ngram-max-match-window-size {}]",
           o.ngram_min_match_window, o.ngram_max_match_window);
  return o;
}

}  // namespace moeserve::spec
