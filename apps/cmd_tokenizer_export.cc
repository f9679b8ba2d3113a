// moeserve tokenizer export DIR --model synthetic:NAME: the built-in byte tokenizer of the
// synthetic models as Hugging Face files (tokenizer.json + tokenizer_config.json), so that other
// clients (transformers, SGLang's and vLLM's benchmarks) count the same tokens the server does.
// Byte b is id b (a byte-level BPE without merges), ids 256 and up are special added tokens.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/default_model.h"
#include "apps/tokenizer_export.h"
#include "core/error.h"
#include "model/model_source.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::apps {

namespace {

using Json = nlohmann::ordered_json;

// GPT-2's byte-level alphabet: every byte as a printable code point, encoded in UTF-8.
std::string byte_level_char(unsigned char b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
  uint32_t cp = b;
  if (!printable) {  // the unprintable bytes, in order, become U+0100, U+0101, ...
    uint32_t n = 0;
    for (uint32_t c = 0; c < b; ++c)
      if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) ++n;
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

Json tokenizer_json(const tokenizer::Tokenizer& tok) {
  Json vocab = Json::object(), added = Json::array();
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const std::string& bytes = tok.token_bytes(id);
    if (tok.token_kind(id) == tokenizer::TokenKind::kNormal) {
      MS_CHECK(bytes.size() == 1,
               "tokenizer export: token {} is {} bytes; only the built-in byte tokenizer "
               "(one byte per token, no merges) is exported (a model directory has its tokenizer.json already)",
               id, bytes.size());
      vocab[byte_level_char(static_cast<unsigned char>(bytes[0]))] = id;
    } else {
      vocab[bytes] = id;
      added.push_back({{"id", id},
                       {"content", bytes},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", tok.token_kind(id) == tokenizer::TokenKind::kSpecial}});
    }
  }
  const Json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", nullptr},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", Json::array()}}}};
}

void write_json(const std::filesystem::path& path, const Json& json) {
  std::ofstream out(path);
  MS_CHECK(out.good(), "{}: cannot open for writing", path.string());
  out << json.dump(2) << "\n";
  MS_CHECK(out.good(), "{}: write failed", path.string());
}

void run_export(const std::string& dir, const std::string& model_spec) {
  const ModelSource model = open_model(resolve_model_spec(model_spec));
  MS_CHECK(model.synthetic, "tokenizer export: '{}' is a model directory: its tokenizer files are in {}", model.spec,
           model.directory);
  const auto tok = tokenizer::make_builtin_tokenizer(model.config.vocab_size);
  std::filesystem::create_directories(dir);
  write_json(std::filesystem::path(dir) / "tokenizer.json", tokenizer_json(*tok));
  write_json(std::filesystem::path(dir) / "tokenizer_config.json",
             {{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"bos_token", tok->bos_token()},
              {"eos_token", tok->eos_token()},
              {"add_bos_token", false},
              {"add_eos_token", false},
              {"clean_up_tokenization_spaces", false},
              {"model_max_length", model.config.max_position_embeddings}});
  std::printf("wrote %s/tokenizer.json and tokenizer_config.json (%lld ids)\n", dir.c_str(),
              static_cast<long long>(tok->vocab_size()));
}

}  // namespace

void add_tokenizer_export_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto model = std::make_shared<std::string>("synthetic:tiny");
  CLI::App* group = app.add_subcommand("tokenizer", "Tokenizer files for other clients");
  group->require_subcommand(1);
  CLI::App* cmd = group->add_subcommand(
      "export", "Write tokenizer.json + tokenizer_config.json of a synthetic model's built-in tokenizer to DIR");
  cmd->add_option("dir", *dir, "Output directory (created)")->required();
  cmd->add_option("--model,-m,--model-path", *model, "synthetic:NAME[:layers=N] (its vocabulary size)")
      ->capture_default_str();
  cmd->callback([dir, model] { run_export(*dir, *model); });
}

}  // namespace moeserve::apps
