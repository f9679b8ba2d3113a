#include "runtime/step_builder.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve::runtime {

PagePool::PagePool(int64_t num_pages) {
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

int32_t PagePool::take() {
  MS_CHECK(!free_.empty(), "out of KV cache pages (raise --kv-pages)");
  const int32_t page = free_.back();
  free_.pop_back();
  return page;
}

void PagePool::give_back(const std::vector<int32_t>& pages) { free_.insert(free_.end(), pages.begin(), pages.end()); }

StepPlan build_step(std::vector<SequenceState>& seqs, const std::vector<size_t>& live, std::vector<PagePool>& pools,
                    const StepOptions& options) {
  const int64_t page_size = options.page_size;
  const int64_t per_micro_batch = step::micro_batch_size(static_cast<int64_t>(live.size()), {.pp = options.pp, .max_micro_batch_size = options.max_micro_batch_size});
  StepPlan plan;
  for (size_t start = 0; start < live.size(); start += static_cast<size_t>(per_micro_batch)) {
    MicroBatch mb;
    mb.replicas.resize(options.attn_dp);
    for (auto& rb : mb.replicas) rb.batch.max_pages_per_seq = options.max_pages_per_seq;
    const size_t end = std::min(live.size(), start + static_cast<size_t>(per_micro_batch));
    for (size_t n = start; n < end; ++n) {
      const size_t i = live[n];
      SequenceState& s = seqs[i];
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      while (static_cast<int64_t>(s.pages.size()) * page_size < len) s.pages.push_back(pools.at(s.replica).take());
      step::append_sequence(mb.replicas.at(s.replica), i, s.tokens, s.cached, len, s.pages, page_size,
                      options.logits_for_every_token ? LogitRows::kEvery : LogitRows::kLast);
      s.cached = len;
    }
    plan.micro_batches.push_back(std::move(mb));
  }
  return plan;
}

}  // namespace moeserve::runtime
