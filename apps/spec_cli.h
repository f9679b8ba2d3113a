// The speculative-decoding flags of `generate` and `serve`, named as SGLang names them.
#pragma once

#include <CLI/CLI.hpp>

#include "spec/speculative_options.h"

namespace moeserve::apps {

// Adds --speculative-algorithm, --speculative-num-draft-tokens, --speculative-num-steps and
// the NGRAM match-window knobs; spec::speculative_options validates them.
void add_speculative_flags(CLI::App* cmd, spec::SpeculativeFlags& flags);

}  // namespace moeserve::apps
