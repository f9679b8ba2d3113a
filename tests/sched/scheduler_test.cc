// The scheduler without tensors: which tokens of which requests run in each step, on which
// replica and micro-batch, with which pages; admission, chunked prefill, preemption, prefix
// reuse, and that every page comes back.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "core/error.h"

namespace moeserve::sched {
namespace {

SchedulerOptions small_options() {
  SchedulerOptions o;
  o.page_size = 4;
  o.pages_per_replica = 33;  // 32 usable + the padding page
  o.max_running_requests = 8;
  o.chunked_prefill_size = 64;
  o.pad_batches = false;
  return o;
}

std::vector<int32_t> prompt_of(int n, int32_t first = 1) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

// Samples token 100 + (tokens so far) for every chunk with logits; returns the step.
ScheduledStep step_once(Scheduler& s) {
  ScheduledStep step = s.schedule();
  std::vector<int32_t> sampled;
  for (const auto& c : step.chunks)
    if (c.logit_row >= 0) sampled.push_back(static_cast<int32_t>(100 + c.end));
  s.commit(step, sampled);
  return step;
}

const ScheduledChunk* chunk_of(const ScheduledStep& step, RequestId id) {
  for (const auto& c : step.chunks)
    if (c.id == id) return &c;
  return nullptr;
}

int64_t used_pages(const Scheduler& s) {
  int64_t used = 0;
  for (int d = 0; d < s.num_replicas(); ++d) used += s.kv(d).used_pages();
  return used;
}

TEST(Scheduler, PrefillThenDecodeAndNewRequestsJoinRunningBatch) {
  Scheduler s(small_options());
  s.add(1, prompt_of(5));
  s.add(2, prompt_of(3, 50));
  ScheduledStep step = step_once(s);
  ASSERT_EQ(step.chunks.size(), 2u);
  EXPECT_EQ(step.prefill_tokens, 8);
  const auto& rb = step.plan.micro_batches.at(0).replicas.at(0);
  EXPECT_EQ(rb.batch.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 50, 51, 52}));
  EXPECT_EQ(rb.batch.logit_rows, (std::vector<int32_t>{4, 7}));
  EXPECT_EQ(chunk_of(step, 1)->logit_row, 0);
  EXPECT_EQ(chunk_of(step, 2)->logit_row, 1);

  s.add(3, prompt_of(2, 70));
  step = step_once(s);  // two decodes and a prefill in one step
  EXPECT_EQ(step.decode_tokens, 2);
  EXPECT_EQ(step.prefill_tokens, 2);
  const auto& mixed = step.plan.micro_batches.at(0).replicas.at(0).batch;
  EXPECT_EQ(mixed.tokens, (std::vector<int32_t>{105, 103, 70, 71}));
  EXPECT_EQ(mixed.positions, (std::vector<int32_t>{5, 3, 0, 1}));
  EXPECT_EQ(s.generated_tokens(1), 2);
  EXPECT_EQ(s.running(), 3);
  for (RequestId id : {1, 2, 3}) EXPECT_TRUE(s.finish(id));
  EXPECT_FALSE(s.finish(1));
  EXPECT_EQ(used_pages(s), 0);
  EXPECT_TRUE(s.idle());
}

TEST(Scheduler, ChunkedPrefillAsksForLogitsOnlyAtTheLastChunk) {
  SchedulerOptions o = small_options();
  o.chunked_prefill_size = 4;
  Scheduler s(o);
  s.add(1, prompt_of(2, 90));
  step_once(s);  // request 1 is decoding
  s.add(2, prompt_of(10));
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<int64_t> rows;
  for (int i = 0; i < 3; ++i) {
    ScheduledStep step = step_once(s);
    const ScheduledChunk* c = chunk_of(step, 2);
    ASSERT_NE(c, nullptr);
    ranges.emplace_back(c->begin, c->end);
    rows.push_back(c->logit_row);
    EXPECT_NE(chunk_of(step, 1), nullptr);  // the decode runs alongside every chunk
    EXPECT_LE(step.prefill_tokens, 4);
  }
  EXPECT_EQ(ranges, (std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 8}, {8, 10}}));
  EXPECT_EQ(rows[0], -1);
  EXPECT_EQ(rows[1], -1);
  EXPECT_GE(rows[2], 0);
  EXPECT_EQ(s.generated_tokens(2), 1);
}

TEST(Scheduler, MaxRunningRequestsKeepsTheRestWaiting) {
  SchedulerOptions o = small_options();
  o.max_running_requests = 2;
  Scheduler s(o);
  for (RequestId id = 1; id <= 3; ++id) s.add(id, prompt_of(3));
  ScheduledStep step = step_once(s);
  EXPECT_EQ(step.chunks.size(), 2u);
  EXPECT_EQ(s.running(), 2);
  EXPECT_EQ(s.waiting(), 1);
  s.finish(1);
  step = step_once(s);
  EXPECT_NE(chunk_of(step, 3), nullptr);
  EXPECT_EQ(s.waiting(), 0);
}

TEST(Scheduler, AdmissionWaitsForPagesAndOversizePromptsAreRejected) {
  SchedulerOptions o = small_options();
  o.pages_per_replica = 5;  // 4 usable pages = 16 tokens
  o.admission_headroom = 0;
  Scheduler s(o);
  EXPECT_EQ(s.max_tokens_per_request(), 16);
  EXPECT_THROW(s.add(9, prompt_of(17)), Error);
  s.add(1, prompt_of(12));  // 3 pages
  s.add(2, prompt_of(8));   // 2 pages: must wait
  step_once(s);
  EXPECT_EQ(s.running(), 1);
  EXPECT_EQ(s.waiting(), 1);
  s.finish(1);
  step_once(s);
  EXPECT_EQ(s.running(), 1);
  EXPECT_EQ(s.waiting(), 0);
}

TEST(Scheduler, OutOfPagesPreemptsTheNewestWhichIsRecomputedLater) {
  SchedulerOptions o = small_options();
  o.pages_per_replica = 5;  // 4 usable pages of 4 tokens
  o.admission_headroom = 0;
  o.prefix_cache = false;
  Scheduler s(o);
  s.add(1, prompt_of(7));  // 2 pages
  s.add(2, prompt_of(5));  // 2 pages
  step_once(s);
  EXPECT_EQ(s.running(), 2);
  // Request 1 reaches 8 tokens, then needs a third page at its 9th: request 2 is preempted.
  step_once(s);
  ScheduledStep step = step_once(s);
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(chunk_of(step, 2), nullptr);
  EXPECT_EQ(s.running(), 1);
  EXPECT_EQ(s.waiting(), 1);
  const int64_t generated_before = s.generated_tokens(2);
  s.finish(1);
  step = step_once(s);  // request 2 recomputes its prompt and generated tokens, then samples
  const ScheduledChunk* c = chunk_of(step, 2);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->begin, 0);
  EXPECT_EQ(c->end, 5 + generated_before);
  EXPECT_GE(c->logit_row, 0);
  EXPECT_EQ(s.generated_tokens(2), generated_before + 1);
}

TEST(Scheduler, RunningAloneTheOldestPreemptsItselfNever) {
  SchedulerOptions o = small_options();
  o.pages_per_replica = 3;  // 2 usable pages = 8 tokens
  Scheduler s(o);
  s.add(1, prompt_of(3));
  for (int i = 0; i < 5; ++i) step_once(s);  // grows to 8 tokens
  EXPECT_EQ(s.preemptions(), 0);
  EXPECT_EQ(s.generated_tokens(1), 5);
}

TEST(Scheduler, SharedPrefixReusesCachedPages) {
  Scheduler s(small_options());
  const auto shared = prompt_of(12);
  auto a = shared;
  a.push_back(200);
  s.add(1, a);
  step_once(s);
  s.finish(1);
  EXPECT_EQ(s.kv(0).cached_pages(), 3);
  auto b = shared;
  b.push_back(300);
  b.push_back(301);
  s.add(2, b);
  ScheduledStep step = step_once(s);
  const ScheduledChunk* c = chunk_of(step, 2);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->begin, 12);  // three cached pages
  EXPECT_EQ(s.cached_prompt_tokens(2), 12);
  EXPECT_EQ(s.kv(0).stats().hit_tokens, 12);
  EXPECT_EQ(s.kv(0).stats().query_tokens, 12 + 13);  // all but the last prompt token
}

TEST(Scheduler, ConcurrentRequestsShareAPrefixComputedEarlier) {
  SchedulerOptions o = small_options();
  o.chunked_prefill_size = 8;
  Scheduler s(o);
  s.add(1, prompt_of(16));
  step_once(s);  // first 8 tokens: two whole pages now indexed
  s.add(2, prompt_of(16));
  ScheduledStep step = step_once(s);
  const ScheduledChunk* c = chunk_of(step, 2);
  EXPECT_EQ(c, nullptr);  // request 1's chunk used the whole budget
  step = step_once(s);
  c = chunk_of(step, 2);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->begin, 12);  // the three whole pages request 1 computed
}

TEST(Scheduler, AttentionDpSpreadsRequestsAndFollowsCachedPrefixes) {
  SchedulerOptions o = small_options();
  o.attn_dp = 2;
  Scheduler s(o);
  s.add(1, prompt_of(9));
  s.add(2, prompt_of(9, 40));
  ScheduledStep step = step_once(s);
  EXPECT_EQ(chunk_of(step, 1)->replica, 0);
  EXPECT_EQ(chunk_of(step, 2)->replica, 1);
  EXPECT_EQ(step.plan.micro_batches.at(0).replicas.size(), 2u);
  s.finish(1);
  s.finish(2);
  auto again = prompt_of(9, 40);
  again.push_back(7);
  s.add(3, again);  // request 2's prefix is cached on replica 1
  step = step_once(s);
  EXPECT_EQ(chunk_of(step, 3)->replica, 1);
  EXPECT_EQ(s.cached_prompt_tokens(3), 8);
}

TEST(Scheduler, PipelineCutsTheStepIntoMicroBatches) {
  SchedulerOptions o = small_options();
  o.pp = 2;
  Scheduler s(o);
  for (RequestId id = 1; id <= 3; ++id) s.add(id, prompt_of(3));
  ScheduledStep step = step_once(s);
  ASSERT_EQ(step.plan.micro_batches.size(), 2u);  // ceil(3 / 2) = 2 sequences, then 1
  EXPECT_EQ(chunk_of(step, 1)->micro_batch, 0u);
  EXPECT_EQ(chunk_of(step, 2)->micro_batch, 0u);
  EXPECT_EQ(chunk_of(step, 3)->micro_batch, 1u);
  EXPECT_EQ(chunk_of(step, 3)->logit_row, 0);
}

// Samples token 100 + end for every chunk with logits of a step that ran.
std::vector<int32_t> sampled_for(const ScheduledStep& step) {
  std::vector<int32_t> sampled;
  for (const auto& c : step.chunks)
    if (c.logit_row >= 0) sampled.push_back(static_cast<int32_t>(100 + c.end));
  return sampled;
}

TEST(SchedulerGroups, GroupsTakeTheirShareOfRequestsAndStepInTurn) {
  SchedulerOptions o = small_options();
  o.pp = 2;
  o.pipeline_groups = 2;
  o.max_running_requests = 5;  // at most 3 per group
  Scheduler s(o);
  for (RequestId id = 1; id <= 7; ++id) s.add(id, prompt_of(3, static_cast<int32_t>(10 * id)));
  const ScheduledStep a = s.schedule(0);
  EXPECT_EQ(a.group, 0);
  EXPECT_EQ(a.chunks.size(), 3u);              // ceil(5 / 2)
  EXPECT_EQ(a.plan.micro_batches.size(), 1u);  // a group's step is one micro-batch
  const ScheduledStep b = s.schedule(1);       // while group 0's step is in flight
  EXPECT_EQ(b.chunks.size(), 2u);              // the rest of max_running_requests
  for (const auto& c : b.chunks) EXPECT_EQ(chunk_of(a, c.id), nullptr) << "request " << c.id << " in both groups";
  EXPECT_EQ(s.running(), 5);
  EXPECT_EQ(s.waiting(), 2);
  EXPECT_THROW(s.schedule(0), Error);  // group 0 again before its commit
  s.commit(a, sampled_for(a));
  const ScheduledStep a2 = s.schedule(0);  // group 0's decodes, while group 1's step is in flight
  EXPECT_EQ(a2.decode_tokens, 3);
  for (const auto& c : a2.chunks) EXPECT_NE(chunk_of(a, c.id), nullptr);
  s.commit(b, sampled_for(b));
  s.commit(a2, sampled_for(a2));
  for (RequestId id = 1; id <= 7; ++id) s.finish(id);
  EXPECT_EQ(used_pages(s), 0);
  EXPECT_THROW(s.schedule(2), Error);  // no such group
}

TEST(SchedulerGroups, ABurstOfRequestsIsSharedEvenlyBetweenTheGroups) {
  SchedulerOptions o = small_options();
  o.pp = 2;
  o.pipeline_groups = 2;
  o.max_running_requests = 64;
  Scheduler s(o);
  for (RequestId id = 1; id <= 5; ++id) s.add(id, prompt_of(3, static_cast<int32_t>(10 * id)));
  const ScheduledStep a = s.schedule(0);
  const ScheduledStep b = s.schedule(1);
  EXPECT_EQ(a.chunks.size(), 3u);
  EXPECT_EQ(b.chunks.size(), 2u);
  s.commit(a, sampled_for(a));
  s.add(6, prompt_of(3, 70));  // a later arrival joins the group scheduled next
  const ScheduledStep a2 = s.schedule(0);
  EXPECT_EQ(a2.chunks.size(), 3u);  // group 0 holds its share of 6 already
  s.commit(b, sampled_for(b));
  const ScheduledStep b2 = s.schedule(1);
  EXPECT_EQ(b2.chunks.size(), 3u);
  EXPECT_NE(chunk_of(b2, 6), nullptr);
  s.commit(a2, sampled_for(a2));
  s.commit(b2, sampled_for(b2));
  // One request alone runs in the first group scheduled.
  for (RequestId id = 1; id <= 6; ++id) s.finish(id);
  s.add(7, prompt_of(4));
  EXPECT_EQ(s.schedule(0).chunks.size(), 1u);
}

TEST(SchedulerGroups, StepsInFlightAreNeverPreemptedAndFinishedOnesAreSkippedAtCommit) {
  SchedulerOptions o = small_options();
  o.pp = 2;
  o.pipeline_groups = 2;
  o.pages_per_replica = 5;  // 4 usable pages of 4 tokens
  o.admission_headroom = 0;
  o.prefix_cache = false;
  Scheduler s(o);
  s.add(1, prompt_of(8));  // 2 pages, group 0
  const ScheduledStep a = s.schedule(0);
  s.add(2, prompt_of(8, 40));  // 2 pages, group 1
  const ScheduledStep b = s.schedule(1);
  ASSERT_EQ(b.chunks.size(), 1u);
  s.commit(a, sampled_for(a));  // request 1 now has 9 tokens: its next step needs a third page
  // Request 2 (newer) holds the other two pages, but its step is in flight: request 1 cannot
  // take them, so it gives its own pages up and waits.
  const ScheduledStep a2 = s.schedule(0);
  EXPECT_TRUE(a2.empty());
  EXPECT_EQ(s.preemptions(), 1);
  EXPECT_EQ(s.waiting(), 1);
  // Request 2 is cancelled while in flight; its commit is skipped and its pages are free.
  EXPECT_TRUE(s.finish(2));
  EXPECT_NO_THROW(s.commit(b, sampled_for(b)));
  EXPECT_EQ(used_pages(s), 0);
  const ScheduledStep again = s.schedule(0);  // request 1 recomputes and samples
  ASSERT_EQ(again.chunks.size(), 1u);
  EXPECT_EQ(again.chunks[0].id, 1u);
  s.commit(again, sampled_for(again));
  EXPECT_EQ(s.generated_tokens(1), 2);
}

// A random workload's requests: arrivals (prompts sharing 0, 4 or 8 leading tokens, then up
// to 30 of their own), aborts, and a random token for every chunk that samples; a request ends
// once it has its max new tokens. Both random-workload tests drive their scheduler with it.
struct RandomWorkload {
  RandomWorkload(Scheduler& scheduler, uint32_t seed, RequestId arrivals)
      : s(scheduler), rng(seed), arrivals(arrivals) {}

  // One call in three adds a request (the first `arrivals`), then one in eleven aborts a live one.
  void arrive_or_abort() {
    if (rng() % 3 == 0 && next_id < arrivals) {
      std::vector<int32_t> p;
      const int shared = static_cast<int>(rng() % 3) * 4;
      for (int i = 0; i < shared; ++i) p.push_back(i);
      const int own = 1 + static_cast<int>(rng() % 30);
      for (int i = 0; i < own; ++i) p.push_back(static_cast<int32_t>(rng() % 50));
      limit[next_id] = 1 + static_cast<int64_t>(rng() % 12);
      s.add(next_id++, p);
    }
    if (rng() % 11 == 0 && !limit.empty()) {
      auto it = std::next(limit.begin(), static_cast<std::ptrdiff_t>(rng() % limit.size()));
      s.finish(it->first);
      limit.erase(it);
    }
  }
  // Commits a step that ran with random tokens, then ends the requests it completed.
  void commit(const ScheduledStep& step) {
    std::vector<int32_t> sampled;
    for (const auto& c : step.chunks)
      if (c.logit_row >= 0) sampled.push_back(static_cast<int32_t>(rng() % 50));
    s.commit(step, sampled);
    end_completed(step);
  }
  void end_completed(const ScheduledStep& step) {
    for (const auto& c : step.chunks)
      if (c.logit_row >= 0 && limit.count(c.id) && s.generated_tokens(c.id) >= limit[c.id]) {
        s.finish(c.id);
        limit.erase(c.id);
        ++finished;
      }
  }
  bool live(RequestId id) const { return limit.count(id) > 0; }

  Scheduler& s;
  std::mt19937 rng;
  RequestId arrivals;
  std::map<RequestId, int64_t> limit;  // live requests: max new tokens
  RequestId next_id = 1;
  int finished = 0;
};

// Every token's slot lies in the page its block table names, and every batch is padded.
void expect_consistent_batches(const ScheduledStep& step, const SchedulerOptions& o) {
  for (const auto& mb : step.plan.micro_batches)
    for (int d = 0; d < o.attn_dp; ++d) {
      const auto& b = mb.replicas[d].batch;
      for (int64_t t = 0; t < b.num_tokens(); ++t) {
        const int32_t page = b.slots[t] / o.page_size;
        const int32_t row = b.seq_of_token[t];
        EXPECT_EQ(b.block_tables[row * b.max_pages_per_seq + b.positions[t] / o.page_size], page);
      }
      EXPECT_EQ(b.num_tokens(), step::padded_token_count(b.num_tokens()));
    }
}

// Random arrivals, aborts (also of requests whose step is in flight) and completions with one
// step per group in flight, completed oldest first: block tables stay consistent, no page of a
// live request's tokens in flight is handed to another step in flight, and every page comes
// back.
TEST(SchedulerGroups, RandomWorkloadWithStepsInFlightKeepsEveryInvariant) {
  for (int groups : {2, 3}) {
    SCOPED_TRACE(testing::Message() << groups << " groups");
    SchedulerOptions o = small_options();
    o.pages_per_replica = 25;
    o.attn_dp = 2;
    o.pp = groups;
    o.pipeline_groups = groups;
    o.chunked_prefill_size = 9;
    o.max_running_requests = 6;
    o.pad_batches = true;
    Scheduler s(o);
    RandomWorkload w(s, 10 + groups, 100);
    std::deque<ScheduledStep> in_flight;
    // (replica, page) of the tokens of live requests in a step (padding on the scratch page
    // excluded).
    auto live_pages = [&](const ScheduledStep& step) {
      std::set<std::pair<int, int32_t>> pages;
      for (const auto& mb : step.plan.micro_batches)
        for (int d = 0; d < o.attn_dp; ++d) {
          const step::ReplicaBatch& rb = mb.replicas[d];
          for (int64_t t = 0; t < rb.batch.num_tokens(); ++t) {
            const auto row = static_cast<size_t>(rb.batch.seq_of_token[t]);
            if (row >= rb.sequences.size()) continue;
            if (!w.live(step.chunks.at(rb.sequences[row]).id)) continue;
            pages.insert({d, rb.batch.slots[t] / static_cast<int32_t>(o.page_size)});
          }
        }
      return pages;
    };
    auto top_up = [&] {
      for (int g = 0; g < groups; ++g) {
        if (std::any_of(in_flight.begin(), in_flight.end(), [&](const ScheduledStep& f) { return f.group == g; }))
          continue;
        ScheduledStep step = s.schedule(g);
        if (step.empty()) continue;
        expect_consistent_batches(step, o);
        const auto mine = live_pages(step);
        for (const ScheduledStep& other : in_flight)
          for (const auto& page : live_pages(other))
            EXPECT_FALSE(mine.count(page))
                << "page " << page.second << " of replica " << page.first << " in two steps in flight";
        in_flight.push_back(std::move(step));
      }
    };
    auto complete_oldest = [&] {
      const ScheduledStep step = std::move(in_flight.front());
      in_flight.pop_front();
      w.commit(step);
    };
    for (int iter = 0; iter < 600; ++iter) {
      w.arrive_or_abort();  // aborts may hit requests in flight
      top_up();
      if (!in_flight.empty()) complete_oldest();
      for (int d = 0; d < o.attn_dp; ++d) s.kv(d).check_consistency();
    }
    for (int i = 0; i < 4000 && (!s.idle() || !in_flight.empty()); ++i) {
      top_up();
      if (!in_flight.empty()) complete_oldest();
    }
    EXPECT_TRUE(s.idle());
    EXPECT_TRUE(in_flight.empty());
    EXPECT_GT(w.finished, 30);
    EXPECT_EQ(used_pages(s), 0);
  }
}

TEST(Scheduler, BatchesArePaddedOnTheScratchPage) {
  SchedulerOptions o = small_options();
  o.pad_batches = true;
  Scheduler s(o);
  s.add(1, prompt_of(9));
  ScheduledStep step = step_once(s);
  const auto& batch = step.plan.micro_batches.at(0).replicas.at(0).batch;
  EXPECT_EQ(batch.num_tokens(), 10);
  EXPECT_EQ(batch.slots.back(), (o.pages_per_replica - 1) * o.page_size);
  EXPECT_EQ(batch.logit_rows, (std::vector<int32_t>{8}));
}

TEST(Scheduler, WarmupRunsTheLargestStepThenEveryPaddedDecodeSizeOnTheScratchPages) {
  SchedulerOptions o = small_options();
  o.pad_batches = true;
  o.attn_dp = 2;
  o.chunked_prefill_size = 20;
  o.max_running_requests = 12;  // steps of up to 32 tokens per replica, decode steps up to 12
  Scheduler s(o);
  std::vector<int64_t> sizes;
  for (const auto& plan : s.warmup_steps()) {
    ASSERT_EQ(plan.micro_batches.size(), 1u);
    const auto& replicas = plan.micro_batches[0].replicas;
    ASSERT_EQ(replicas.size(), 2u);
    for (const auto& rb : replicas) {
      EXPECT_EQ(rb.batch.num_tokens(), replicas[0].batch.num_tokens());
      for (int32_t slot : rb.batch.slots) EXPECT_EQ(slot, (o.pages_per_replica - 1) * o.page_size);
      EXPECT_TRUE(rb.sequences.empty());
    }
    sizes.push_back(replicas[0].batch.num_tokens());
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{32, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12}));
}

TEST(Scheduler, GraphWarmupCoversEveryDecodeSizeAtEveryTableWidthWidestFirst) {
  SchedulerOptions o = small_options();  // 4-token pages, 32 usable
  o.pad_batches = true;
  o.max_running_requests = 6;
  o.max_drafts = 2;  // verify steps of up to 18 tokens: padded 1..8, 10, 12, 14, 16, 20
  Scheduler s(o);
  std::vector<std::pair<int64_t, int64_t>> shapes;  // (tokens, width)
  for (const auto& plan : s.graph_warmup_steps(o.max_running_requests, /*max_context=*/30)) {
    ASSERT_EQ(plan.micro_batches.size(), 1u);
    const step::ReplicaBatch& rb = plan.micro_batches[0].replicas.at(0);
    const ForwardBatch& b = rb.batch;
    // Decode-shaped (a logit row per token, in order), one sequence per token on the scratch page.
    ASSERT_EQ(b.logit_rows.size(), static_cast<size_t>(b.num_tokens()));
    for (int64_t t = 0; t < b.num_tokens(); ++t) EXPECT_EQ(b.logit_rows[t], t);
    EXPECT_EQ(rb.sequences.size(), static_cast<size_t>(b.num_tokens()));
    EXPECT_EQ(b.block_tables.size(), static_cast<size_t>(b.num_tokens() * b.max_pages_per_seq));
    for (int32_t slot : b.slots) EXPECT_EQ(slot, (o.pages_per_replica - 1) * o.page_size);
    shapes.emplace_back(b.num_tokens(), b.max_pages_per_seq);
  }
  std::vector<std::pair<int64_t, int64_t>> expected;
  for (int64_t tokens : {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20})
    for (int64_t width : {8, 4, 2, 1}) expected.emplace_back(tokens, width);  // 30 tokens: 8 pages
  EXPECT_EQ(shapes, expected);
  // The context is bounded by the pool too: 32 pages.
  EXPECT_EQ(s.graph_warmup_steps(1, 1 << 20).front().micro_batches[0].replicas[0].batch.max_pages_per_seq, 32);
}

// Random arrivals, lengths, aborts and a small pool: every planned token sits in a page its
// sequence holds, positions follow the cached prefix, and all pages come back at the end.
TEST(Scheduler, RandomWorkloadKeepsEveryInvariant) {
  for (bool prefix_cache : {true, false}) {
    SchedulerOptions o = small_options();
    o.pages_per_replica = 25;
    o.attn_dp = 2;
    o.pp = 2;
    o.chunked_prefill_size = 9;
    o.max_running_requests = 6;
    o.prefix_cache = prefix_cache;
    o.pad_batches = true;
    Scheduler s(o);
    RandomWorkload w(s, prefix_cache ? 3 : 4, 80);
    for (int iter = 0; iter < 400; ++iter) {
      w.arrive_or_abort();
      ScheduledStep step = s.schedule();
      expect_consistent_batches(step, o);
      w.commit(step);
      for (int d = 0; d < o.attn_dp; ++d) s.kv(d).check_consistency();
    }
    for (int i = 0; i < 2000 && !s.idle(); ++i) w.end_completed(step_once(s));
    EXPECT_TRUE(s.idle());
    EXPECT_GT(w.finished, 30);
    EXPECT_EQ(used_pages(s), 0);
    s.flush_prefix_cache();
    for (int d = 0; d < o.attn_dp; ++d) EXPECT_EQ(s.kv(d).free_pages(), o.pages_per_replica - 1);
  }
}

TEST(Scheduler, PromptLogitsGiveEveryPromptTokenARowAcrossChunks) {
  SchedulerOptions o = small_options();
  o.chunked_prefill_size = 4;
  Scheduler s(o);
  s.add(1, prompt_of(9));
  step_once(s);  // request 1's prompt is now in the prefix cache
  s.finish(1);
  s.add(2, prompt_of(9), {.prompt_logits = true});  // the same prompt: no prefix reuse
  std::vector<int64_t> positions;                   // the position of each prompt row, in delivery order
  for (int i = 0; i < 3; ++i) {
    const ScheduledStep step = step_once(s);
    ASSERT_EQ(step.chunks.size(), 1u);
    const ScheduledChunk& c = step.chunks[0];
    ASSERT_TRUE(c.prompt_rows);
    const step::ReplicaBatch& rb = step.plan.micro_batches[c.micro_batch].replicas[c.replica];
    for (int64_t t = c.begin; t < c.end; ++t) {
      const int32_t token_index = rb.batch.logit_rows[c.first_prompt_row + t - c.begin];
      positions.push_back(rb.batch.positions[token_index]);
    }
    EXPECT_EQ(c.logit_row, c.end == 9 ? c.first_prompt_row + c.end - c.begin - 1 : -1);
  }
  EXPECT_EQ(positions, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(s.cached_prompt_tokens(2), 0);
  // Decode after the prompt: one row, the usual way.
  const ScheduledStep decode = step_once(s);
  ASSERT_EQ(decode.chunks.size(), 1u);
  EXPECT_FALSE(decode.chunks[0].prompt_rows);
  EXPECT_EQ(decode.chunks[0].logit_row, 0);
}

}  // namespace
}  // namespace moeserve::sched
