// load_tokenizer: picks the reader for a model directory.
#include <filesystem>

#include "core/error.h"
#include "tokenizer/loaders.h"

namespace moeserve::tokenizer {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (model_dir == "synthetic" || model_dir.rfind("synthetic:", 0) == 0) {
    return make_builtin_tokenizer(kBuiltinDefaultVocabSize);
  }
  MS_CHECK(fs::is_directory(model_dir),
           "{}: not a directory (expected a model directory with "
           "tokenizer.json or tiktoken.model, or \"synthetic\")",
           model_dir);
  const fs::path dir(model_dir);
  if (fs::exists(dir / "tokenizer.json")) {
    const TokenizerConfig config = read_tokenizer_config(model_dir, /*required=*/false);
    return std::make_unique<Tokenizer>(load_hf_tokenizer_json((dir / "tokenizer.json").string(), config));
  }
  if (fs::exists(dir / "tiktoken.model")) {
    const TokenizerConfig config = read_tokenizer_config(model_dir, /*required=*/true);
    return std::make_unique<Tokenizer>(load_tiktoken_model((dir / "tiktoken.model").string(), config));
  }
  fail("{}: no tokenizer.json or tiktoken.model in the directory", model_dir);
}

}  // namespace moeserve::tokenizer
