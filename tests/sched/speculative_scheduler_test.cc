// The scheduler under speculative decoding, with a fake target (the next token is a function
// of the last two) and a drafter that is right for a random prefix of its drafts: each step's
// latents are simulated per cache slot, and every cached position a step reads must hold its
// sequence's committed token (so neither a rejected draft's latent nor a prefix-cache page
// written for one is ever read). Outputs equal those without speculation; rejected drafts'
// pages go back at commit; after the load every page is free.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/error.h"
#include "sched/scheduler.h"

namespace moeserve::sched {
namespace {

using Tokens = std::vector<int32_t>;
constexpr int32_t kVocab = 11;

int32_t target_next(std::span<const int32_t> tokens) {
  const size_t n = tokens.size();
  return (tokens[n - 1] * 3 + tokens[n - 2] * 5 + 1) % kVocab;
}

int64_t pages_for(int64_t tokens, int64_t page_size) { return (tokens + page_size - 1) / page_size; }

class Harness {
 public:
  Harness(const SchedulerOptions& options, bool speculate, uint32_t seed)
      : s_(options), speculate_(speculate), rng_(seed) {}

  void add(RequestId id, Tokens prompt, int64_t limit) {
    truth_[id] = prompt;
    prompt_len_[id] = static_cast<int64_t>(prompt.size());
    limit_[id] = limit;
    s_.add(id, std::move(prompt));
  }

  // A drafter right for a random number of tokens, then wrong.
  Tokens drafts(std::span<const int32_t> tokens) {
    Tokens seq(tokens.begin(), tokens.end()), out;
    const int64_t want = static_cast<int64_t>(rng_() % (s_.options().max_drafts + 1));
    const int64_t right = static_cast<int64_t>(rng_() % (want + 1));
    for (int64_t i = 0; i < want; ++i) {
      int32_t t = target_next(seq);
      if (i >= right) t = (t + 1) % kVocab;
      out.push_back(t);
      seq.push_back(t);
    }
    return out;
  }

  void step() {
    DraftSource source;
    if (speculate_) source = [this](RequestId, std::span<const int32_t> tokens) { return drafts(tokens); };
    const ScheduledStep step = s_.schedule(0, source);
    ASSERT_FALSE(step.empty());
    run_latents(step);
    Tokens sampled;
    std::vector<int64_t> accepted;
    for (const ScheduledChunk& c : step.chunks) {
      if (c.logit_row < 0) continue;
      Tokens seq = truth_[c.id];
      int64_t a = 0;
      while (a < static_cast<int64_t>(c.drafts.size()) && c.drafts[a] == target_next(seq)) seq.push_back(c.drafts[a++]);
      accepted.push_back(a);
      sampled.push_back(target_next(seq));
      seq.push_back(sampled.back());
      truth_[c.id] = seq;
      accepted_ += a;
    }
    s_.commit(step, sampled, accepted);
    for (const ScheduledChunk& c : step.chunks)
      if (c.logit_row >= 0 && s_.generated_tokens(c.id) >= limit_[c.id]) {
        outputs_[c.id] =
            Tokens(truth_[c.id].begin() + prompt_len_[c.id], truth_[c.id].begin() + prompt_len_[c.id] + limit_[c.id]);
        s_.finish(c.id);
      }
    for (int d = 0; d < s_.num_replicas(); ++d) s_.kv(d).check_consistency();
  }

  Scheduler& scheduler() { return s_; }
  const std::map<RequestId, Tokens>& outputs() const { return outputs_; }
  int64_t accepted() const { return accepted_; }

 private:
  // Writes every token's latent (its token id) to its slot, then checks what each token reads.
  void run_latents(const ScheduledStep& step) {
    for (const auto& mb : step.plan.micro_batches)
      for (size_t d = 0; d < mb.replicas.size(); ++d) {
        const step::ReplicaBatch& rb = mb.replicas[d];
        const ForwardBatch& b = rb.batch;
        for (int64_t t = 0; t < b.num_tokens(); ++t) latent_[{d, b.slots[t]}] = b.tokens[t];
        for (int64_t t = 0; t < b.num_tokens(); ++t) check_reads(step, rb, d, t);
      }
  }

  void check_reads(const ScheduledStep& step, const step::ReplicaBatch& rb, size_t d, int64_t t) {
    const ForwardBatch& b = rb.batch;
    const ScheduledChunk& c = step.chunks[rb.sequences[b.seq_of_token[t]]];
    const Tokens& seq = truth_[c.id];
    const int64_t page_size = s_.options().page_size;
    for (int64_t j = 0; j <= b.positions[t]; ++j) {
      const int32_t page = b.block_tables[b.seq_of_token[t] * b.max_pages_per_seq + j / page_size];
      const int32_t want = j < static_cast<int64_t>(seq.size()) ? seq[j] : c.drafts[j - seq.size()];
      ASSERT_EQ(latent_.at({d, page * page_size + j % page_size}), want)
          << "request " << c.id << " position " << j << " reads a stale latent";
    }
  }

  Scheduler s_;
  bool speculate_;
  std::mt19937 rng_;
  std::map<RequestId, Tokens> truth_, outputs_;
  std::map<RequestId, int64_t> prompt_len_, limit_;
  std::map<std::pair<size_t, int32_t>, int32_t> latent_;  // (replica, slot) -> token
  int64_t accepted_ = 0;
};

SchedulerOptions options(int64_t pages) {
  SchedulerOptions o;
  o.page_size = 4;
  o.pages_per_replica = pages;
  o.attn_dp = 2;
  o.max_running_requests = 6;
  o.chunked_prefill_size = 8;
  o.pad_batches = false;
  o.max_drafts = 5;
  return o;
}

// Requests arriving every `interval` steps, sharing prompt prefixes (prefix-cache hits), of
// mixed lengths.
std::map<RequestId, Tokens> run_load(bool speculate, int64_t pages, int interval, int64_t* accepted,
                                     int64_t* preemptions) {
  Harness h(options(pages), speculate, 7);
  std::mt19937 rng(3);
  const Tokens shared = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  RequestId next = 0;
  for (int step = 0; step < 4000 && (next < 24 || !h.scheduler().idle()); ++step) {
    if (next < 24 && step % interval == 0) {
      Tokens prompt(shared.begin(), shared.begin() + 2 + static_cast<int64_t>(rng() % 8));
      for (uint32_t i = 0, n = rng() % 6; i < n; ++i) prompt.push_back(static_cast<int32_t>(rng() % kVocab));
      h.add(next++, prompt, 3 + static_cast<int64_t>(rng() % 20));
    }
    if (!h.scheduler().idle()) h.step();
    if (::testing::Test::HasFatalFailure()) return {};
  }
  EXPECT_TRUE(h.scheduler().idle());
  for (int d = 0; d < h.scheduler().num_replicas(); ++d) {
    kv::KvCache& kv = h.scheduler().kv(d);
    EXPECT_EQ(kv.used_pages(), 0) << "replica " << d;
    kv.flush();
    EXPECT_EQ(kv.free_pages(), kv.num_pages()) << "replica " << d;
  }
  *accepted = h.accepted();
  *preemptions = h.scheduler().preemptions();
  return h.outputs();
}

TEST(SpeculativeScheduler, OutputsEqualPlainAndNoStaleLatentIsRead) {
  for (int64_t pages : {64, 12}) {  // 12, with a request every step: preemptions
    const int interval = pages == 12 ? 1 : 3;
    int64_t accepted = 0, plain_accepted = 0, preemptions = 0, plain_preemptions = 0;
    const auto plain = run_load(false, pages, interval, &plain_accepted, &plain_preemptions);
    const auto spec = run_load(true, pages, interval, &accepted, &preemptions);
    ASSERT_EQ(plain.size(), 24u);
    EXPECT_EQ(spec, plain) << pages << " pages";
    EXPECT_GT(accepted, 0);
    if (pages == 12) {  // the speculative load is preempted and recomputed too
      EXPECT_GT(preemptions, 0);
      EXPECT_GT(plain_preemptions, 0);
    }
  }
}

TEST(SpeculativeScheduler, RejectedDraftsPagesGoBackAtCommit) {
  SchedulerOptions o = options(40);
  o.attn_dp = 1;
  o.max_drafts = 9;
  Scheduler s(o);
  s.add(1, Tokens{1, 2, 3});
  ScheduledStep prefill = s.schedule();
  s.commit(prefill, Tokens{4});  // 4 tokens, one page
  const ScheduledStep verify = s.schedule(0, [](RequestId, std::span<const int32_t>) { return Tokens(9, 0); });
  ASSERT_EQ(verify.chunks.size(), 1u);
  EXPECT_EQ(verify.chunks[0].drafts.size(), 9u);
  EXPECT_EQ(verify.chunks[0].logit_rows(), 10);
  EXPECT_EQ(verify.plan.micro_batches[0].replicas[0].batch.logit_rows.size(), 10u);
  EXPECT_EQ(s.kv(0).used_pages(), pages_for(4 + 9, 4));
  s.commit(verify, Tokens{6}, std::vector<int64_t>{2});  // two drafts accepted, then token 6
  EXPECT_EQ(s.generated_tokens(1), 4);
  EXPECT_EQ(s.kv(0).used_pages(), pages_for(7, 4));
  // Its next step runs only the new token: the accepted drafts' latents are cached.
  const ScheduledStep next = s.schedule();
  ASSERT_EQ(next.chunks.size(), 1u);
  EXPECT_EQ(next.chunks[0].begin, 6);
  EXPECT_EQ(next.chunks[0].end, 7);
  EXPECT_THROW(s.commit(next, Tokens{1}, std::vector<int64_t>{1}), Error);  // it had no drafts
}

TEST(SpeculativeScheduler, DraftsNeverPreempt) {
  SchedulerOptions o = options(5);  // 4 usable pages of 4 tokens
  o.attn_dp = 1;
  o.chunked_prefill_size = 64;
  o.admission_headroom = 0;
  Scheduler s(o);
  s.add(1, Tokens{1, 2, 3, 4, 5, 6, 7});
  s.add(2, Tokens{1, 2, 3, 4, 5, 6, 7});
  // Two pages each; at commit the second's first page merges into the first's (the same
  // tokens): one page free, fewer than the drafts' pages plus one per running sequence.
  s.commit(s.schedule(), Tokens{8, 8});
  EXPECT_EQ(s.kv(0).free_pages(), 1);
  const ScheduledStep verify = s.schedule(0, [](RequestId, std::span<const int32_t>) { return Tokens(5, 0); });
  EXPECT_EQ(s.preemptions(), 0);
  for (const ScheduledChunk& c : verify.chunks) EXPECT_TRUE(c.drafts.empty()) << "request " << c.id;
}

}  // namespace
}  // namespace moeserve::sched
