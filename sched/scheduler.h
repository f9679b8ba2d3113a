// The scheduler of the serving loop: request states, waiting and running queues, KV page
// admission, continuous batching of prefill and decode, chunked prefill, preemption by
// recompute, attention-DP replicas and pipeline micro-batches. Pure bookkeeping: it fills
// StepPlans (step/step_plan.h: token ids, positions, cache slots, block tables) and never
// touches a tensor; the caller (runtime::StepLoop) runs the plan, samples, and commits.
//
// One step (schedule):
//   1. Running sequences, oldest first. A sequence with one uncached token (decode) always
//      runs; one with more (a prompt, or a recompute after preemption) runs a chunk of at
//      most the replica's remaining prefill budget (chunked_prefill_size tokens per replica
//      per step). A page it needs and cannot get preempts the newest running sequence of the
//      same replica (possibly itself): its pages are released (whole pages stay in the prefix
//      cache) and it goes back to the front of the waiting queue, to be recomputed.
//   2. Waiting requests, first come first served, while fewer than max_running_requests run
//      and the replica has prefill budget: the replica holding the longest cached prefix of
//      the prompt (ties: the one with fewer running sequences) takes it if its free and
//      evictable pages cover the rest of the prompt plus a headroom for running decodes.
//   3. The chosen chunks, in that order, are cut into pipeline micro-batches (ceil(n / pp)
//      sequences each unless max_micro_batch_size says otherwise); each replica's batch is
//      padded to step::padded_token_count on its scratch page.
// A chunk that reaches the end of its sequence's tokens asks for logits: the caller samples
// the next token and passes it to commit(), which marks the chunk's tokens cached and
// indexes their whole pages in the prefix cache. A request added with prompt_logits gets a
// logit row for every prompt token (each of its prefill chunks asks for all its tokens' rows,
// in position order); it reuses no cached prefix, whose tokens would have no rows.
//
// Speculative decoding (max_drafts > 0): a sequence whose chunk reaches the end of its tokens
// may run drafts after its last token (schedule's DraftSource proposes them): its chunk is
// [last token, draft_1 .. draft_k] with a logit row each, its pages cover them, and commit()
// is told how many drafts the target accepted: those and the next token join the sequence,
// its cached length ends after the last accepted draft, and the pages past its tokens (written
// for rejected drafts) go back to the pool. Rejected tokens never reach the prefix index: it
// indexes only committed tokens. Drafts only take pages that no preemption is needed for
// (with one page per running sequence of the replica kept free for their decodes).
//
// Pipeline groups (pipeline_groups > 1, for pipeline plans): the running sequences form that
// many groups, each admitting up to an even share of the requests that could run (running and
// waiting, at most max_running_requests); schedule(g)
// builds group g's next step (one micro-batch) from its sequences and admits waiting requests
// into it, and the caller may run it while other groups' steps are still in flight. Until its
// commit a step's sequences are in flight: another group's scheduling never preempts them.
// finish() may end one in flight (its pages go back at once: the steps that reuse them run
// after it on every rank); commit() then skips its chunk.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache.h"
#include "step/step_plan.h"

namespace moeserve::sched {

using RequestId = uint64_t;

struct SchedulerOptions {
  int64_t page_size = 16;
  int64_t pages_per_replica = 0;  // the engine's KV pages per replica (one is the padding page)
  int attn_dp = 1;
  int pp = 1;
  int64_t max_micro_batch_size = 0;    // sequences per pipeline micro-batch (0: ceil(n / pp))
  int pipeline_groups = 1;             // groups of sequences whose steps may be in flight at once
  int64_t max_running_requests = 64;   // over all replicas
  int64_t chunked_prefill_size = 512;  // prefill tokens per replica per step
  bool prefix_cache = true;
  bool pad_batches = true;
  // Pages kept free at admission while other sequences run (a fraction of the replica's
  // pages), so that running decodes rarely need to preempt.
  double admission_headroom = 0.05;
  int64_t max_drafts = 0;  // draft tokens a sequence may verify per step (speculative decoding)
};

// The drafts to verify after a sequence's last token (`tokens`: its prompt and output so far);
// none to run it plainly.
using DraftSource = std::function<std::vector<int32_t>(uint64_t id, std::span<const int32_t> tokens)>;

struct RequestOptions {
  bool prompt_logits = false;  // a logit row for every prompt token (ScheduledChunk::prompt_rows)
};

// One sequence's part of a step.
struct ScheduledChunk {
  RequestId id;
  int replica;
  size_t micro_batch;
  int64_t begin, end;      // its tokens [begin, end) run this step
  int64_t logit_row = -1;  // >= 0: the row of (micro_batch, replica)'s logits to sample from
  // Prompt logits (RequestOptions::prompt_logits): rows [first_prompt_row, first_prompt_row +
  // end - begin) of (micro_batch, replica)'s logits are tokens [begin, end)'s, when
  // prompt_rows. A recompute after preemption may deliver a position again (same logits).
  bool prompt_rows = false;
  int64_t first_prompt_row = -1;
  // Verified after the sequence's last token: tokens [begin, end) are the sequence's, then
  // these; logit rows [logit_row, logit_row + drafts.size()] are the target's after each.
  std::vector<int32_t> drafts = {};
  int64_t logit_rows() const { return logit_row < 0 ? 0 : 1 + static_cast<int64_t>(drafts.size()); }
};

struct ScheduledStep {
  int group = 0;
  step::StepPlan plan;
  std::vector<ScheduledChunk> chunks;
  int64_t prefill_tokens = 0;  // tokens of chunks with more than one token, or not at the end
  int64_t decode_tokens = 0;   // of chunks of one token (and its drafts) at the end
  int64_t draft_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options);

  const SchedulerOptions& options() const { return options_; }
  // The most tokens (prompt + generated) one request can ever hold in a replica's cache.
  int64_t max_tokens_per_request() const;

  // Queues a request; its prompt must not be empty and its ids must be valid for the model
  // (the caller checks them).
  void add(RequestId id, std::vector<int32_t> prompt, RequestOptions options = {});
  // Ends a request wherever it is (finished, aborted, disconnected): its pages are released
  // and its whole computed pages stay in the prefix cache. False if the id is unknown.
  bool finish(RequestId id);

  // The next step of pipeline group `group` (the only group when pipeline_groups is 1); its
  // sequences are in flight until commit(). `drafts` (with max_drafts > 0) proposes each
  // decoding sequence's drafts.
  ScheduledStep schedule(int group = 0, const DraftSource& drafts = {});
  // After the step ran: `sampled[i]` is the next token of the i-th chunk that asked for
  // logits (chunks order), `accepted[i]` how many of its drafts were accepted (empty: none
  // had drafts). Chunks of requests finished since schedule() are skipped.
  void commit(const ScheduledStep& step, std::span<const int32_t> sampled, std::span<const int64_t> accepted = {});

  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  bool idle() const { return running_.empty() && waiting_.empty(); }
  int64_t preemptions() const { return preemptions_; }
  // Prompt tokens found in the prefix cache when the request was first admitted (0 before).
  int64_t cached_prompt_tokens(RequestId id) const;
  // Generated tokens of a request (committed so far).
  int64_t generated_tokens(RequestId id) const;
  // A running request's tokens (prompt, then generated) and block table as of its last commit
  // (a model drafter's input: runtime/mtp_drafter.h); empty for a request not running.
  struct SequenceView {
    std::span<const int32_t> tokens, pages;
  };
  SequenceView sequence(RequestId id) const;

  // The largest step one replica can run: a prefill budget plus a decode token per request.
  int64_t max_step_tokens() const {
    return options_.chunked_prefill_size + options_.max_running_requests * (1 + options_.max_drafts);
  }
  // Steps of padding only (on the scratch pages): the largest step (max_step_tokens(),
  // padded) first, then one per padded decode size up to max_running_requests. Running them
  // once at start-up sizes the activation memory (shared by every step size) and the backend
  // workspaces, so that memory does not grow while serving, and runs each decode shape once
  // (its graph is captured the next time it runs).
  std::vector<step::StepPlan> warmup_steps() const;
  // Decode-shaped steps of padding only, for the engine to capture the graphs it replays
  // while serving (a shape first met while serving runs eagerly once and is captured on the
  // step's critical path): every padded size of a step of up to `max_sequences` sequences of
  // one token and max_drafts drafts each, at every block-table width of sequences of up to
  // `max_context` tokens. Each is that many single-token sequences on the scratch page, every
  // token with logits; a size's widest table comes first, so its block tables are allocated
  // once for every step of that size (more would drop its graphs, model/workspace.h).
  std::vector<step::StepPlan> graph_warmup_steps(int64_t max_sequences, int64_t max_context) const;

  int num_replicas() const { return static_cast<int>(kv_.size()); }
  // A replica's padding page (outside its kv pool): where padded steps' extra tokens write.
  int32_t scratch_page(int replica) const { return scratch_page_.at(static_cast<size_t>(replica)); }
  const kv::KvCache& kv(int replica) const { return kv_.at(replica); }
  kv::KvCache& kv(int replica) { return kv_.at(replica); }
  // Evicts every cached page of every replica; returns how many.
  int64_t flush_prefix_cache();

 private:
  struct Sequence {
    RequestId id = 0;
    std::vector<int32_t> tokens;  // prompt, then generated
    int64_t prompt_len = 0;
    std::vector<int32_t> pages;  // block table in its replica's pool
    int64_t computed = 0;        // tokens whose latents are in the cache
    int replica = -1;            // while running
    int group = 0;               // pipeline group, while running
    bool in_flight = false;      // scheduled, not yet committed
    int64_t cached_prompt_tokens = 0;
    bool admitted_before = false;
    bool prompt_logits = false;  // until the prompt's last chunk is committed
  };
  struct Pick {
    Sequence* seq;
    int64_t begin, end;  // end: past the drafts
    std::vector<int32_t> drafts = {};
  };

  Sequence& seq(RequestId id);
  int64_t pages_for(int64_t tokens) const { return (tokens + options_.page_size - 1) / options_.page_size; }
  // Gives running_[index] pages for its first `tokens` tokens, preempting newer sequences of
  // its replica as needed; false if it had to preempt itself.
  bool ensure_pages(size_t index, int64_t tokens);
  // The drafts running_[index] verifies this step: the source's, cut to max_drafts and the
  // cache's room, or none when their pages would need a preemption.
  std::vector<int32_t> drafts_for(size_t index, const DraftSource& source);
  // Applies a committed chunk's verdict: accepted drafts and the next token join the sequence;
  // pages past its tokens go back.
  void accept(Sequence& s, const ScheduledChunk& chunk, int32_t token, int64_t accepted);
  void preempt(size_t index);
  void release_pages(Sequence& s);
  bool admit(int group, std::vector<int64_t>& budget, std::vector<Pick>& picks);
  int64_t running_on(int replica) const;
  int64_t running_in_group(int group) const;
  ScheduledStep build(int group, const std::vector<Pick>& picks) const;
  // Appends pick n (of micro-batch m) to its replica's batch `rb` and its chunk to `step`.
  void add_chunk(const Pick& p, size_t n, size_t m, step::ReplicaBatch& rb, ScheduledStep& step) const;

  SchedulerOptions options_;
  std::vector<kv::KvCache> kv_;        // [attn_dp]
  std::vector<int32_t> scratch_page_;  // [attn_dp] the padding page, outside the kv pool
  std::unordered_map<RequestId, Sequence> seqs_;
  std::deque<RequestId> waiting_;
  std::vector<RequestId> running_;  // admission order
  int64_t preemptions_ = 0;
};

}  // namespace moeserve::sched
