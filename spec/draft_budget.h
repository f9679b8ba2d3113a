// How many drafts the sequences of a decode step verify, chosen from what earlier steps cost,
// so that speculation never costs more than it gains (issue 21: at high concurrency and long
// context it backs off, down to none).
//
// A step of B decoding sequences with k drafts each costs seconds(B, k): the target's verify of
// k + 1 tokens per sequence and the drafter's forwards. If each draft is accepted with
// probability a given the previous one was (a chain), d drafts yield E(d) = 1 + a + ... + a^d
// tokens. A drafter may have no guess for some sequences (NGRAM without a match): with a
// fraction f of the sequences drafting, d drafts each on average in the steps measured, k is
// worth B * ((1 - f) + f * E(d)) / seconds(B, k) tokens per second. The budget measures
// seconds per batch-size class (powers of two: 1, 2-3, 4-7, ...) and candidate k (0, 1, 2, 4, ...
// up to the configured maximum, which is tried first), estimates a from every verdict, and
// picks the k with the most tokens per second, keeping its current choice unless another beats
// it by kSwitchMargin (a near tie would otherwise flip the choice back and forth, and a switch
// away from k = 0 costs a model drafter a catch-up); k = 0 is plain decoding. A cell's time is the
// median of its last kRecent samples, trusted from kMinSamples on: the first step of a new
// shape (a CUDA graph captured, a workspace grown) is an outlier the median drops. The best k
// is measured every step it runs; the others are probed again, the one measured longest ago,
// after kFirstProbe steps, then at doubling intervals (up to kLastProbe) while the best stays
// the best, so probing costs little once the choice has settled and the choice still follows
// the context growing and the load changing. A probe whose one sample beats the best is run
// again at once until its median rests on fresh samples only (a cell measured long ago, under
// another load, must not keep the choice where it is). A step whose time is not the steady
// cost of its k (a model drafter first caught up the positions it had skipped while nothing
// drafted: the price of switching, paid once) is not measured; a probe that ran into one is
// run again, up to kProbeRetries times, so that the cell gets a steady sample.
//
// Lossless whatever it picks: the verifier keeps every output token the target's (spec/verify.h).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moeserve::spec {

// One decode step that ran (no prefill in it): what the budget measures.
struct DraftStepSample {
  int64_t sequences = 0;  // decoding sequences in the step
  int64_t drafts = 0;     // the drafts per sequence choose() gave it
  double seconds = 0;     // the step's time: schedule, forward, draw, commit and its drafting
  int64_t drafting = 0;   // of its sequences, those that got drafts
  int64_t drafted = 0;    // drafts verified, over its sequences
  int64_t accepted = 0;   // of those, accepted
  int64_t rejected = 0;   // sequences whose chain stopped at a rejected draft
};

class DraftBudget {
 public:
  static constexpr int kRecent = 5;              // samples a cell's median is over
  static constexpr int kMinSamples = 3;          // before a cell is compared
  static constexpr int64_t kFirstProbe = 32;     // a class's steps before its first probe
  static constexpr int64_t kLastProbe = 2048;    // the longest interval between probes
  static constexpr int kProbeRetries = 8;        // unmeasured probe steps run again
  static constexpr double kSwitchMargin = 0.05;  // how much better another k must be to replace the best

  explicit DraftBudget(int64_t max_drafts);

  // The drafts per sequence the next step of `sequences` decoding sequences verifies.
  int64_t choose(int64_t sequences);
  void record(const DraftStepSample& sample);
  // A step whose time does not count (above): its verdicts still update the acceptance, and a
  // probe is run again.
  void record_unmeasured(const DraftStepSample& sample);

  // The estimate of a draft's acceptance given the previous one's.
  double acceptance() const { return accepted_ / trials_; }
  // Expected tokens per second of k drafts for `sequences` (0 while k is unmeasured there).
  double tokens_per_second(int64_t sequences, int64_t drafts) const;
  const std::vector<int64_t>& candidates() const { return candidates_; }
  // Every measured class and candidate, one line each: its median step time, samples, the
  // sequences drafting and their drafts, and expected tokens per second (the debug log's view
  // of the choice).
  std::string describe() const;

 private:
  struct Cell {
    std::array<double, kRecent> seconds = {};  // the last samples of the step's time, a ring
    // Moving averages of the fraction of sequences that got drafts (the drafter had a guess and
    // the sequence room) and of the drafts each of those got.
    double drafting_fraction = 0, drafts_when_drafting = 0;
    int64_t samples = 0;
    int64_t measured_at = -1;  // the class's step count when last measured
    double median_seconds() const;
  };
  struct SizeClass {
    std::vector<Cell> cells;  // per candidate
    int64_t steps = 0;        // choose() calls
    int64_t best = -1;        // the candidate chosen last outside a probe
    int64_t probe_interval = kFirstProbe, next_probe = kFirstProbe;
    int64_t confirming = -1;  // a probed candidate whose sample beat the best, run again
    int confirmations_left = 0;
    int64_t retrying = -1;  // a probe whose step was not measured, run again next
    int retries = 0;        // of the current probe
  };
  void record_acceptance(const DraftStepSample& sample);
  SizeClass& size_class(int64_t sequences);
  // Tokens per second of `cell`'s drafts for `sequences` sequences at `seconds` a step.
  double rate(int64_t sequences, const Cell& cell, double seconds) const;
  int candidate_index(int64_t drafts) const;

  std::vector<int64_t> candidates_;   // ascending: 0, 1, 2, 4, ..., max
  std::map<int, SizeClass> classes_;  // by floor(log2(sequences))
  // Decayed counts of chain positions verified and accepted; the prior is a = 1/2 worth two.
  double accepted_ = 1, trials_ = 2;
};

}  // namespace moeserve::spec
