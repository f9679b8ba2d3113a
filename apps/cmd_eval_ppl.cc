// moeserve eval-ppl: perplexity of a model over a text file, with the sliding window of
// Hugging Face's perplexity guide (lm-eval's rolling log-likelihood with overlap): windows of
// --context tokens start every --stride tokens, and each scores only the tokens past the
// previous window's end, so every token after the first is scored once, with up to
// context - stride tokens of history. Logits come from the forward that generate runs
// (runtime::generate with the prompts' logits), in batches of windows. With --head mtp the
// model's MTP layer scores instead (DeepSeek-V3's multi-token prediction): row r, knowing the
// token after it, predicts the one after that, so token j is scored from row j - 2; the windows
// run as one prefill step each batch, the tokens' next tokens given as ForwardBatch::mtp_tokens.
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
  std::string head = "main";  // or "mtp"
  std::string kv_cache_dtype = "auto";
  PlanCliArgs plan;
};

// One window: tokens [begin, end) of the text; rows from `first_row` on are scored (row r
// predicts token begin + r + lead: lead 1 for the main head, 2 for the MTP head).
struct Window {
  int64_t begin = 0, end = 0, first_row = 0;
};

std::vector<Window> sliding_windows(int64_t tokens, int64_t context, int64_t stride, int64_t lead) {
  std::vector<Window> windows;
  int64_t prev_end = 0;
  for (int64_t begin = 0; begin < tokens; begin += stride) {
    const int64_t end = std::min(begin + context, tokens);
    // The window's tokens past prev_end are scored: token j from row j - lead (j >= lead).
    const int64_t first_token = prev_end - begin;
    windows.push_back({begin, end, std::max<int64_t>(first_token - lead, 0)});
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
void add_window(const Window& w, const float* logits, int64_t vocab, int64_t lead, const std::vector<int32_t>& ids,
                NllSum& sum) {
  for (int64_t r = w.first_row; r + lead < w.end - w.begin; ++r) {
    sum.nll += token_nll(logits + r * vocab, vocab, ids[w.begin + r + lead]);
    ++sum.tokens;
  }
}

// The MTP head's logits [len, vocab] of each window in `batch` (a prefill of each on its own
// pages, one step). The next token of a window's last token is outside the window: it gets its
// own id, and its row (which would predict beyond the window) is not scored.
std::vector<Tensor> mtp_window_logits(runtime::Engine& engine, const std::vector<std::vector<int32_t>>& batch) {
  const int64_t page_size = engine.options().page_size;
  step::StepPlan plan;
  step::ReplicaBatch& rb = plan.micro_batches.emplace_back().replicas.emplace_back();
  size_t longest = 0;
  for (const auto& w : batch) longest = std::max(longest, w.size());
  rb.batch.max_pages_per_seq = (static_cast<int64_t>(longest) + page_size - 1) / page_size;
  int32_t next_page = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& w = batch[i];
    std::vector<int32_t> pages((w.size() + page_size - 1) / page_size);
    for (auto& page : pages) page = next_page++;
    step::append_sequence(rb, i, w, 0, static_cast<int64_t>(w.size()), pages, page_size, step::LogitRows::kEvery);
    rb.batch.mtp_tokens.insert(rb.batch.mtp_tokens.end(), w.begin() + 1, w.end());
    rb.batch.mtp_tokens.push_back(w.back());
  }
  const std::vector<size_t> first_row(rb.first_row.begin(), rb.first_row.end());
  const runtime::StepOutputs out = engine.wait(engine.submit(std::move(plan)));
  const Tensor& rows = out.rows.at(0).at(0);  // [all windows' tokens, vocab]
  const int64_t vocab = rows.dim(1);
  std::vector<Tensor> logits;
  for (size_t i = 0; i < batch.size(); ++i) {
    Tensor t(DType::F32, {static_cast<int64_t>(batch[i].size()), vocab});
    std::copy_n(rows.f32() + first_row[i] * vocab, t.numel(), t.f32());
    logits.push_back(std::move(t));
  }
  return logits;
}

// Each window's logits [len, vocab] under --head: the main head's through runtime::generate,
// the MTP head's by mtp_window_logits.
std::vector<Tensor> window_logits(runtime::Engine& engine, const std::vector<runtime::GenerateRequest>& requests,
                                  bool mtp) {
  std::vector<Tensor> logits;
  if (mtp) {
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& r : requests) prompts.push_back(r.prompt);
    return mtp_window_logits(engine, prompts);
  }
  for (auto& result : runtime::generate(engine, requests, {.prompt_logits = true}))
    logits.push_back(std::move(result.prompt_logits));
  return logits;
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
  MS_CHECK(args.head == "main" || args.head == "mtp", "--head '{}': main or mtp", args.head);
  const bool mtp = args.head == "mtp";
  const int64_t lead = mtp ? 2 : 1;
  MS_CHECK(!mtp || model.config.num_nextn_predict_layers >= 1,
           "--head mtp: model '{}' has no MTP layer (num_nextn_predict_layers is {})", model.spec,
           model.config.num_nextn_predict_layers);

  runtime::EngineOptions options;
  options.backend = args.backend;
  options.plan = plan_for_model(args.plan, model.config, /*bytes_per_element=*/args.backend == "cuda" ? 2 : 4);
  options.run.mtp = mtp;
  options.kv_cache_fp8 = kv_cache_fp8(args.kv_cache_dtype);
  const std::vector<Window> windows = sliding_windows(static_cast<int64_t>(ids.size()), context, stride, lead);
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
    const std::vector<Tensor> logits = window_logits(*engine, requests, mtp);
    for (size_t i = start; i < stop; ++i)
      add_window(windows[i], logits[i - start].f32(), logits[i - start].dim(1), lead, ids, sum);
  }
  const double mean = sum.nll / static_cast<double>(sum.tokens);
  nlohmann::ordered_json out = {{"model", model.spec},
                                {"text", args.text_path},
                                {"head", args.head},
                                {"perplexity", std::exp(mean)},
                                {"nll_per_token", mean},
                                {"tokens", ids.size()},
                                {"scored_tokens", sum.tokens},
                                {"windows", windows.size()},
                                {"context", context},
                                {"stride", stride},
                                {"kv_cache_dtype", options.kv_cache_fp8 ? "fp8_e4m3" : "bf16"}};
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
  cmd->add_option("--head", args->head, "main, or mtp: the MTP layer's head (predicting two tokens ahead)")
      ->capture_default_str();
  cmd->add_option("--plan", args->plan.preset, "Parallel plan preset (single, tp2, ep4, ...); default single");
  add_plan_flags(cmd, args->plan);
  add_kv_cache_dtype_flag(cmd, args->kv_cache_dtype);
  cmd->callback([args] { run_eval_ppl(*args); });
}

}  // namespace moeserve::apps
