// moeserve generate: batched generation from token ids, text or a chat, on the embedded or a
// given model, under any plan, on CPU ranks or GPUs; through the scheduler and step loop that
// serve runs (runtime/generate.h).
#include <cstdio>
#include <cstring>

#include "apps/cli_util.h"
#include "apps/commands.h"
#include "apps/default_model.h"
#include "apps/dist_cli.h"
#include "apps/plan_cli.h"
#include "apps/spec_cli.h"
#include "core/error.h"
#include "model/model_source.h"
#include "runtime/comm_report.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/multinode.h"
#include "runtime/rank_devices.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::apps {

namespace {

struct GenerateArgs {
  std::string model;  // "": the shipped default model (apps/default_model.h)
  std::vector<std::string> prompt_ids;
  std::vector<std::string> prompts;  // text
  std::string chat;                  // OpenAI-style messages JSON
  std::string chat_template;
  std::string backend;  // "": runtime::default_backend()
  bool no_cuda_graph = false;
  int64_t max_new_tokens = 16;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  PlanCliArgs plan;
  EngineCliArgs engine;
  bool stats = false;
  std::string dump_logits;
  int64_t kv_pages = 0;
  bool ignore_eos = false;
  int logprobs = -1;  // -1: plain output
  spec::SpeculativeFlags speculative;
  dist::LaunchArgs launch;
};

// The model's tokenizer: its directory's files, or the built-in one of a synthetic model.
std::unique_ptr<tokenizer::Tokenizer> tokenizer_for(const ModelSource& model) {
  if (model.synthetic) return tokenizer::make_builtin_tokenizer(model.config.vocab_size);
  MS_CHECK(!model.directory.empty(), "model '{}': text prompts need a model directory with tokenizer files",
           model.spec);
  return tokenizer::load_tokenizer(model.directory);
}

// One line per result: its ids, or in text mode its text without the stop token as a JSON
// string (newlines in the text keep one result per line); with --logprobs a JSON object.
void print_result(const runtime::GenerateResult& result, const tokenizer::Tokenizer* text, bool logprobs) {
  std::vector<int32_t> ids = result.tokens;
  if (text && result.finish_reason == "stop" && !ids.empty()) ids.pop_back();
  if (!logprobs) {
    std::printf("%s\n", text ? nlohmann::json(text->decode(ids)).dump().c_str() : join_ids(result.tokens).c_str());
    return;
  }
  nlohmann::ordered_json line = {{"tokens", result.tokens}, {"finish_reason", result.finish_reason}};
  if (text) line["text"] = text->decode(ids);
  nlohmann::ordered_json values = nlohmann::ordered_json::array(), tops = nlohmann::ordered_json::array();
  for (const runtime::TokenLogprob& lp : result.logprobs) {
    values.push_back(lp.logprob);
    nlohmann::ordered_json top = nlohmann::ordered_json::array();
    for (const auto& [id, value] : lp.top) top.push_back({id, value});
    tops.push_back(std::move(top));
  }
  line["logprobs"] = std::move(values);
  line["top_logprobs"] = std::move(tops);
  std::printf("%s\n", line.dump().c_str());
}

// Speculative decoding's verify steps and accept length (tokens per verify step), to stderr.
void print_speculation(const std::vector<runtime::GenerateResult>& results, const spec::SpeculativeOptions& o) {
  int64_t verify = 0, drafted = 0, accepted = 0;
  for (const auto& r : results) {
    verify += r.verify_steps;
    drafted += r.drafted_tokens;
    accepted += r.accepted_tokens;
  }
  std::fprintf(stderr, "speculative %s: %lld verify steps, %lld of %lld drafts accepted, accept_length %.3f\n",
               spec::algorithm_name(o.algorithm), static_cast<long long>(verify), static_cast<long long>(accepted),
               static_cast<long long>(drafted),
               verify > 0 ? static_cast<double>(accepted + verify) / static_cast<double>(verify) : 0.0);
}

// The prompts' logits, request after request: [sum(len), vocab].
void write_prompt_logits(const std::string& path, const std::vector<runtime::GenerateResult>& results, int64_t vocab) {
  int64_t rows = 0;
  for (const auto& result : results) rows += result.prompt_logits.dim(0);
  Tensor all(DType::F32, {rows, vocab});
  int64_t offset = 0;
  for (const auto& result : results) {
    std::memcpy(all.f32() + offset, result.prompt_logits.f32(), result.prompt_logits.nbytes());
    offset += result.prompt_logits.numel();
  }
  write_npy(path, all);
}

void run_generate(const GenerateArgs& args) {
  const ModelSource model = open_model(resolve_model_spec(args.model));
  runtime::EngineOptions options;
  options.backend = args.backend;
  options.graphs = !args.no_cuda_graph;
  options.kv_cache_fp8 = kv_cache_fp8(args.engine.kv_cache_dtype);
  PlanCliArgs plan_args = args.plan;
  plan_args.kv_cache_fp8 = options.kv_cache_fp8;
  // The CPU backend holds weights and KV cache in fp32, the CUDA backend in bf16.
  options.plan = plan_for_model(plan_args, model.config, /*bytes_per_element=*/args.backend == "cuda" ? 2 : 4);
  options.page_size = args.engine.page_size;
  options.pp_max_micro_batch_size = args.engine.pp_max_micro_batch_size;
  options.pp_async_batch_depth = args.engine.pp_async_batch_depth;
  options.run = run_options_for(args.engine.reduction_plan);
  options.batch_invariant = args.engine.batch_invariant;
  const bool text_mode = !args.prompts.empty() || !args.chat.empty();
  MS_CHECK(!text_mode || args.prompt_ids.empty(), "generate: give --prompt-ids, or --prompt / --chat, not both");
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& text : args.prompt_ids) prompts.push_back(parse_id_list(text, "--prompt-ids"));
  std::vector<int32_t> stop_ids;
  if (text_mode) {
    tok = tokenizer_for(model);
    for (const auto& text : args.prompts) prompts.push_back(tok->encode(text, /*allow_special=*/false));
    if (!args.chat.empty()) {
      tokenizer::ChatRequest chat;
      try {
        chat.messages = nlohmann::ordered_json::parse(args.chat);
      } catch (const nlohmann::json::parse_error& e) {
        fail("--chat: invalid JSON: {}", e.what());
      }
      MS_CHECK(chat.messages.is_array() && !chat.messages.empty(), "--chat: expected a non-empty array of messages");
      // As serve encodes a chat: the template's markers are special tokens, the messages' text is text.
      const tokenizer::RenderedChat rendered =
          tokenizer::chat_template_for(*tok, args.chat_template)->render(chat, {tok->bos_token(), tok->eos_token()});
      prompts.push_back(tok->encode(rendered.text, rendered.request_text));
    }
    // Chat turns end with the template's end-of-turn token.
    if (auto im_end = tok->added_token_id("<|im_end|>")) stop_ids.push_back(*im_end);
    if (auto eos = tok->eos_id()) stop_ids.push_back(*eos);
  }
  std::vector<runtime::GenerateRequest> requests;
  for (auto& prompt : prompts) {
    runtime::GenerateRequest r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = args.max_new_tokens;
    r.sampling.temperature = args.temperature;
    r.sampling.top_k = args.top_k;
    r.sampling.top_p = args.top_p;
    r.sampling.min_p = args.min_p;
    r.sampling.seed = args.seed;
    r.top_logprobs = args.logprobs;
    if (!args.ignore_eos) {
      r.stop_ids = stop_ids;
      if (model.config.eos_token_id >= 0) r.stop_ids.push_back(static_cast<int32_t>(model.config.eos_token_id));
    }
    requests.push_back(std::move(r));
  }
  MS_CHECK(!requests.empty(), "generate: give at least one --prompt-ids, --prompt or --chat");
  const spec::SpeculativeOptions speculative = spec::speculative_options(args.speculative);
  options.run.mtp = speculative.algorithm == spec::Algorithm::kNextn;  // NEXTN drafts with the MTP layer
  // --kv-pages: the pages requests may use; the scheduler keeps one more for padding.
  options.num_pages = args.kv_pages > 0
                          ? args.kv_pages + 1
                          : runtime::kv_pages_for(requests, args.engine.page_size, speculative.max_drafts());
  // Several processes: every node runs this command with the same options; the followers run
  // their ranks on the leader's steps and print nothing.
  const std::unique_ptr<dist::Cluster> cluster = join_cluster(args.launch, model, options);
  options.cluster = cluster.get();
  runtime::Engine engine(model, options);
  if (cluster && !cluster->leader()) return runtime::run_follower(engine, *cluster);
  const bool want_logits = !args.dump_logits.empty();
  const auto results = runtime::generate(engine, requests, {.prompt_logits = want_logits, .speculative = speculative});
  for (const auto& result : results) print_result(result, text_mode ? tok.get() : nullptr, args.logprobs >= 0);
  if (args.stats) std::fputs(runtime::comm_report(engine).c_str(), stderr);
  if (speculative.enabled()) print_speculation(results, speculative);
  if (want_logits) write_prompt_logits(args.dump_logits, results, model.config.vocab_size);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate tokens for one or more prompts (one line of ids each)");
  cmd->add_option("--model,-m", args->model,
                  "A model directory, or synthetic:NAME[:layers=N][:seed=S] (random weights); default: the shipped "
                  "model (models/default)");
  cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids, comma-separated; repeat for a batch");
  cmd->add_option("--prompt", args->prompts, "Prompt text (the model's tokenizer); repeat for a batch");
  cmd->add_option("--chat", args->chat, "A conversation as OpenAI-style messages JSON, rendered by the chat template");
  cmd->add_option("--chat-template", args->chat_template,
                  "Chat template: a built-in name (kimi-k2, kimi-k2-thinking, deepseek-v3) or a .jinja file "
                  "(default: the tokenizer's)");
  cmd->add_option("--backend", args->backend,
                  "Where ranks run: cpu (fp32 reference), cpu-bf16 (the CUDA backend's bf16 rounding on the host) or "
                  "cuda (rank r on GPU r); default: cuda when a GPU is visible");
  cmd->add_flag("--no-cuda-graph", args->no_cuda_graph, "Run decode steps op by op instead of replaying CUDA graphs");
  cmd->add_option("-n,--max-new-tokens", args->max_new_tokens, "Tokens to generate per prompt")->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "Sampling temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "Keep the k most likely tokens (0: off)")->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "Nucleus sampling mass (1: off)")->capture_default_str();
  cmd->add_option("--min-p", args->min_p, "Drop tokens below min_p x the top probability")->capture_default_str();
  cmd->add_option("--seed", args->seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--plan", args->plan.preset,
                  "Parallel plan preset (single, tp2, ep4, ep4-dp, pp2, ep4tp2, tp2pp4, ...); default single");
  add_plan_flags(cmd, args->plan);
  add_engine_flags(cmd, args->engine);
  add_speculative_flags(cmd, args->speculative);
  add_dist_flags(cmd, args->launch);
  cmd->add_flag("--stats", args->stats,
                "Print per-rank communication (calls, bytes per collective and layer) to stderr");
  cmd->add_option("--kv-pages", args->kv_pages, "KV cache pages per layer (0: just enough)");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Do not stop at the model's EOS token");
  cmd->add_option("--logprobs", args->logprobs,
                  "Print each result as a JSON line with every token's logprob and its N most likely alternatives");
  cmd->add_option("--dump-logits", args->dump_logits, "Write the prompts' logits [sum(len), vocab] to a .npy file");
  cmd->callback([args] {
    if (args->backend.empty()) args->backend = runtime::default_backend();
    run_generate(*args);
  });
}

}  // namespace moeserve::apps
