#include "runtime/engine.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace moeserve::runtime {

namespace {

// Free-list of KV pages shared by the sequences of one generate() call.
class PagePool {
 public:
  explicit PagePool(int64_t num_pages) {
    for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
  }
  int32_t take() {
    MS_CHECK(!free_.empty(), "out of KV cache pages (raise --kv-pages)");
    const int32_t page = free_.back();
    free_.pop_back();
    return page;
  }
  void give_back(const std::vector<int32_t>& pages) { free_.insert(free_.end(), pages.begin(), pages.end()); }

 private:
  std::vector<int32_t> free_;
};

struct Sequence {
  std::vector<int32_t> tokens;  // prompt then generated
  std::vector<int32_t> pages;
  int64_t prompt_len = 0;
  int64_t cached = 0;  // tokens whose latents are in the cache
  bool finished = false;
};

}  // namespace

struct Engine::Impl {
  std::unique_ptr<ops::Backend> backend;
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<DeepseekV3> model;
};

Engine::Engine(const ModelSource& model, EngineOptions options)
    : config_(model.config), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  MS_CHECK(options_.backend == "cpu", "backend '{}' is not available in this build", options_.backend);
  MS_CHECK(options_.plan.world() == 1, "plan '{}' needs {} ranks; multi-rank execution is not available yet",
           options_.plan.name, options_.plan.world());
  MS_CHECK(options_.page_size > 0 && options_.num_pages > 0, "page size and page count must be positive");
  impl_->backend = cpu::make_cpu_backend();
  impl_->weights = model.weights();
  impl_->model = std::make_unique<DeepseekV3>(config_, options_.plan, 0, *impl_->backend, *impl_->weights,
                                              RankGroups{}, KvCacheShape{options_.num_pages, options_.page_size});
}

Engine::~Engine() = default;

std::vector<comm::CommStats> Engine::comm_stats() const { return {comm::CommStats{}}; }
std::vector<int64_t> Engine::weight_bytes_per_rank() const { return {impl_->model->weight_bytes()}; }

std::vector<GenerateResult> Engine::generate(const std::vector<GenerateRequest>& requests,
                                             bool return_prompt_logits) {
  const int64_t page_size = options_.page_size;
  PagePool pool(options_.num_pages);
  std::vector<Sequence> seqs(requests.size());
  std::vector<GenerateResult> results(requests.size());
  int64_t max_len = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    MS_CHECK(!r.prompt.empty(), "request {}: empty prompt", i);
    MS_CHECK(r.max_new_tokens >= 0, "request {}: max_new_tokens must be >= 0", i);
    for (int32_t id : r.prompt)
      MS_CHECK(id >= 0 && id < config_.vocab_size, "request {}: prompt token {} outside the vocabulary [0, {})", i,
               id, config_.vocab_size);
    const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
    MS_CHECK(total <= config_.max_position_embeddings,
             "request {}: prompt + max_new_tokens = {} exceeds the context length {}", i, total,
             config_.max_position_embeddings);
    seqs[i].tokens = r.prompt;
    seqs[i].prompt_len = static_cast<int64_t>(r.prompt.size());
    max_len = std::max(max_len, total);
  }
  const int64_t max_pages_per_seq = (max_len + page_size - 1) / page_size;

  auto finish_if_done = [&](size_t i) {
    Sequence& s = seqs[i];
    const auto& r = requests[i];
    const int64_t generated = static_cast<int64_t>(s.tokens.size()) - s.prompt_len;
    if (generated > 0 && std::find(r.stop_ids.begin(), r.stop_ids.end(), s.tokens.back()) != r.stop_ids.end()) {
      s.finished = true;
      results[i].finish_reason = "stop";
    } else if (generated >= r.max_new_tokens) {
      s.finished = true;
      results[i].finish_reason = "length";
    }
    if (s.finished) {
      pool.give_back(s.pages);
      s.pages.clear();
    }
  };

  for (int64_t step = 0;; ++step) {
    // Each live sequence contributes its uncached tokens (the whole prompt at step 0).
    ForwardBatch batch;
    batch.max_pages_per_seq = max_pages_per_seq;
    std::vector<size_t> live;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = seqs[i];
      if (s.finished) continue;
      if (step == 0 && requests[i].max_new_tokens == 0 && !return_prompt_logits) {
        finish_if_done(i);
        continue;
      }
      const int32_t seq_index = static_cast<int32_t>(live.size());
      live.push_back(i);
      const int64_t end = static_cast<int64_t>(s.tokens.size());
      while (static_cast<int64_t>(s.pages.size()) * page_size < end) s.pages.push_back(pool.take());
      for (int64_t pos = s.cached; pos < end; ++pos) {
        if (return_prompt_logits && step == 0) batch.logit_rows.push_back(static_cast<int32_t>(batch.tokens.size()));
        batch.tokens.push_back(s.tokens[pos]);
        batch.positions.push_back(static_cast<int32_t>(pos));
        batch.seq_of_token.push_back(seq_index);
        batch.slots.push_back(static_cast<int32_t>(s.pages[pos / page_size] * page_size + pos % page_size));
      }
      if (!(return_prompt_logits && step == 0)) batch.logit_rows.push_back(static_cast<int32_t>(batch.tokens.size() - 1));
      batch.block_tables.resize(live.size() * max_pages_per_seq, 0);
      std::copy(s.pages.begin(), s.pages.end(), batch.block_tables.begin() + seq_index * max_pages_per_seq);
      s.cached = end;
    }
    if (live.empty()) break;

    const Tensor logits = impl_->model->forward(batch);  // [rows, vocab]
    const int64_t vocab = config_.vocab_size;
    int64_t row = 0;
    for (size_t j = 0; j < live.size(); ++j) {
      const size_t i = live[j];
      Sequence& s = seqs[i];
      int64_t last_row = row;
      if (return_prompt_logits && step == 0) {
        Tensor prompt_logits(DType::F32, {s.prompt_len, vocab});
        std::memcpy(prompt_logits.f32(), logits.f32() + row * vocab, prompt_logits.nbytes());
        results[i].prompt_logits = std::move(prompt_logits);
        last_row = row + s.prompt_len - 1;
        row += s.prompt_len;
      } else {
        ++row;
      }
      if (static_cast<int64_t>(s.tokens.size()) - s.prompt_len < requests[i].max_new_tokens) {
        ops::SamplingOptions options = requests[i].sampling;
        options.step = static_cast<uint64_t>(s.tokens.size() - s.prompt_len);
        const int32_t token = cpu::sample_row(logits.f32() + last_row * vocab, vocab, options);
        s.tokens.push_back(token);
        results[i].tokens.push_back(token);
      }
      finish_if_done(i);
    }
  }
  return results;
}

}  // namespace moeserve::runtime
