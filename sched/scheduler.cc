#include "sched/scheduler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace moeserve::sched {

Scheduler::Scheduler(const SchedulerOptions& options) : options_(options) {
  MS_CHECK(options.page_size > 0, "scheduler: page size {} must be positive", options.page_size);
  MS_CHECK(options.pages_per_replica >= 2,
           "scheduler: {} KV pages per replica; need at least 2 (one is the padding page)", options.pages_per_replica);
  MS_CHECK(options.attn_dp >= 1 && options.pp >= 1, "scheduler: attn_dp and pp must be >= 1");
  MS_CHECK(options.max_running_requests >= 1, "--max-running-requests must be >= 1, got {}",
           options.max_running_requests);
  MS_CHECK(options.chunked_prefill_size >= 1, "--chunked-prefill-size must be >= 1, got {}",
           options.chunked_prefill_size);
  MS_CHECK(options.max_micro_batch_size >= 0, "--pp-max-micro-batch-size must be >= 0");
  MS_CHECK(options.pipeline_groups >= 1, "--pp-groups must be >= 1, got {}", options.pipeline_groups);
  MS_CHECK(options.admission_headroom >= 0 && options.admission_headroom < 1,
           "scheduler: admission headroom {} must be in [0, 1)", options.admission_headroom);
  for (int d = 0; d < options.attn_dp; ++d) {
    kv_.emplace_back(kv::KvCacheOptions{options.pages_per_replica - 1, options.page_size, options.prefix_cache});
    scratch_page_.push_back(static_cast<int32_t>(options.pages_per_replica - 1));
  }
}

int64_t Scheduler::max_tokens_per_request() const { return (options_.pages_per_replica - 1) * options_.page_size; }

Scheduler::Sequence& Scheduler::seq(RequestId id) {
  auto it = seqs_.find(id);
  MS_CHECK(it != seqs_.end(), "scheduler: unknown request {}", id);
  return it->second;
}

int64_t Scheduler::cached_prompt_tokens(RequestId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? 0 : it->second.cached_prompt_tokens;
}

int64_t Scheduler::generated_tokens(RequestId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.tokens.size()) - it->second.prompt_len;
}

Scheduler::SequenceView Scheduler::sequence(RequestId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second.replica < 0) return {};
  return {it->second.tokens, it->second.pages};
}

void Scheduler::add(RequestId id, std::vector<int32_t> prompt, RequestOptions options) {
  MS_CHECK(!prompt.empty(), "request {}: empty prompt", id);
  MS_CHECK(static_cast<int64_t>(prompt.size()) <= max_tokens_per_request(),
           "request {}: {} prompt tokens exceed the {} tokens a KV cache replica holds", id, prompt.size(),
           max_tokens_per_request());
  MS_CHECK(!seqs_.count(id), "scheduler: request {} added twice", id);
  Sequence s;
  s.id = id;
  s.prompt_len = static_cast<int64_t>(prompt.size());
  s.tokens = std::move(prompt);
  s.prompt_logits = options.prompt_logits;
  seqs_.emplace(id, std::move(s));
  waiting_.push_back(id);
}

void Scheduler::release_pages(Sequence& s) {
  if (s.replica < 0) return;
  kv::KvCache& kv = kv_[s.replica];
  kv.cache_prefix(s.tokens, s.pages, s.computed);
  kv.release(s.pages);
  s.pages.clear();
  s.computed = 0;
  s.replica = -1;
}

bool Scheduler::finish(RequestId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  release_pages(it->second);
  if (auto r = std::find(running_.begin(), running_.end(), id); r != running_.end()) running_.erase(r);
  if (auto w = std::find(waiting_.begin(), waiting_.end(), id); w != waiting_.end()) waiting_.erase(w);
  seqs_.erase(it);
  return true;
}

int64_t Scheduler::flush_prefix_cache() {
  int64_t evicted = 0;
  for (auto& kv : kv_) evicted += kv.flush();
  return evicted;
}

void Scheduler::preempt(size_t index) {
  Sequence& s = seq(running_[index]);
  release_pages(s);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  waiting_.push_front(s.id);
  ++preemptions_;
}

bool Scheduler::ensure_pages(size_t index, int64_t tokens) {
  Sequence& s = seq(running_[index]);
  kv::KvCache& kv = kv_[s.replica];
  const int64_t missing = pages_for(tokens) - static_cast<int64_t>(s.pages.size());
  if (missing <= 0) return true;
  for (;;) {
    if (auto pages = kv.allocate(missing)) {
      s.pages.insert(s.pages.end(), pages->begin(), pages->end());
      return true;
    }
    // The newest running sequence of this replica makes room (running_ is in admission order);
    // never one whose step is in flight (another pipeline group's).
    size_t victim = running_.size();
    for (size_t j = running_.size(); j-- > index;)
      if (const Sequence& other = seq(running_[j]); other.replica == s.replica && !other.in_flight) {
        victim = j;
        break;
      }
    preempt(victim);
    if (victim == index) return false;
  }
}

int64_t Scheduler::running_on(int replica) const {
  int64_t n = 0;
  for (RequestId id : running_) n += seqs_.at(id).replica == replica;
  return n;
}

int64_t Scheduler::running_in_group(int group) const {
  int64_t n = 0;
  for (RequestId id : running_) n += seqs_.at(id).group == group;
  return n;
}

// Admits the head of the waiting queue into `group` if a replica can take it; adds its first chunk.
bool Scheduler::admit(int group, std::vector<int64_t>& budget, std::vector<Pick>& picks) {
  Sequence& s = seq(waiting_.front());
  const int64_t len = static_cast<int64_t>(s.tokens.size());
  int best = -1;
  int64_t best_cached = -1, best_running = 0;
  for (int d = 0; d < num_replicas(); ++d) {
    if (budget[d] <= 0) continue;
    const int64_t cached = s.prompt_logits ? 0 : kv_[d].cached_prefix_tokens(s.tokens, len - 1);
    const int64_t running = running_on(d);
    if (cached > best_cached || (cached == best_cached && running < best_running)) {
      best = d;
      best_cached = cached;
      best_running = running;
    }
  }
  if (best < 0) return false;
  kv::KvCache& kv = kv_[best];
  // The last prompt token always runs: its logits give the first generated token.
  std::vector<int32_t> prefix = s.prompt_logits ? std::vector<int32_t>{} : kv.acquire_prefix(s.tokens, len - 1);
  const int64_t missing = pages_for(len) - static_cast<int64_t>(prefix.size());
  const int64_t headroom =
      best_running > 0 ? static_cast<int64_t>(std::ceil(options_.admission_headroom * kv.num_pages())) : 0;
  if (kv.available_pages() < missing + headroom) {
    kv.release(prefix);
    return false;
  }
  auto fresh = kv.allocate(missing);
  MS_CHECK(fresh.has_value(), "scheduler: {} pages counted available, allocation failed", kv.available_pages());
  s.pages = std::move(prefix);
  s.pages.insert(s.pages.end(), fresh->begin(), fresh->end());
  s.computed = static_cast<int64_t>(s.pages.size() - fresh->size()) * options_.page_size;
  s.replica = best;
  s.group = group;
  if (!s.admitted_before) {
    s.admitted_before = true;
    s.cached_prompt_tokens = s.computed;
    kv.count_lookup(len - 1, s.computed);
  }
  waiting_.pop_front();
  running_.push_back(s.id);
  const int64_t chunk = std::min(len - s.computed, budget[best]);
  budget[best] -= chunk;
  picks.push_back({&s, s.computed, s.computed + chunk});
  return true;
}

std::vector<int32_t> Scheduler::drafts_for(size_t index, const DraftSource& source) {
  Sequence& s = seq(running_[index]);
  if (!source || options_.max_drafts <= 0 || s.prompt_logits) return {};
  std::vector<int32_t> drafts = source(s.id, s.tokens);
  const int64_t len = static_cast<int64_t>(s.tokens.size());
  const int64_t room = std::min(options_.max_drafts, max_tokens_per_request() - len);
  if (static_cast<int64_t>(drafts.size()) > room) drafts.resize(static_cast<size_t>(std::max<int64_t>(room, 0)));
  if (drafts.empty()) return drafts;
  // Pages for the drafts only when no sequence must be preempted for them, now or at its next
  // page: one page per running sequence of the replica stays available.
  const kv::KvCache& kv = kv_[s.replica];
  const int64_t held = static_cast<int64_t>(s.pages.size());
  const int64_t plain = std::max<int64_t>(pages_for(len) - held, 0);  // the decode's own need
  const int64_t extra = pages_for(len + static_cast<int64_t>(drafts.size())) - std::max(pages_for(len), held);
  if (extra > 0 && kv.available_pages() - plain < extra + running_on(s.replica)) drafts.clear();
  return drafts;
}

ScheduledStep Scheduler::schedule(int group, const DraftSource& source) {
  MS_CHECK(group >= 0 && group < options_.pipeline_groups, "scheduler: group {} of {}", group,
           options_.pipeline_groups);
  std::vector<int64_t> budget(static_cast<size_t>(num_replicas()), options_.chunked_prefill_size);
  std::vector<Pick> picks;
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = seq(running_[i]);
    if (s.group != group) continue;
    MS_CHECK(!s.in_flight, "scheduler: group {} scheduled again before its step was committed", group);
    const int64_t len = static_cast<int64_t>(s.tokens.size());
    const int64_t uncached = len - s.computed;
    if (uncached <= 0) continue;
    std::vector<int32_t> drafts = uncached == 1 ? drafts_for(i, source) : std::vector<int32_t>{};
    const int64_t chunk =
        uncached == 1 ? 1 + static_cast<int64_t>(drafts.size()) : std::min(uncached, budget[s.replica]);
    if (chunk <= 0) continue;
    if (!ensure_pages(i, s.computed + chunk)) {
      --i;  // running_[i] was this sequence, now preempted
      continue;
    }
    if (uncached > 1) budget[s.replica] -= chunk;
    picks.push_back({&s, s.computed, s.computed + chunk, std::move(drafts)});
  }
  // Groups share the requests evenly: a group admits up to its share of those that could run
  // (running and waiting, at most max_running_requests), so that a burst of 8 requests with 2
  // groups runs as 4 + 4 rather than 8 in the first group scheduled and none beside it.
  const int64_t demand = std::min<int64_t>(options_.max_running_requests, running() + waiting());
  const int64_t per_group = (demand + options_.pipeline_groups - 1) / options_.pipeline_groups;
  while (!waiting_.empty() && running() < options_.max_running_requests && running_in_group(group) < per_group &&
         admit(group, budget, picks)) {
  }
  for (const Pick& p : picks) p.seq->in_flight = true;
  return build(group, picks);
}

void Scheduler::add_chunk(const Pick& p, size_t n, size_t m, step::ReplicaBatch& rb, ScheduledStep& step) const {
  const Sequence& s = *p.seq;
  const int64_t drafted = static_cast<int64_t>(p.drafts.size());
  const int64_t len = static_cast<int64_t>(s.tokens.size());
  const bool last = p.end == len + drafted;
  const int64_t first_row = static_cast<int64_t>(rb.batch.logit_rows.size());
  ScheduledChunk chunk{s.id, s.replica, m, p.begin, p.end - drafted, -1};
  chunk.drafts = p.drafts;
  // Until its prompt's last chunk is committed a prompt-logits sequence has only prompt tokens.
  step::LogitRows rows = last ? step::LogitRows::kLast : step::LogitRows::kNone;
  std::vector<int32_t> with_drafts;  // the sequence's tokens, then its drafts
  std::span<const int32_t> tokens = s.tokens;
  if (drafted > 0) {
    rows = step::LogitRows::kEvery;
    with_drafts = s.tokens;
    with_drafts.insert(with_drafts.end(), p.drafts.begin(), p.drafts.end());
    tokens = with_drafts;
  }
  if (s.prompt_logits) {
    rows = step::LogitRows::kEvery;
    chunk.prompt_rows = true;
    chunk.first_prompt_row = first_row;
  }
  if (last) chunk.logit_row = first_row + (s.prompt_logits ? p.end - p.begin - 1 : 0);
  step::append_sequence(rb, n, tokens, p.begin, p.end, s.pages, options_.page_size, rows);
  if (p.end - p.begin == 1 + drafted && last)
    step.decode_tokens += 1 + drafted;
  else
    step.prefill_tokens += p.end - p.begin;
  step.draft_tokens += drafted;
  step.chunks.push_back(chunk);
}

ScheduledStep Scheduler::build(int group, const std::vector<Pick>& picks) const {
  ScheduledStep step;
  step.group = group;
  if (picks.empty()) return step;
  // Pipeline groups: a group's step is one micro-batch (the other stages run other groups).
  const step::MicroBatching batching{.pp = options_.pipeline_groups > 1 ? 1 : options_.pp,
                                     .max_micro_batch_size = options_.max_micro_batch_size};
  const size_t per_micro_batch =
      static_cast<size_t>(step::micro_batch_size(static_cast<int64_t>(picks.size()), batching));
  for (size_t start = 0; start < picks.size(); start += per_micro_batch) {
    const size_t end = std::min(picks.size(), start + per_micro_batch);
    const size_t m = step.plan.micro_batches.size();
    step::MicroBatch mb;
    mb.replicas.resize(static_cast<size_t>(options_.attn_dp));
    int64_t widest = 1;
    for (size_t n = start; n < end; ++n) widest = std::max<int64_t>(widest, picks[n].seq->pages.size());
    for (auto& rb : mb.replicas) rb.batch.max_pages_per_seq = step::block_table_width(widest);
    for (size_t n = start; n < end; ++n) {
      const Sequence& s = *picks[n].seq;
      add_chunk(picks[n], n, m, mb.replicas[s.replica], step);
    }
    if (options_.pad_batches)
      for (int d = 0; d < options_.attn_dp; ++d) {
        step::ReplicaBatch& rb = mb.replicas[d];
        step::pad_batch(rb, step::padded_token_count(rb.batch.num_tokens()), scratch_page_[d], options_.page_size);
      }
    step.plan.micro_batches.push_back(std::move(mb));
  }
  return step;
}

std::vector<step::StepPlan> Scheduler::warmup_steps() const {
  auto padded = [&](int64_t t) { return options_.pad_batches ? step::padded_token_count(t) : t; };
  // The largest step first (it sizes the shared activation memory once), then every padded
  // decode size: the steps whose graphs are replayed while serving.
  std::vector<int64_t> sizes{padded(max_step_tokens())};
  for (int64_t t = 1; t <= options_.max_running_requests; ++t)
    if (padded(t) != sizes.back() && padded(t) < sizes.front()) sizes.push_back(padded(t));
  std::vector<step::StepPlan> steps;
  for (int64_t tokens : sizes) {
    step::MicroBatch mb;
    mb.replicas.resize(static_cast<size_t>(options_.attn_dp));
    for (int d = 0; d < options_.attn_dp; ++d) {
      mb.replicas[d].batch.max_pages_per_seq = 1;
      step::pad_batch(mb.replicas[d], tokens, scratch_page_[d], options_.page_size);
    }
    step::StepPlan plan;
    plan.micro_batches.push_back(std::move(mb));
    steps.push_back(std::move(plan));
  }
  return steps;
}

std::vector<step::StepPlan> Scheduler::graph_warmup_steps(int64_t max_sequences, int64_t max_context) const {
  std::vector<int64_t> sizes;  // every padded size of a step of one token and its drafts per sequence
  for (int64_t t = 1; t <= max_sequences * (1 + options_.max_drafts); ++t)
    if (sizes.empty() || step::padded_token_count(t) != sizes.back()) sizes.push_back(step::padded_token_count(t));
  const int64_t max_pages = pages_for(std::min(max_context, max_tokens_per_request()));
  std::vector<step::StepPlan> steps;
  for (int64_t tokens : sizes)
    for (int64_t width : step::block_table_widths(max_pages)) {
      step::MicroBatch mb;
      mb.replicas.resize(static_cast<size_t>(options_.attn_dp));
      for (int d = 0; d < options_.attn_dp; ++d) {
        mb.replicas[d].batch.max_pages_per_seq = width;
        step::append_scratch_sequences(mb.replicas[d], tokens, 1, scratch_page_[d], options_.page_size);
      }
      step::StepPlan plan;
      plan.micro_batches.push_back(std::move(mb));
      steps.push_back(std::move(plan));
    }
  return steps;
}

void Scheduler::accept(Sequence& s, const ScheduledChunk& chunk, int32_t token, int64_t accepted) {
  MS_CHECK(accepted >= 0 && accepted <= static_cast<int64_t>(chunk.drafts.size()),
           "scheduler: request {}: {} drafts accepted of {}", chunk.id, accepted, chunk.drafts.size());
  s.tokens.insert(s.tokens.end(), chunk.drafts.begin(), chunk.drafts.begin() + accepted);
  s.tokens.push_back(token);
  s.computed += accepted;   // the accepted drafts' latents are the sequence's
  s.prompt_logits = false;  // the prompt's rows are all delivered
  // Pages past the sequence's tokens held only rejected drafts' latents.
  const size_t keep = static_cast<size_t>(pages_for(static_cast<int64_t>(s.tokens.size())));
  if (s.pages.size() > keep) {
    kv_[s.replica].release(std::span<const int32_t>(s.pages).subspan(keep));
    s.pages.resize(keep);
  }
}

void Scheduler::commit(const ScheduledStep& step, std::span<const int32_t> sampled, std::span<const int64_t> accepted) {
  MS_CHECK(accepted.empty() || accepted.size() == sampled.size(), "scheduler: {} accepted counts for {} tokens",
           accepted.size(), sampled.size());
  size_t next = 0;
  for (const ScheduledChunk& chunk : step.chunks) {
    const bool samples = chunk.logit_row >= 0;
    if (samples) MS_CHECK(next < sampled.size(), "scheduler: {} sampled tokens for more chunks", sampled.size());
    const int64_t drafts_accepted = samples && !accepted.empty() ? accepted[next] : 0;
    const int32_t token = samples ? sampled[next++] : -1;
    auto it = seqs_.find(chunk.id);
    if (it == seqs_.end()) continue;  // finished while its step was in flight
    Sequence& s = it->second;
    MS_CHECK(s.in_flight && s.replica == chunk.replica && s.computed == chunk.begin,
             "scheduler: request {} changed between schedule and commit", chunk.id);
    s.in_flight = false;
    s.computed = chunk.end;
    if (samples) accept(s, chunk, token, drafts_accepted);
    kv_[s.replica].cache_prefix(s.tokens, s.pages, s.computed);
  }
  MS_CHECK(next == sampled.size(), "scheduler: {} sampled tokens for {} chunks with logits", sampled.size(), next);
}

}  // namespace moeserve::sched
