// moeserve eval-ppl: perplexity of a model over a text file, with the sliding window of
// Hugging Face's perplexity guide (lm-eval's rolling log-likelihood with overlap): windows of
// --context tokens start every --stride tokens, and each scores only the tokens past the
// previous window's end, so every token after the first is scored once, with up to
// context - stride tokens of history. Logits come from the forward that generate runs
// (runtime::generate with the prompts' logits), in batches of windows.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/default_model.h"
#include "apps/plan_cli.h"
#include "core/error.h"
#include "model/model_source.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::apps {

namespace {

struct EvalPplArgs {
  std::string model;
  std::string text_path;
  int64_t context = 0;  // 0: min(1024, the model's max_position_embeddings)
  int64_t stride = 0;   // 0: context / 2
  int64_t batch = 8;    // windows per forward
  std::string backend = "cpu";
  PlanCliArgs plan;
};

// One window: tokens [begin, end) of the text; rows from `first_row` on are scored (row r
// predicts token begin + r + 1).
struct Window {
  int64_t begin = 0, end = 0, first_row = 0;
};

std::vector<Window> sliding_windows(int64_t tokens, int64_t context, int64_t stride) {
  std::vector<Window> windows;
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < tokens; begin += stride) {
    const int64_t end = std::min(begin + context, tokens);
    // The window's tokens past prev_end are scored: token j from row j - 1 (j >= 1).
    const int64_t first_token = prev_end - begin;
    windows.push_back({begin, end, std::max<int64_t>(first_token - 1, 0)});
    prev_end = end;
    if (end == tokens) break;
  }
  return windows;
}

// -log softmax(row)[target], in double.
double token_nll(const float* row, int64_t vocab, int32_t target) {
  const float top = *std::max_element(row, row + vocab);
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - top);
  return std::log(sum) + top - row[target];
}

struct NllSum {
  double nll = 0.0;
  int64_t tokens = 0;
};

// Adds the scored rows of one window's logits [len, vocab].
void add_window(const Window& w, const Tensor& logits, const std::vector<int32_t>& ids, NllSum& sum) {
  const int64_t vocab = logits.dim(1);
  for (int64_t r = w.first_row; r + 1 < w.end - w.begin; ++r) {
    sum.nll += token_nll(logits.f32() + r * vocab, vocab, ids[w.begin + r + 1]);
    ++sum.tokens;
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MS_CHECK(in.good(), "--text {}: cannot open", path);
  return {std::istreambuf_iterator<char>(in), {}};
}

void run_eval_ppl(const EvalPplArgs& args) {
  const ModelSource model = open_model(resolve_model_spec(args.model));
  MS_CHECK(!model.synthetic && !model.directory.empty(),
           "eval-ppl: model '{}' has no tokenizer (give a model directory)", model.spec);
  const auto tok = tokenizer::load_tokenizer(model.directory);
  const std::vector<int32_t> ids = tok->encode(read_text(args.text_path), /*allow_special=*/false);
  MS_CHECK(ids.size() >= 2, "--text {}: {} tokens; perplexity needs at least 2", args.text_path, ids.size());
  const int64_t context =
      args.context > 0 ? args.context : std::min<int64_t>(1024, model.config.max_position_embeddings);
  const int64_t stride = args.stride > 0 ? args.stride : std::max<int64_t>(1, context / 2);
  MS_CHECK(context >= 2, "--context {}: at least 2 tokens", context);
  MS_CHECK(stride <= context, "--stride {} is larger than --context {} (tokens would go unscored)", stride, context);
  MS_CHECK(args.batch >= 1, "--batch {}: at least 1", args.batch);

  runtime::EngineOptions options;
  options.backend = args.backend;
  options.plan = plan_for_model(args.plan, model.config, /*bytes_per_element=*/args.backend == "cuda" ? 2 : 4);
  const std::vector<Window> windows = sliding_windows(static_cast<int64_t>(ids.size()), context, stride);
  std::vector<runtime::GenerateRequest> first_batch;
  NllSum sum;
  std::unique_ptr<runtime::Engine> engine;
  for (size_t start = 0; start < windows.size(); start += args.batch) {
    const size_t stop = std::min(windows.size(), start + static_cast<size_t>(args.batch));
    std::vector<runtime::GenerateRequest> requests;
    for (size_t i = start; i < stop; ++i) {
      runtime::GenerateRequest r;
      r.prompt.assign(ids.begin() + windows[i].begin, ids.begin() + windows[i].end);
      r.max_new_tokens = 1;
      requests.push_back(std::move(r));
    }
    if (!engine) {  // sized for the first (longest) batch of windows
      options.num_pages = runtime::kv_pages_for(requests, options.page_size);
      engine = std::make_unique<runtime::Engine>(model, options);
    }
    const auto results = runtime::generate(*engine, requests, {.prompt_logits = true});
    for (size_t i = start; i < stop; ++i) add_window(windows[i], results[i - start].prompt_logits, ids, sum);
  }
  const double mean = sum.nll / static_cast<double>(sum.tokens);
  nlohmann::ordered_json out = {{"model", model.spec},       {"text", args.text_path}, {"perplexity", std::exp(mean)},
                                {"nll_per_token", mean},     {"tokens", ids.size()},   {"scored_tokens", sum.tokens},
                                {"windows", windows.size()}, {"context", context},     {"stride", stride}};
  std::printf("%s\n", out.dump().c_str());
}

}  // namespace

void add_eval_ppl_command(CLI::App& app) {
  auto args = std::make_shared<EvalPplArgs>();
  CLI::App* cmd = app.add_subcommand(
      "eval-ppl", "Perplexity over a text file (sliding window, as HF's perplexity guide); prints one JSON line");
  cmd->add_option("--model,-m", args->model, "A model directory (default: the shipped default model)");
  cmd->add_option("--text", args->text_path, "UTF-8 text file, encoded without special tokens")->required();
  cmd->add_option("--context", args->context, "Window length in tokens (default min(1024, max_position_embeddings))");
  cmd->add_option("--stride", args->stride, "Tokens between window starts (default context / 2)");
  cmd->add_option("--batch", args->batch, "Windows per forward")->capture_default_str();
  cmd->add_option("--backend", args->backend, "cpu (fp32 reference), cpu-bf16 or cuda")->capture_default_str();
  cmd->add_option("--plan", args->plan.preset, "Parallel plan preset (single, tp2, ep4, ...); default single");
  add_plan_flags(cmd, args->plan);
  cmd->callback([args] { run_eval_ppl(*args); });
}

}  // namespace moeserve::apps
