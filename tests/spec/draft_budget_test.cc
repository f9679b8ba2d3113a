// spec::DraftBudget against simulated steps: a step's seconds come from a cost model of the
// verify (per token of the batch) and the drafting (per draft), each draft of a chain is
// accepted with a fixed probability (seeded), and the budget must find the best k per batch
// size: all drafts where verify is cheap, none where it costs more than it gains, and move when
// the costs change (the context grows).
#include "spec/draft_budget.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

namespace moeserve::spec {
namespace {

// Seconds of a step of `sequences` sequences verifying `drafts` drafts each.
using CostModel = std::function<double(int64_t sequences, int64_t drafts)>;

struct Simulation {
  double acceptance;
  std::mt19937_64 rng{21};
  int64_t tokens = 0;
  double seconds = 0;

  // One step: choose, run it under `cost`, record. Returns the k chosen.
  int64_t step(DraftBudget& budget, int64_t sequences, const CostModel& cost) {
    const int64_t k = budget.choose(sequences);
    DraftStepSample s{.sequences = sequences, .drafts = k, .seconds = cost(sequences, k)};
    std::bernoulli_distribution accept(acceptance);
    for (int64_t q = 0; q < sequences; ++q) {
      int64_t a = 0;
      while (a < k && accept(rng)) ++a;
      s.drafting += k > 0 ? 1 : 0;
      s.drafted += k;
      s.accepted += a;
      s.rejected += a < k ? 1 : 0;
      tokens += a + 1;
    }
    seconds += s.seconds;
    budget.record(s);
    return k;
  }
};

TEST(DraftBudget, CandidatesAreNonePowersOfTwoAndTheMaximum) {
  EXPECT_EQ(DraftBudget(1).candidates(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(DraftBudget(4).candidates(), (std::vector<int64_t>{0, 1, 2, 4}));
  EXPECT_EQ(DraftBudget(6).candidates(), (std::vector<int64_t>{0, 1, 2, 4, 6}));
}

TEST(DraftBudget, TriesTheMaximumFirstThenNoneThenTheRest) {
  DraftBudget budget(4);
  std::vector<int64_t> first;
  for (int i = 0; i < 4 * DraftBudget::kMinSamples; ++i) {
    first.push_back(budget.choose(8));
    budget.record({.sequences = 8, .drafts = first.back(), .seconds = 1.0});
  }
  EXPECT_EQ(first, (std::vector<int64_t>{4, 4, 4, 0, 0, 0, 2, 2, 2, 1, 1, 1}));
  // Another batch-size class is measured afresh.
  EXPECT_EQ(budget.choose(64), 4);
}

// The first step of a shape can be slow (a CUDA graph captured): one such sample in a cell does
// not decide, the median of its recent ones does.
TEST(DraftBudget, AnOutlierStepDoesNotDecide) {
  DraftBudget budget(4);
  Simulation sim{.acceptance = 0.7};
  bool first_of_shape = true;
  const CostModel cost = [&](int64_t, int64_t k) {
    const double seconds = 1e-3 * (1 + 0.02 * static_cast<double>(k));
    if (k == 4 && first_of_shape) {
      first_of_shape = false;
      return 100 * seconds;
    }
    return seconds;
  };
  for (int step = 0; step < 40; ++step) sim.step(budget, 1, cost);
  EXPECT_EQ(budget.choose(1), 4);
}

// Probes of the other candidates come at doubling intervals while the best stays the best.
TEST(DraftBudget, ProbesBackOffOnceTheChoiceSettles) {
  const CostModel cheap = [](int64_t, int64_t k) { return 1e-3 * (1 + 0.02 * static_cast<double>(k)); };
  DraftBudget budget(4);
  Simulation sim{.acceptance = 0.7};
  int64_t probes = 0;
  for (int step = 0; step < 20000; ++step) probes += sim.step(budget, 4, cheap) != 4 ? 1 : 0;
  // 9 steps to trust the three cells besides k = 4, then probes at 32, 64, 128, ... 2048 apart.
  EXPECT_LE(probes, 9 + 6 + 20000 / DraftBudget::kLastProbe + 1);
  EXPECT_GE(probes, 9 + 6);
}

// Cheap verify (a weight-bound step: 1 ms plus 2% per token of the batch) and acceptance
// 0.7: every draft pays. Expensive verify (compute-bound: time grows with the batch's tokens)
// and acceptance 0.3: none pays.
TEST(DraftBudget, PicksAllDraftsWhenVerifyIsCheapAndNoneWhenItIsNot) {
  const CostModel cheap = [](int64_t, int64_t k) { return 1e-3 * (1 + 0.02 * static_cast<double>(k)); };
  const CostModel dear = [](int64_t b, int64_t k) { return 1e-3 * static_cast<double>(b * (k + 1)); };
  for (const auto& [cost, acceptance, want] : {std::tuple{cheap, 0.7, int64_t{4}}, std::tuple{dear, 0.3, int64_t{0}}}) {
    DraftBudget budget(4);
    Simulation sim{.acceptance = acceptance};
    int chosen = 0;
    for (int step = 0; step < 1000; ++step) {
      const int64_t k = sim.step(budget, 16, cost);
      if (step >= 100) chosen += k == want ? 1 : 0;
    }
    // All but the probes of the other candidates (at 32, 64, 128, ... steps apart).
    EXPECT_GE(chosen, 890) << "want k = " << want;
  }
}

// One cost model across batch sizes: verify is weight-bound up to 32 tokens a step, then each
// token costs as much as the weights (compute-bound). At batch 1 all 4 drafts fit; at batch 64
// they cost more than the tokens they add.
TEST(DraftBudget, BacksOffAsTheBatchGrows) {
  const CostModel cost = [](int64_t b, int64_t k) {
    return 1e-3 * std::max(1.0, static_cast<double>(b * (k + 1)) / 32.0);
  };
  DraftBudget budget(4);
  Simulation sim{.acceptance = 0.6};
  std::map<int64_t, int64_t> last;
  for (int step = 0; step < 600; ++step)
    for (int64_t b : {1, 64}) last[b] = sim.step(budget, b, cost);
  EXPECT_GT(budget.tokens_per_second(1, 4), budget.tokens_per_second(1, 0));
  EXPECT_GT(budget.tokens_per_second(64, 0), budget.tokens_per_second(64, 4));
  EXPECT_NEAR(budget.acceptance(), 0.6, 0.05);
  // Chosen outside a re-measurement: the best of each class.
  EXPECT_EQ(budget.choose(1), 4);
  EXPECT_EQ(budget.choose(64), 0);
}

// Never slower than plain decoding by more than the re-measurements cost, and near the best
// fixed k where speculation pays; then the verify gets dear mid-run (a long context) and the
// budget follows.
TEST(DraftBudget, NeverSlowerThanPlainAndFollowsChangingCosts) {
  const CostModel dear = [](int64_t, int64_t k) { return 1e-3 * (1 + 0.8 * static_cast<double>(k)); };
  DraftBudget budget(4);
  Simulation adaptive{.acceptance = 0.4};
  for (int step = 0; step < 2000; ++step) adaptive.step(budget, 8, dear);
  const double plain_rate = 8 / 1e-3;  // k = 0: one token per sequence per 1 ms
  EXPECT_GE(adaptive.tokens / adaptive.seconds, 0.95 * plain_rate);

  const CostModel cheap = [](int64_t, int64_t k) { return 1e-3 * (1 + 0.05 * static_cast<double>(k)); };
  DraftBudget follows(4);
  Simulation sim{.acceptance = 0.8};
  for (int step = 0; step < 500; ++step) sim.step(follows, 8, cheap);
  EXPECT_EQ(follows.choose(8), 4);
  // k = 4 runs every step: its median follows the new costs within a few steps.
  const int64_t steps_to_switch = DraftBudget::kRecent;
  int64_t last = -1;
  for (int step = 0; step < steps_to_switch; ++step) last = sim.step(follows, 8, dear);
  EXPECT_LT(follows.tokens_per_second(8, 4), follows.tokens_per_second(8, 1))
      << "k = 4 re-measured under the dear costs";
  EXPECT_LT(follows.choose(8), 4) << "last chosen " << last;
}

// Two candidates within the noise of each other (k = 1 2% better than k = 0, every step's time
// off by up to 4%): the budget keeps one of them instead of switching with every new median.
TEST(DraftBudget, ANearTieKeepsTheChoice) {
  std::mt19937_64 noise_rng{5};
  std::uniform_real_distribution<double> noise(0.96, 1.04);
  // k = 1 yields 1.5 tokens per sequence at acceptance 0.5: at 1.47 ms, 2% more than k = 0 at 1 ms.
  const CostModel cost = [&](int64_t, int64_t k) {
    const double base = k == 0 ? 1e-3 : k == 1 ? 1.47e-3 : 1e-3 * static_cast<double>(1 + k);
    return base * noise(noise_rng);
  };
  DraftBudget budget(4);
  Simulation sim{.acceptance = 0.5};
  int64_t previous = -1, switches = 0;
  for (int step = 0; step < 4000; ++step) {
    const int64_t k = sim.step(budget, 8, cost);
    if (step >= 100 && k != previous) ++switches;
    previous = k;
  }
  // Probes alone, once the choice holds: about 7 in 4000 steps at doubling intervals from
  // kFirstProbe, two switches each (there and back). Without the margin it switched 61 times.
  EXPECT_LE(switches, 20);
}

// A cell measured long ago under another load (here: k = 0 while the machine was busy) must not
// hold the choice once the load has gone: the first probe of it beats the best, is confirmed by
// fresh samples, and the budget moves to it.
TEST(DraftBudget, AStaleCellIsProbedBackIntoTheChoice) {
  bool busy = true;
  const CostModel cost = [&](int64_t, int64_t k) {
    if (k == 0) return busy ? 10e-3 : 1e-3;
    return 1e-3 * (2 + 0.1 * static_cast<double>(k));
  };
  DraftBudget budget(4);
  Simulation sim{.acceptance = 0.5};
  for (int step = 0; step < 3000; ++step) sim.step(budget, 2, cost);
  EXPECT_NE(budget.choose(2), 0);
  busy = false;
  // Probes come at most kLastProbe apart and cycle through the three other candidates.
  const int settle = 3 * static_cast<int>(DraftBudget::kLastProbe) + 10;
  for (int step = 0; step < settle; ++step) sim.step(budget, 2, cost);
  int plain = 0;
  for (int step = 0; step < 500; ++step) plain += sim.step(budget, 2, cost) == 0 ? 1 : 0;
  EXPECT_GE(plain, 495);
}

// A probe step that caught a drafter up on skipped positions (the price of resuming) is not
// measured: the cell keeps its samples, the acceptance takes the verdicts, and the probe runs
// again next step, at most kProbeRetries times.
TEST(DraftBudget, AnUnmeasuredProbeIsRunAgain) {
  const CostModel dear = [](int64_t, int64_t k) { return 1e-3 * (1 + 0.8 * static_cast<double>(k)); };
  DraftBudget budget(4);
  Simulation sim{.acceptance = 0.4};
  for (int step = 0; step < 100; ++step) sim.step(budget, 8, dear);
  ASSERT_EQ(budget.choose(8), 0);
  int64_t probe = 0;
  for (int step = 0; step < 200 && probe == 0; ++step) {
    probe = budget.choose(8);
    if (probe == 0) budget.record({.sequences = 8, .drafts = 0, .seconds = dear(8, 0)});
  }
  ASSERT_GT(probe, 0) << "no probe in 200 steps";
  const double acceptance = budget.acceptance();
  // A slow step (its catch-up) whose drafts were all accepted: the verdicts count.
  budget.record_unmeasured({.sequences = 8,
                            .drafts = probe,
                            .seconds = 100 * dear(8, probe),
                            .drafting = 8,
                            .drafted = 8 * probe,
                            .accepted = 8 * probe});
  EXPECT_GT(budget.acceptance(), acceptance);
  ASSERT_EQ(budget.choose(8), probe);
  const double rate = budget.tokens_per_second(8, probe);
  for (int retry = 1; retry < DraftBudget::kProbeRetries; ++retry) {
    budget.record_unmeasured({.sequences = 8, .drafts = probe, .seconds = 100 * dear(8, probe)});
    EXPECT_EQ(budget.tokens_per_second(8, probe), rate) << "retry " << retry << ": the slow step was measured";
    ASSERT_EQ(budget.choose(8), probe) << "retry " << retry;
  }
  budget.record_unmeasured({.sequences = 8, .drafts = probe, .seconds = 100 * dear(8, probe)});
  EXPECT_EQ(budget.choose(8), 0) << "retried more than kProbeRetries times";
  // A measured sample ends the probe: the best runs again.
  budget.record({.sequences = 8, .drafts = 0, .seconds = dear(8, 0)});
  EXPECT_EQ(budget.choose(8), 0);
}

}  // namespace
}  // namespace moeserve::spec
