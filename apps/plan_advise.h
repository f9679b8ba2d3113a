// `moeserve plan advise` and `moeserve plan calibrate`, subcommands of `plan`.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace moeserve::apps {

void add_plan_advise_command(CLI::App& plan);
void add_plan_calibrate_command(CLI::App& plan);

// Where --hardware NAME is looked up: $MOESERVE_PROFILES_DIR, else the source tree's perf/profiles.
std::string profiles_dir();

}  // namespace moeserve::apps
