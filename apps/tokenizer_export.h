// `moeserve tokenizer export DIR`: the built-in tokenizer of the synthetic models as Hugging Face
// files (apps/cmd_tokenizer_export.cc).
#pragma once

#include <CLI/CLI.hpp>

namespace moeserve::apps {

void add_tokenizer_export_command(CLI::App& app);

}  // namespace moeserve::apps
