// moeserve tokenize / detokenize / chat-template / bench-tokenizer: inspect a model's tokenizer
// and chat template, and measure encode throughput.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/cli_util.h"
#include "apps/commands.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/json_file.h"
#include "tokenizer/python_json.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::apps {
namespace {

using tokenizer::load_tokenizer;

constexpr const char* kTokenizerHelp =
    "model directory (tokenizer.json, or tiktoken.model + tokenizer_config.json), or \"synthetic\"";

void write_exactly(const std::string& text) { std::fwrite(text.data(), 1, text.size(), stdout); }

// Text from --text or --file (exactly one of them).
std::string input_text(const std::string& text, const std::string& file) {
  MS_CHECK(text.empty() != file.empty(), "give exactly one of --text and --file");
  return file.empty() ? text : tokenizer::read_text_file(file);
}

nlohmann::ordered_json parse_json_option(const std::string& text, const char* option) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{} is not valid JSON: {}", option, e.what());
  }
}

// Calls on_line(line) for each line of a file ('\n'-terminated; empty lines included).
template <typename F>
void for_each_line(const std::string& path, F&& on_line) {
  const std::string content = tokenizer::read_text_file(path);
  size_t pos = 0;
  while (pos < content.size()) {
    size_t end = content.find('\n', pos);
    if (end == std::string::npos) end = content.size();
    on_line(content.substr(pos, end - pos));
    pos = end + 1;
  }
}

std::vector<int32_t> parse_ids(const std::string& text, const char* what) {
  return text.empty() ? std::vector<int32_t>{} : parse_id_list(text, what);
}

void add_tokenize(CLI::App& app) {
  struct Options {
    std::string tokenizer, text, file, jsonl;
    bool allow_special = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text, comma-separated");
  cmd->add_option("--tokenizer", opt->tokenizer, kTokenizerHelp)->required();
  cmd->add_option("--text", opt->text, "text to encode");
  cmd->add_option("--file", opt->file, "file whose whole content is encoded");
  cmd->add_option("--jsonl", opt->jsonl, "file of JSON strings, one per line: prints one id line for each");
  cmd->add_flag("--allow-special", opt->allow_special,
                "turn special-token text such as <|im_end|> into the special token");
  cmd->callback([opt] {
    const auto tok = load_tokenizer(opt->tokenizer);
    if (!opt->jsonl.empty()) {
      MS_CHECK(opt->text.empty() && opt->file.empty(), "--jsonl excludes --text and --file");
      for_each_line(opt->jsonl, [&](const std::string& line) {
        const auto text = parse_json_option(line, "a --jsonl line");
        MS_CHECK(text.is_string(), "{}: every line must be a JSON string", opt->jsonl);
        std::printf("%s\n", join_ids(tok->encode(text.get<std::string>(), opt->allow_special)).c_str());
      });
      return;
    }
    std::printf("%s\n", join_ids(tok->encode(input_text(opt->text, opt->file), opt->allow_special)).c_str());
  });
}

// The text of `ids`: whole, or as the chunks of the incremental detokenizer (a JSON list).
std::string detokenize(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids, bool stream,
                       bool skip_special) {
  if (!stream) return tok.decode(ids, skip_special);
  tokenizer::IncrementalDetokenizer detok(tok, skip_special);
  nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
  for (int32_t id : ids) chunks.push_back(detok.push(id));
  chunks.push_back(detok.flush());
  return tokenizer::python_json_dumps(chunks);
}

void add_detokenize(CLI::App& app) {
  struct Options {
    std::string tokenizer, ids, ids_file;
    bool stream = false, skip_special = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd =
      app.add_subcommand("detokenize",
                         "Print the text of token ids (exactly, no newline added); --stream prints the chunks a "
                         "streaming detokenizer emits, as a JSON list");
  cmd->add_option("--tokenizer", opt->tokenizer, kTokenizerHelp)->required();
  cmd->add_option("--ids", opt->ids, "comma-separated token ids");
  cmd->add_option("--ids-file", opt->ids_file,
                  "file with one comma-separated id list per line: prints one JSON line for each (the text "
                  "as a JSON string, or with --stream the list of chunks)");
  cmd->add_flag("--stream", opt->stream, "feed the ids one by one to the incremental detokenizer");
  cmd->add_flag("--skip-special", opt->skip_special, "leave special tokens out of the text");
  cmd->callback([opt] {
    const auto tok = load_tokenizer(opt->tokenizer);
    if (!opt->ids_file.empty()) {
      MS_CHECK(opt->ids.empty(), "--ids-file excludes --ids");
      for_each_line(opt->ids_file, [&](const std::string& line) {
        const std::string text =
            detokenize(*tok, parse_ids(line, "an --ids-file line"), opt->stream, opt->skip_special);
        std::printf("%s\n", opt->stream ? text.c_str() : tokenizer::python_json_dumps(text).c_str());
      });
      return;
    }
    const std::vector<int32_t> ids = parse_ids(opt->ids, "--ids");
    const std::string text = detokenize(*tok, ids, opt->stream, opt->skip_special);
    if (opt->stream) {
      std::printf("%s\n", text.c_str());
    } else {
      write_exactly(text);
    }
  });
}

void add_chat_template(CLI::App& app) {
  struct Options {
    std::string tokenizer, template_name, messages, tools, kwargs;
    bool add_generation_prompt = false, continue_final_message = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "chat-template", "Render a conversation with the model's chat template (printed exactly, no newline added)");
  cmd->add_option("--tokenizer", opt->tokenizer, kTokenizerHelp)->required();
  cmd->add_option("--chat-template", opt->template_name,
                  "a built-in template name (" + fmt::format("{}", fmt::join(tokenizer::chat_template_names(), ", ")) +
                      ") or a .jinja file, instead of the model's own template");
  cmd->add_option("--messages", opt->messages, "the conversation as a JSON list of {role, content, ...}")->required();
  cmd->add_option("--tools", opt->tools, "the tools as a JSON list (OpenAI format)");
  cmd->add_flag("--add-generation-prompt", opt->add_generation_prompt, "end with the assistant's turn opening");
  cmd->add_flag("--continue-final-message", opt->continue_final_message, "end inside the final message (vLLM's)");
  cmd->add_option("--chat-template-kwargs", opt->kwargs, "a JSON object of extra template variables");
  cmd->callback([opt] {
    const auto tok = load_tokenizer(opt->tokenizer);
    tokenizer::ChatRequest request;
    request.messages = parse_json_option(opt->messages, "--messages");
    if (!opt->tools.empty()) request.tools = parse_json_option(opt->tools, "--tools");
    request.add_generation_prompt = opt->add_generation_prompt;
    request.continue_final_message = opt->continue_final_message;
    if (!opt->kwargs.empty()) request.template_kwargs = parse_json_option(opt->kwargs, "--chat-template-kwargs");
    write_exactly(tokenizer::render_chat(*tok, request, opt->template_name));
  });
}

void add_bench_tokenizer(CLI::App& app) {
  struct Options {
    std::string tokenizer, file;
    int repeat = 5;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("bench-tokenizer",
                                     "Measure single-threaded encode throughput on a file (best of --repeat runs)");
  cmd->add_option("--tokenizer", opt->tokenizer, kTokenizerHelp)->required();
  cmd->add_option("--file", opt->file, "UTF-8 text file, encoded whole (special-token text stays text)")->required();
  cmd->add_option("--repeat", opt->repeat, "number of timed runs")->check(CLI::PositiveNumber);
  cmd->callback([opt] {
    const auto tok = load_tokenizer(opt->tokenizer);
    const std::string text = tokenizer::read_text_file(opt->file);
    size_t tokens = 0;
    double best_seconds = 0;
    for (int run = 0; run < opt->repeat; ++run) {
      const auto start = std::chrono::steady_clock::now();
      tokens = tok->encode(text, /*allow_special=*/false).size();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (run == 0 || seconds < best_seconds) best_seconds = seconds;
    }
    std::printf("bytes=%zu tokens=%zu best_seconds=%.6f encode_MBps=%.2f\n", text.size(), tokens, best_seconds,
                static_cast<double>(text.size()) / 1e6 / best_seconds);
  });
}

}  // namespace

void add_tokenizer_commands(CLI::App& app) {
  add_tokenize(app);
  add_detokenize(app);
  add_chat_template(app);
  add_bench_tokenizer(app);
}

}  // namespace moeserve::apps
