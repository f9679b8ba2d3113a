// Each subcommand of the moeserve executable lives in its own cmd_*.cc file and is
// registered here in one place.
#pragma once

#include <CLI/CLI.hpp>

namespace moeserve::apps {

void add_generate_command(CLI::App& app);
void add_eval_ppl_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_bench_step_command(CLI::App& app);
void add_bench_sampling_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_restart_command(CLI::App& app);
void add_sweep_command(CLI::App& app);
// tokenize, detokenize, chat-template, bench-tokenizer
void add_tokenizer_commands(CLI::App& app);

}  // namespace moeserve::apps
