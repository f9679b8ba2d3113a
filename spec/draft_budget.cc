#include "spec/draft_budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>

#include "core/error.h"

namespace moeserve::spec {

namespace {
// Weight of a new measurement in a cell's moving average of drafts per sequence.
constexpr double kDraftsWeight = 0.25;
// Per step, older verdicts count this much less: the acceptance follows the text being written.
constexpr double kAcceptanceDecay = 0.995;
constexpr double kMaxAcceptance = 0.999;  // E(k) stays finite in k

// 1 + a + ... + a^d, continued to a fractional d (an average over sequences).
double expected_tokens(double a, double drafts) {
  a = std::min(a, kMaxAcceptance);
  return (1.0 - std::pow(a, drafts + 1.0)) / (1.0 - a);
}

double moving_average(double average, int64_t samples, double value) {
  return samples == 0 ? value : (1 - kDraftsWeight) * average + kDraftsWeight * value;
}

// The batch-size class of `sequences`: floor(log2), so 1, 2-3, 4-7, ... share one.
int class_of(int64_t sequences) {
  return static_cast<int>(std::bit_width(static_cast<uint64_t>(std::max<int64_t>(sequences, 1)))) - 1;
}
}  // namespace

DraftBudget::DraftBudget(int64_t max_drafts) {
  MS_CHECK(max_drafts >= 1, "draft budget: max_drafts {} must be >= 1", max_drafts);
  for (int64_t k = 0; k < max_drafts; k = k == 0 ? 1 : 2 * k) candidates_.push_back(k);
  candidates_.push_back(max_drafts);
}

double DraftBudget::Cell::median_seconds() const {
  const auto n = static_cast<size_t>(std::min<int64_t>(samples, kRecent));
  std::array<double, kRecent> sorted = seconds;
  for (size_t i = 1; i < n; ++i)  // insertion sort of at most kRecent values
    for (size_t j = i; j > 0 && sorted[j] < sorted[j - 1]; --j) std::swap(sorted[j], sorted[j - 1]);
  return n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
}

DraftBudget::SizeClass& DraftBudget::size_class(int64_t sequences) {
  SizeClass& c = classes_[class_of(sequences)];
  if (c.cells.empty()) c.cells.resize(candidates_.size());
  return c;
}

int DraftBudget::candidate_index(int64_t drafts) const {
  auto it = std::find(candidates_.begin(), candidates_.end(), drafts);
  return it == candidates_.end() ? -1 : static_cast<int>(it - candidates_.begin());
}

double DraftBudget::tokens_per_second(int64_t sequences, int64_t drafts) const {
  auto it = classes_.find(class_of(sequences));
  const int i = candidate_index(drafts);
  if (it == classes_.end() || i < 0 || it->second.cells.empty()) return 0;
  const Cell& cell = it->second.cells[static_cast<size_t>(i)];
  if (cell.samples < kMinSamples) return 0;
  return rate(sequences, cell, cell.median_seconds());
}

double DraftBudget::rate(int64_t sequences, const Cell& cell, double seconds) const {
  const double per_sequence =
      1 - cell.drafting_fraction + cell.drafting_fraction * expected_tokens(acceptance(), cell.drafts_when_drafting);
  return static_cast<double>(sequences) * per_sequence / seconds;
}

int64_t DraftBudget::choose(int64_t sequences) {
  SizeClass& c = size_class(sequences);
  ++c.steps;
  const size_t n = candidates_.size();
  // Cells not yet trusted first: the configured maximum, then none, then the rest from the top.
  if (c.cells[n - 1].samples < kMinSamples) return candidates_[n - 1];
  if (c.cells[0].samples < kMinSamples) return 0;
  for (size_t i = n - 1; i-- > 1;)
    if (c.cells[i].samples < kMinSamples) return candidates_[i];
  if (c.retrying >= 0) return std::exchange(c.retrying, -1);
  if (c.confirmations_left > 0) {
    --c.confirmations_left;
    return c.confirming;
  }
  int64_t best = candidates_[0];
  double best_rate = -1;
  for (int64_t k : candidates_) {
    const double rate = tokens_per_second(sequences, k);
    if (rate > best_rate) {
      best_rate = rate;
      best = k;
    }
  }
  // A near tie keeps the choice: cells measured at different times differ by that much in noise,
  // and switching has a price the cells do not hold (a model drafter catches up what it skipped).
  if (c.best >= 0 && best != c.best && best_rate < (1 + kSwitchMargin) * tokens_per_second(sequences, c.best))
    best = c.best;
  if (best != c.best) {  // a new best: probe the others soon again
    c.best = best;
    c.probe_interval = kFirstProbe;
    c.next_probe = c.steps + kFirstProbe;
  }
  if (c.steps < c.next_probe) return best;
  c.probe_interval = std::min(2 * c.probe_interval, kLastProbe);
  c.next_probe = c.steps + c.probe_interval;
  size_t oldest = candidate_index(best) == 0 ? 1 : 0;  // the one measured longest ago, not the best
  for (size_t i = 0; i < n; ++i)
    if (candidates_[i] != best && c.cells[i].measured_at < c.cells[oldest].measured_at) oldest = i;
  return candidates_[oldest];
}

std::string DraftBudget::describe() const {
  std::string out = fmt::format("draft budget: acceptance {:.3f}", acceptance());
  for (const auto& [key, c] : classes_)
    for (size_t i = 0; i < candidates_.size(); ++i) {
      const Cell& cell = c.cells[i];
      if (cell.samples == 0) continue;
      const int64_t sequences = int64_t{1} << key;
      out += fmt::format("\n  batch {}+ k={}: {:.3f} ms ({} samples), {:.2f} drafting x {:.2f} drafts, {:.0f} tok/s{}",
                         sequences, candidates_[i], 1e3 * cell.median_seconds(), cell.samples, cell.drafting_fraction,
                         cell.drafts_when_drafting, tokens_per_second(sequences, candidates_[i]),
                         candidates_[i] == c.best ? " (best)" : "");
    }
  return out;
}

void DraftBudget::record_acceptance(const DraftStepSample& s) {
  if (s.drafted == 0) return;
  accepted_ = accepted_ * kAcceptanceDecay + static_cast<double>(s.accepted);
  trials_ = trials_ * kAcceptanceDecay + static_cast<double>(s.accepted + s.rejected);
}

void DraftBudget::record_unmeasured(const DraftStepSample& s) {
  record_acceptance(s);
  if (candidate_index(s.drafts) < 0 || s.sequences <= 0) return;
  SizeClass& c = size_class(s.sequences);
  // Cells not yet trusted are chosen again anyway; the best runs every step.
  const bool probe = c.best >= 0 && s.drafts != c.best;
  if (probe && c.retries < kProbeRetries) {
    c.retrying = s.drafts;
    ++c.retries;
  }
}

void DraftBudget::record(const DraftStepSample& s) {
  record_acceptance(s);
  const int i = candidate_index(s.drafts);
  if (i < 0 || s.sequences <= 0 || !(s.seconds > 0)) return;
  SizeClass& c = size_class(s.sequences);
  c.retries = 0;
  Cell& cell = c.cells[static_cast<size_t>(i)];
  cell.seconds[static_cast<size_t>(cell.samples % kRecent)] = s.seconds;
  const bool probe = c.best >= 0 && s.drafts != c.best && c.confirmations_left == 0 && c.confirming != s.drafts;
  cell.drafting_fraction = moving_average(cell.drafting_fraction, cell.samples,
                                          static_cast<double>(s.drafting) / static_cast<double>(s.sequences));
  if (s.drafting > 0)
    cell.drafts_when_drafting = moving_average(cell.drafts_when_drafting, cell.drafts_when_drafting > 0 ? 1 : 0,
                                               static_cast<double>(s.drafted) / static_cast<double>(s.drafting));
  ++cell.samples;
  cell.measured_at = c.steps;
  if (!probe) {
    if (c.confirmations_left == 0) c.confirming = -1;
    return;
  }
  // The probe's own sample against the best's median: better, and it is run again until the
  // probed cell's median is over fresh samples.
  if (rate(s.sequences, cell, s.seconds) > (1 + kSwitchMargin) * tokens_per_second(s.sequences, c.best)) {
    c.confirming = s.drafts;
    c.confirmations_left = kMinSamples - 1;
  }
}

}  // namespace moeserve::spec
