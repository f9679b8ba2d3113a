#include "apps/cli_compat.h"

#include <algorithm>

namespace moeserve::apps {

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

const CLI::App& deepest_selected(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands())
    if (sub != nullptr) return deepest_selected(*sub);
  return app;
}

}  // namespace

std::vector<std::string> vllm_short_flags(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (std::string& arg : args) {
    if (arg == "-tp")
      arg = "--tensor-parallel-size";
    else if (arg.rfind("-tp=", 0) == 0)
      arg = "--tensor-parallel-size=" + arg.substr(4);
  }
  return args;
}

std::string nearest_flag(const CLI::App& cmd, const std::string& unknown) {
  const std::string name = unknown.substr(0, unknown.find('='));
  std::string best;
  size_t best_distance = name.size() / 3 + 1;
  for (const CLI::Option* option : cmd.get_options()) {
    for (const std::string& long_name : option->get_lnames()) {
      const size_t d = edit_distance(name, "--" + long_name);
      if (d < best_distance) {
        best_distance = d;
        best = "--" + long_name;
      }
    }
  }
  return best;
}

std::string suggest_for_extras(const CLI::App& app) {
  const CLI::App& cmd = deepest_selected(app);
  // CLI11 leaves an extra on the subcommand or passes it up to the parent, by where it stood.
  std::vector<std::string> extras = app.remaining();
  for (const CLI::App* level = &app; level != &cmd;) {
    level = level->get_subcommands().front();
    for (const std::string& extra : level->remaining()) extras.push_back(extra);
  }
  std::string out;
  for (const std::string& extra : extras) {
    if (extra.rfind("--", 0) != 0) continue;
    const std::string nearest = nearest_flag(cmd, extra);
    out += "unknown flag " + extra.substr(0, extra.find('='));
    out += nearest.empty() ? "\n" : "; did you mean " + nearest + "?\n";
  }
  return out;
}

}  // namespace moeserve::apps
