// What speculative decoding runs, named as SGLang names its flags
// (--speculative-algorithm, --speculative-num-draft-tokens, --speculative-num-steps,
// --speculative-ngram-{min,max}-match-window-size). Chains only (SGLang's topk 1): a step
// verifies num_draft_tokens tokens per sequence, the last accepted one and num_steps drafts.
#pragma once

#include <cstdint>
#include <string>

namespace moeserve::spec {

enum class Algorithm { kNone, kNgram, kNextn };

struct SpeculativeOptions {
  Algorithm algorithm = Algorithm::kNone;
  int64_t num_draft_tokens = 0;         // tokens verified per sequence and step, the last accepted one included
  int64_t ngram_min_match_window = 1;   // shortest suffix NGRAM matches
  int64_t ngram_max_match_window = 12;  // longest suffix NGRAM matches (tried first)
  // Each step's drafts chosen from the measured costs of earlier steps (spec/draft_budget.h),
  // up to num_draft_tokens - 1; false: num_draft_tokens - 1 every step, as SGLang runs.
  bool adaptive = false;
  bool enabled() const { return algorithm != Algorithm::kNone; }
  // Drafted tokens per sequence and step.
  int64_t max_drafts() const { return enabled() ? num_draft_tokens - 1 : 0; }
};

// The flags as given (0: not given).
struct SpeculativeFlags {
  std::string algorithm = "";  // "" or "NONE": off
  int64_t num_draft_tokens = 0;
  int64_t num_steps = 0;
  int64_t ngram_min_match_window = 1;
  int64_t ngram_max_match_window = 12;
  bool fixed_drafts = false;  // --speculative-fixed-drafts: no adaptive budget
};

// Validated options; errors name the flag. NEXTN is the model's MTP layer (runtime/mtp_drafter.h);
// EAGLE means NEXTN too, as SGLang runs DeepSeek-V3's MTP under either name. Algorithms not
// implemented yet (EAGLE3, DFLASH, STANDALONE) are refused by name. num_draft_tokens defaults to num_steps + 1,
// num_steps to num_draft_tokens - 1, both to 4 drafts when neither is given.
SpeculativeOptions speculative_options(const SpeculativeFlags& flags);

const char* algorithm_name(Algorithm algorithm);

}  // namespace moeserve::spec
