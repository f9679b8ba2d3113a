// The shipped default model (models/default of the source tree): what `serve`, `generate`
// and `eval-ppl` run when --model is not given.
#pragma once

#include <string>

namespace moeserve::apps {

// The default model's directory: models/default next to the executable's tree (build/bin/..
// /../models/default, or <prefix>/share/moeserve/models/default for an installed binary),
// else in the source tree the binary was built from. An error naming the places looked at,
// and what to pass instead, when none has it.
std::string default_model_directory();

// `spec` itself, or the default model's directory when it is empty.
std::string resolve_model_spec(const std::string& spec);

}  // namespace moeserve::apps
