#include "apps/spec_cli.h"

namespace moeserve::apps {

void add_speculative_flags(CLI::App* cmd, spec::SpeculativeFlags& flags) {
  cmd->add_option(
      "--speculative-algorithm", flags.algorithm,
      "Speculative decoding: NGRAM (drafts by suffix matching over each request's prompt and output) or "
      "NEXTN (the model's MTP layer, chained; EAGLE is the same); EAGLE3 and DFLASH are not implemented yet");
  cmd->add_option("--speculative-num-draft-tokens", flags.num_draft_tokens,
                  "Tokens verified per sequence and step, the last accepted one included (default: num-steps + 1, "
                  "else 5)");
  cmd->add_option("--speculative-num-steps", flags.num_steps, "Draft tokens per step (a chain: num-draft-tokens - 1)");
  cmd->add_flag("--speculative-fixed-drafts", flags.fixed_drafts,
                "Verify num-draft-tokens - 1 drafts every step; by default each step's drafts (down to none) are "
                "chosen from the measured cost of earlier steps, so that speculation never costs more than it gains");
  cmd->add_option("--speculative-ngram-min-match-window-size", flags.ngram_min_match_window,
                  "NGRAM: the shortest suffix matched")
      ->capture_default_str();
  cmd->add_option("--speculative-ngram-max-match-window-size", flags.ngram_max_match_window,
                  "NGRAM: the longest suffix matched (tried first)")
      ->capture_default_str();
}

}  // namespace moeserve::apps
