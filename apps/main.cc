// moeserve: inference server for DeepSeek-V3-family Mixture-of-Experts models.
#include <cstdio>
#include <exception>

#include "apps/cli_compat.h"
#include "apps/commands.h"
#include "apps/tokenizer_export.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"moeserve: serve DeepSeek-V3 / Kimi K2 family MoE models under any parallel plan"};
  app.require_subcommand(1);
  moeserve::apps::add_generate_command(app);
  moeserve::apps::add_eval_ppl_command(app);
  moeserve::apps::add_inspect_command(app);
  moeserve::apps::add_plan_command(app);
  moeserve::apps::add_serve_command(app);
  moeserve::apps::add_bench_step_command(app);
  moeserve::apps::add_bench_sampling_command(app);
  moeserve::apps::add_bench_command(app);
  moeserve::apps::add_restart_command(app);
  moeserve::apps::add_sweep_command(app);
  moeserve::apps::add_tokenizer_commands(app);
  moeserve::apps::add_tokenizer_export_command(app);
  // vLLM's -tp N becomes --tensor-parallel-size N (CLI11 has one-letter short flags only).
  const std::vector<std::string> args = moeserve::apps::vllm_short_flags(argc, argv);
  std::vector<char*> arg_ptrs;
  for (const std::string& arg : args) arg_ptrs.push_back(const_cast<char*>(arg.c_str()));
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::ExtrasError& e) {
    std::fputs(moeserve::apps::suggest_for_extras(app).c_str(), stderr);
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const moeserve::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
