// Command-line conveniences for users coming from SGLang and vLLM: vLLM's short `-tp N`
// (CLI11 takes one-letter short names only), and a "did you mean" for unknown flags.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace moeserve::apps {

// argv with vLLM's `-tp N` / `-tp=N` spelled --tensor-parallel-size.
std::vector<std::string> vllm_short_flags(int argc, char** argv);

// The known long flag of `cmd` (or of the subcommand a parse selected) nearest to `unknown`
// by edit distance, "" when none is close (more than a third of the name differs).
std::string nearest_flag(const CLI::App& cmd, const std::string& unknown);

// For an ExtrasError: "unknown flag --x; did you mean --y?" lines for every extra flag, looked
// up in the deepest subcommand that was selected.
std::string suggest_for_extras(const CLI::App& app);

}  // namespace moeserve::apps
