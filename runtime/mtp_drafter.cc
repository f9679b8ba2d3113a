#include "runtime/mtp_drafter.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve::runtime {

MtpDrafter::MtpDrafter(Engine& engine, const sched::Scheduler& scheduler)
    : engine_(engine),
      scheduler_(scheduler),
      page_size_(engine.options().page_size),
      slots_(engine.options().num_pages * engine.options().page_size) {
  MS_CHECK(engine.config().num_nextn_predict_layers >= 1,
           "--speculative-algorithm NEXTN: model '{}' has no MTP layer (num_nextn_predict_layers is {})",
           engine.model_name(), engine.config().num_nextn_predict_layers);
  MS_CHECK(engine.options().run.mtp, "--speculative-algorithm NEXTN: the engine was built without its MTP layer");
}

std::vector<int32_t> MtpDrafter::take(uint64_t id) {
  auto it = drafts_.find(id);
  if (it == drafts_.end()) return {};
  std::vector<int32_t> drafts = std::move(it->second);
  drafts_.erase(it);
  return drafts;
}

std::vector<step::ReplicaBatch> MtpDrafter::draft_batches(int64_t width) const {
  std::vector<step::ReplicaBatch> batches(static_cast<size_t>(engine_.options().plan.attn_dp));
  for (step::ReplicaBatch& rb : batches) {
    rb.batch.mtp_draft = true;
    rb.batch.draw = DrawKind::kGreedy;
    rb.batch.max_pages_per_seq = step::block_table_width(width);
  }
  return batches;
}

void MtpDrafter::pad(std::vector<step::ReplicaBatch>& batches) const {
  if (!scheduler_.options().pad_batches) return;
  for (size_t d = 0; d < batches.size(); ++d) {
    ForwardBatch& b = batches[d].batch;
    if (b.num_tokens() == 0) continue;  // a replica without sequences runs its empty step
    // A decode step's catch-up (each sequence its verified token and accepted drafts) takes the
    // shape of its sequence count alone, whatever was accepted: as few shapes as decode steps.
    // A chained step is one token per sequence, each with its logits.
    const bool chained = b.logit_rows.size() == static_cast<size_t>(b.num_tokens());
    const int64_t per_sequence = chained ? 1 : 1 + scheduler_.options().max_drafts;
    const int64_t sequences = step::padded_token_count(static_cast<int64_t>(batches[d].sequences.size()));
    const bool decode = b.num_tokens() <= sequences * per_sequence;
    const int64_t tokens = decode ? sequences * per_sequence : step::padded_token_count(b.num_tokens());
    const int32_t scratch_page = scheduler_.scratch_page(static_cast<int>(d));
    step::pad_batch(batches[d], tokens, scratch_page, page_size_);
    b.mtp_tokens.resize(static_cast<size_t>(tokens), 0);
    b.mtp_hidden_rows.resize(static_cast<size_t>(tokens), static_cast<int32_t>(scratch_page * page_size_));
    if (b.logit_rows.empty()) continue;
    const auto rows = static_cast<int64_t>(b.logit_rows.size());
    const int32_t last = b.logit_rows.back();
    b.logit_rows.resize(static_cast<size_t>(decode ? std::max(rows, sequences) : step::padded_token_count(rows)), last);
  }
}

void MtpDrafter::warm_up(int64_t max_sequences, int64_t max_context) {
  const int64_t max_pages = (std::min(max_context, scheduler_.max_tokens_per_request()) + page_size_ - 1) / page_size_;
  std::vector<int64_t> counts;  // each padded sequence count
  for (int64_t s = 1; s <= max_sequences; ++s)
    if (counts.empty() || step::padded_token_count(s) != counts.back()) counts.push_back(step::padded_token_count(s));
  for (int64_t sequences : counts)
    for (int64_t width : step::block_table_widths(max_pages))
      for (const bool chained : {false, true}) {
        // pad() gives a catch-up (tokens without logits: two per sequence here) its sequence
        // count's shape, and a chained step (one token per sequence, with its logits) its own.
        std::vector<step::ReplicaBatch> batches = draft_batches(width);
        for (size_t d = 0; d < batches.size(); ++d) {
          step::ReplicaBatch& rb = batches[d];
          step::append_scratch_sequences(rb, sequences, chained ? 1 : 2, scheduler_.scratch_page(static_cast<int>(d)),
                                         page_size_);
          rb.batch.mtp_tokens.assign(rb.batch.tokens.size(), 0);
          rb.batch.mtp_hidden_rows = rb.batch.slots;
        }
        pad(batches);
        for (int run = 0; run < 2; ++run) {  // the second run is captured
          step::StepPlan plan;
          plan.micro_batches.push_back({.replicas = batches});
          engine_.wait(engine_.submit(std::move(plan)));
        }
      }
}

void MtpDrafter::run(std::vector<step::ReplicaBatch> batches, std::vector<Chain>& chains) {
  pad(batches);
  step::StepPlan plan;
  plan.micro_batches.push_back({.replicas = std::move(batches)});
  const StepOutputs out = engine_.wait(engine_.submit(std::move(plan)));
  const int64_t vocab = engine_.config().vocab_size;
  for (Chain& c : chains) {
    // A row of non-finite logits (latents of a prefix page cached while the MTP layer was
    // behind) has no argmax in the vocabulary: the chain ends there.
    const int32_t token = out.rows.at(0).at(static_cast<size_t>(c.replica)).i32()[c.row];
    if (token >= 0 && token < vocab)
      c.tokens.push_back(token);
    else
      c.max_drafts = c.drafted();
  }
}

std::vector<MtpDrafter::Chain> MtpDrafter::catch_up(std::span<const spec::CommittedSpan> committed) {
  std::vector<Chain> chains;
  std::vector<sched::Scheduler::SequenceView> views;
  int64_t widest = 1;
  for (const spec::CommittedSpan& c : committed) {
    views.push_back(scheduler_.sequence(c.id));
    widest = std::max<int64_t>(widest, static_cast<int64_t>(views.back().pages.size()));
  }
  std::vector<step::ReplicaBatch> batches = draft_batches(widest);
  int64_t tokens_in_step = 0;
  for (size_t i = 0; i < committed.size(); ++i) {
    const spec::CommittedSpan& c = committed[i];
    const auto& [tokens, pages] = views[i];
    const auto len = static_cast<int64_t>(tokens.size());
    // The MTP input at position t is the token at t + 1: known for every computed position.
    if (tokens.empty() || c.end <= c.begin || c.end > len - 1) continue;
    step::ReplicaBatch& rb = batches.at(static_cast<size_t>(c.replica));
    const bool drafts = c.max_drafts > 0 && c.end == len - 1;
    const int64_t first = rb.batch.num_tokens();
    const size_t row = rb.batch.logit_rows.size();
    step::append_sequence(rb, i, tokens, c.begin, c.end, pages, page_size_,
                          drafts ? step::LogitRows::kLast : step::LogitRows::kNone);
    for (int64_t t = c.begin; t < c.end; ++t) {
      rb.batch.mtp_tokens.push_back(tokens[static_cast<size_t>(t + 1)]);
      rb.batch.mtp_hidden_rows.push_back(rb.batch.slots[static_cast<size_t>(first + t - c.begin)]);
    }
    tokens_in_step += c.end - c.begin;
    if (drafts)
      chains.push_back({.id = c.id,
                        .replica = c.replica,
                        .tokens = {tokens.begin(), tokens.end()},
                        .pages = pages,
                        .max_drafts = c.max_drafts,
                        .own = len,
                        .row = row});
  }
  if (tokens_in_step > 0) run(std::move(batches), chains);
  return chains;
}

void MtpDrafter::chain_step(std::vector<Chain>& chains) {
  // A chain's next MTP position t is the one before its last draft's: input the MTP output at
  // t - 1 (store rows past slots_) and the last draft; it writes its latent at t, which the
  // sequence's pages must hold.
  std::erase_if(chains, [&](const Chain& c) {
    const auto t = static_cast<int64_t>(c.tokens.size()) - 2;
    return c.drafted() >= c.max_drafts || t >= static_cast<int64_t>(c.pages.size()) * page_size_;
  });
  if (chains.empty()) return;
  int64_t widest = 1;
  for (const Chain& c : chains) widest = std::max<int64_t>(widest, static_cast<int64_t>(c.pages.size()));
  std::vector<step::ReplicaBatch> batches = draft_batches(widest);
  for (size_t i = 0; i < chains.size(); ++i) {
    Chain& c = chains[i];
    step::ReplicaBatch& rb = batches.at(static_cast<size_t>(c.replica));
    const auto t = static_cast<int64_t>(c.tokens.size()) - 2;
    c.row = rb.batch.logit_rows.size();
    step::append_sequence(rb, i, c.tokens, t, t + 1, c.pages, page_size_, step::LogitRows::kLast);
    rb.batch.mtp_tokens.push_back(c.tokens.back());
    const int64_t prev = c.pages[static_cast<size_t>((t - 1) / page_size_)] * page_size_ + (t - 1) % page_size_;
    rb.batch.mtp_hidden_rows.push_back(static_cast<int32_t>(slots_ + prev));
  }
  run(std::move(batches), chains);
}

std::vector<spec::CommittedSpan> MtpDrafter::with_gaps(std::span<const spec::CommittedSpan> committed) {
  std::vector<spec::CommittedSpan> spans(committed.begin(), committed.end());
  if (behind_.empty()) return spans;
  std::vector<int64_t> room(static_cast<size_t>(engine_.options().plan.attn_dp), scheduler_.max_step_tokens());
  for (const spec::CommittedSpan& c : spans) room.at(static_cast<size_t>(c.replica)) -= c.end - c.begin;
  for (spec::CommittedSpan& c : spans) {
    auto it = behind_.find(c.id);
    if (it == behind_.end()) continue;
    int64_t& left = room.at(static_cast<size_t>(c.replica));
    const int64_t gap = c.begin - it->second;
    if (gap <= 0) {  // caught up, or recomputed from earlier on (a preempted sequence)
      behind_.erase(it);
      continue;
    }
    filled_gaps_ = true;
    if (gap <= left) {  // the whole gap, then the step's own positions
      left -= gap;
      c.begin = it->second;
      behind_.erase(it);
      continue;
    }
    // Part of the gap only, in place of the step's positions (which stay behind with it).
    const int64_t own = c.end - c.begin, used = std::min(left + own, gap);
    left -= used - own;
    c.begin = it->second;
    c.end = c.begin + used;
    c.max_drafts = 0;
    it->second = c.end;
  }
  return spans;
}

void MtpDrafter::after_step(std::span<const spec::CommittedSpan> committed) {
  filled_gaps_ = false;  // with_gaps sets it
  for (const spec::CommittedSpan& c : committed) drafts_.erase(c.id);
  const bool drafting = std::any_of(committed.begin(), committed.end(), [](const auto& c) { return c.max_drafts > 0; });
  if (!drafting) {  // no forward: every sequence is left behind from its first position not cached
    for (const spec::CommittedSpan& c : committed)
      if (c.end > c.begin) behind_.try_emplace(c.id, c.begin);
    return;
  }
  const std::vector<spec::CommittedSpan> spans = with_gaps(committed);
  std::vector<Chain> chains = catch_up(spans);
  while (!chains.empty()) {
    for (const Chain& c : chains) drafts_[c.id].assign(c.tokens.begin() + c.own, c.tokens.end());
    chain_step(chains);
  }
}

}  // namespace moeserve::runtime
