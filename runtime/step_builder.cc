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

int64_t micro_batch_size(int64_t live, const StepOptions& options) {
  if (options.max_micro_batch_size > 0) return options.max_micro_batch_size;
  if (options.pp == 1) return std::max<int64_t>(live, 1);
  return std::max<int64_t>((live + options.pp - 1) / options.pp, 1);
}

StepPlan build_step(std::vector<SequenceState>& seqs, const std::vector<size_t>& live, std::vector<PagePool>& pools,
                    const StepOptions& options) {
  const int64_t page_size = options.page_size;
  const int64_t per_micro_batch = micro_batch_size(static_cast<int64_t>(live.size()), options);
  StepPlan plan;
  for (size_t start = 0; start < live.size(); start += static_cast<size_t>(per_micro_batch)) {
    MicroBatch mb;
    mb.replicas.resize(options.attn_dp);
    for (auto& rb : mb.replicas) rb.batch.max_pages_per_seq = options.max_pages_per_seq;
    const size_t end = std::min(live.size(), start + static_cast<size_t>(per_micro_batch));
    for (size_t n = start; n < end; ++n) {
      const size_t i = live[n];
      SequenceState& s = seqs[i];
      ReplicaBatch& rb = mb.replicas.at(s.replica);
      ForwardBatch& batch = rb.batch;
      const int32_t seq_index = static_cast<int32_t>(rb.sequences.size());
      rb.sequences.push_back(i);
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      while (static_cast<int64_t>(s.pages.size()) * page_size < len) s.pages.push_back(pools.at(s.replica).take());
      MS_CHECK(static_cast<int64_t>(s.pages.size()) <= options.max_pages_per_seq,
               "sequence {} needs {} pages, more than the {} per sequence of this call", i, s.pages.size(),
               options.max_pages_per_seq);
      rb.first_row.push_back(static_cast<int64_t>(batch.logit_rows.size()));
      for (int64_t pos = s.cached; pos < len; ++pos) {
        if (options.logits_for_every_token) batch.logit_rows.push_back(static_cast<int32_t>(batch.tokens.size()));
        batch.tokens.push_back(s.tokens[pos]);
        batch.positions.push_back(static_cast<int32_t>(pos));
        batch.seq_of_token.push_back(seq_index);
        batch.slots.push_back(static_cast<int32_t>(s.pages[pos / page_size] * page_size + pos % page_size));
      }
      if (!options.logits_for_every_token) batch.logit_rows.push_back(static_cast<int32_t>(batch.tokens.size() - 1));
      rb.num_rows.push_back(static_cast<int64_t>(batch.logit_rows.size()) - rb.first_row.back());
      batch.block_tables.resize(rb.sequences.size() * options.max_pages_per_seq, 0);
      std::copy(s.pages.begin(), s.pages.end(), batch.block_tables.begin() + seq_index * options.max_pages_per_seq);
      s.cached = len;
    }
    plan.micro_batches.push_back(std::move(mb));
  }
  return plan;
}

}  // namespace moeserve::runtime
