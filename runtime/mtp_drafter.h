// NEXTN (DeepSeek-V3's MTP layer as a drafter, SGLang's --speculative-algorithm NEXTN): after
// each target step, one draft forward of the MTP layer alone (ForwardBatch::mtp_draft) over
// every position the target computed, on the target's final hidden states and the embedding
// of the token after each (the MTP layer's own cache catches up: prompt chunks, accepted
// drafts; positions a rejected draft had written are written again); its head's argmax at a
// sequence's last position is draft 1. Drafts 2..k chain: one forward each, at the next
// position, on the MTP layer's previous output and the previous draft (as SGLang chains it).
// Drafts are greedy (argmax) whatever the request samples: the verifier's rejection sampling
// takes a point-mass draft, so outputs stay exact.
//
// The MTP layer's latents live in its own cache at the sequence's own slots (the same pages
// as the target's: allocated and freed with the request, nothing to leak); a chain stops
// where the sequence's pages end (its next step's pages are the scheduler's to allocate).
// The MTP layer is on the last pipeline stage; earlier stages skip draft steps. Under attention
// DP each replica drafts its own sequences in the same draft step (a replica without any runs
// it with no tokens: the MTP layer's MoE exchange needs every rank of the stage).
//
// A step after which no sequence drafts (the draft budget chose none, spec/draft_budget.h, or
// no request speculates) runs no forward at all: each sequence's MTP cache is left behind from
// the first position it lacks, and the first step that drafts again catches it up from there
// (the target's hidden states of those positions stay in the store, at their slots), at most a
// step's worth of tokens per replica at a time; a sequence still behind gets no drafts. Pages a
// later request takes from the prefix cache meanwhile may lack MTP latents: its drafts are
// worse (and a draft outside the vocabulary ends the chain), its outputs unchanged.
#pragma once

#include <unordered_map>

#include "runtime/engine.h"
#include "sched/scheduler.h"
#include "spec/model_drafter.h"

namespace moeserve::runtime {

class MtpDrafter : public spec::ModelDrafter {
 public:
  // The engine must have loaded the MTP layer (EngineOptions::run.mtp); the scheduler is the
  // step loop's (each sequence's tokens and pages as of its last commit).
  MtpDrafter(Engine& engine, const sched::Scheduler& scheduler);
  void after_step(std::span<const spec::CommittedSpan> committed) override;
  std::vector<int32_t> take(uint64_t id) override;
  void forget(uint64_t id) override {
    drafts_.erase(id);
    behind_.erase(id);
  }
  bool filled_gaps() const override { return filled_gaps_; }
  // Its shapes: a catch-up of each padded sequence count and a chained step of each, at every
  // block-table width (the shapes pad() gives), each on the scheduler's scratch pages.
  void warm_up(int64_t max_sequences, int64_t max_context) override;

 private:
  // A sequence being drafted for: its tokens then its drafts so far.
  struct Chain {
    uint64_t id;
    int replica;
    std::vector<int32_t> tokens;  // prompt, output, then drafts
    std::span<const int32_t> pages;
    int64_t max_drafts;
    int64_t own;     // the sequence's own tokens (the rest are drafts)
    size_t row = 0;  // its logit row in its replica's batch of the current draft step
    int64_t drafted() const { return static_cast<int64_t>(tokens.size()) - own; }
  };
  // One draft step's batch per replica (ForwardBatch::mtp_draft), block tables `width` wide.
  std::vector<step::ReplicaBatch> draft_batches(int64_t width) const;
  // The spans the catch-up runs: each widened back to where its sequence's MTP cache stops,
  // within a step's tokens per replica (a sequence not caught up runs part of its gap and
  // drafts nothing).
  std::vector<spec::CommittedSpan> with_gaps(std::span<const spec::CommittedSpan> committed);
  // The catch-up forward over every span; draft 1 of each chain that asks.
  std::vector<Chain> catch_up(std::span<const spec::CommittedSpan> committed);
  // One chained forward: the next draft of every chain that has room.
  void chain_step(std::vector<Chain>& chains);
  // Pads each replica's draft step where the scheduler pads target steps (few shapes, each
  // replayed from a captured graph): a decode step's catch-up to (1 + max drafts) tokens and
  // one logit row per sequence of its padded sequence count, other steps to
  // step::padded_token_count; the extra tokens on the replica's scratch page, their MTP input the
  // scratch slot's store row, the extra logit rows repeating the last (their argmax is not read).
  void pad(std::vector<step::ReplicaBatch>& batches) const;
  // Runs one draft step (greedy draw); each chain gains the argmax of its row.
  void run(std::vector<step::ReplicaBatch> batches, std::vector<Chain>& chains);

  Engine& engine_;
  const sched::Scheduler& scheduler_;
  int64_t page_size_, slots_;
  std::unordered_map<uint64_t, std::vector<int32_t>> drafts_;  // each sequence's, until taken
  std::unordered_map<uint64_t, int64_t> behind_;               // the first position its MTP cache lacks
  bool filled_gaps_ = false;                                   // the last after_step widened a span into its gap
};

}  // namespace moeserve::runtime
