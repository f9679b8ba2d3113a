#include "backend/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/random.h"

namespace moeserve::cpu {

namespace {

// The filters, over the row's candidates in final order (descending logit, ties to the
// smaller id), which `source` places on demand:
//   bool place(int64_t i): candidate i is available (false: the source cannot reach it);
//   float logit(int64_t i), int32_t id(int64_t i): candidate i, once placed;
//   double full_normaliser(double max_logit, double temperature): over the whole vocabulary.
// The draw keeps candidates [0, keep); candidate i's probability is weight(i) / total /
// kept_mass. Not for greedy options (one candidate, probability 1).
struct KeptCandidates {
  int64_t keep = 0;
  double max_logit = 0, total = 0, kept_mass = 0;
  double weight(float logit, float temperature) const { return std::exp((logit - max_logit) / temperature); }
  double probability(float logit, float temperature) const { return weight(logit, temperature) / total / kept_mass; }
};

// False when a needed candidate cannot be placed.
template <typename Source>
bool keep_candidates(Source& source, int64_t vocab, const ops::SamplingOptions& o, KeptCandidates& kept) {
  if (!source.place(0)) return false;
  kept.max_logit = source.logit(0);
  auto weight = [&](int64_t i) { return kept.weight(source.logit(i), o.temperature); };  // i placed
  // The normaliser: over the top_k candidates, or over the whole vocabulary.
  const int64_t keep_k = o.top_k > 0 && o.top_k < vocab ? o.top_k : vocab;
  double total = 0.0;
  if (keep_k < vocab) {
    if (!source.place(keep_k - 1)) return false;
    for (int64_t i = 0; i < keep_k; ++i) total += weight(i);
  } else {
    total = source.full_normaliser(kept.max_logit, o.temperature);
  }
  // min_p keeps the candidates whose probability is at least min_p x the top one's (prob 1 /
  // total); top_p the shortest prefix whose mass reaches top_p. Both scan the sorted prefix.
  int64_t keep = keep_k;
  if (o.min_p > 0.0f) {
    int64_t n = 1;
    for (; n < keep; ++n) {
      if (!source.place(n)) return false;
      if (weight(n) < o.min_p) break;  // weight(0) == 1
    }
    keep = n;
  }
  double kept_mass = 0.0;  // of the kept prefix, in probability
  if (o.top_p < 1.0f) {
    int64_t needed = 0;
    while (needed < keep) {
      if (!source.place(needed)) return false;
      kept_mass += weight(needed++) / total;
      if (kept_mass >= o.top_p) break;
    }
    keep = std::max<int64_t>(needed, 1);
  } else if (keep == vocab) {
    kept_mass = 1.0;  // everything: the normaliser's own mass
  } else {
    for (int64_t i = 0; i < keep; ++i) {
      if (!source.place(i)) return false;
      kept_mass += weight(i) / total;
    }
  }
  kept.keep = keep;
  kept.total = total;
  kept.kept_mass = kept_mass;
  return true;
}

// The draw over keep_candidates' prefix (inverse CDF at uniform01(seed, step)). Returns the
// drawn id, or -1 when a needed candidate cannot be placed.
template <typename Source>
int32_t draw(Source& source, int64_t vocab, const ops::SamplingOptions& o) {
  if (!source.place(0)) return -1;
  if (o.temperature <= 0.0f || o.top_k == 1) return source.id(0);
  KeptCandidates kept;
  if (!keep_candidates(source, vocab, o, kept)) return -1;
  const double u = uniform01(o.seed, o.step) * kept.kept_mass;
  double cumulative = 0.0;
  for (int64_t i = 0; i < kept.keep; ++i) {
    if (!source.place(i)) return -1;
    cumulative += kept.weight(source.logit(i), o.temperature) / kept.total;
    if (u < cumulative) return source.id(i);
  }
  if (!source.place(kept.keep - 1)) return -1;
  return source.id(kept.keep - 1);
}

// Sorts keys ascending whose set bits all lie below bit `bits`: LSD radix with 11-bit digits
// (histograms of 8 KB each, one counting pass for all), skipping a digit every key shares. The
// same order as std::sort; O(n) per digit instead of O(n log n).
void radix_sort(uint64_t* keys, int64_t n, int bits, std::vector<uint64_t>& scratch) {
  constexpr int kDigitBits = 11, kBuckets = 1 << kDigitBits;
  const int digits = (bits + kDigitBits - 1) / kDigitBits;
  std::vector<uint32_t> counts(static_cast<size_t>(digits) * kBuckets, 0);
  for (int64_t i = 0; i < n; ++i)
    for (int d = 0; d < digits; ++d) ++counts[d * kBuckets + ((keys[i] >> (kDigitBits * d)) & (kBuckets - 1))];
  scratch.resize(static_cast<size_t>(n));
  uint64_t *from = keys, *to = scratch.data();
  for (int d = 0; d < digits; ++d) {
    uint32_t* count = counts.data() + d * kBuckets;
    const int shift = kDigitBits * d;
    if (count[(from[0] >> shift) & (kBuckets - 1)] == static_cast<uint32_t>(n)) continue;  // one value
    uint32_t offset = 0;
    for (int b = 0; b < kBuckets; ++b) {
      const uint32_t c = count[b];
      count[b] = offset;
      offset += c;
    }
    for (int64_t i = 0; i < n; ++i) to[count[(from[i] >> shift) & (kBuckets - 1)]++] = from[i];
    std::swap(from, to);
  }
  if (from != keys) std::memcpy(keys, from, static_cast<size_t>(n) * sizeof(uint64_t));
}

// A full row, sorted lazily: only as long a prefix as the filters and the draw reach, a
// chunk at a time (sorting a 163840-entry vocabulary for every row was most of a sampling
// step). The prefix never goes past the top_k cut. A chunk is selected with nth_element and
// then sorted: O(n + k log k), where partial_sort's heap is O(n log k) (15x slower for the
// first 1024 of 163840). The candidates are sorted as 64-bit keys (the logit mapped so that
// ascending keys are descending logits, then the id: ties to the smaller id), which compare
// without indirection (`moeserve bench-sampling`: 11.2 against 20.1 ms for a flat 163840-entry
// row at top_p 0.9, the same tokens). The id takes only the bits the vocabulary needs, so
// that once a chunk would reach half the row (a flat row: top_p over most of the vocabulary)
// everything left is radix-sorted in 32 + id_bits bits instead of std::sort-ed.
class LogitsSource {
 public:
  LogitsSource(const float* logits, int64_t vocab, int64_t limit)
      : logits_(logits), limit_(limit), id_bits_(bits_for(vocab)), keys_(vocab) {
    for (int64_t v = 0; v < vocab; ++v) keys_[v] = key(logits[v], static_cast<uint32_t>(v));
  }
  bool place(int64_t i) {
    if (i < sorted_) return true;
    const int64_t size = static_cast<int64_t>(keys_.size());
    const int64_t target = std::min(limit_, std::max({i + 1, int64_t{1024}, 4 * sorted_}));
    if (2 * target >= size && size - sorted_ >= kRadixFrom) {  // the rest (or most of it): sort it all
      std::vector<uint64_t> scratch;
      radix_sort(keys_.data() + sorted_, size - sorted_, 32 + id_bits_, scratch);
      sorted_ = size;
      return true;
    }
    if (target < static_cast<int64_t>(keys_.size()))
      std::nth_element(keys_.begin() + sorted_, keys_.begin() + target, keys_.end());
    std::sort(keys_.begin() + sorted_, keys_.begin() + target);
    sorted_ = target;
    return true;
  }
  float logit(int64_t i) const { return logits_[id(i)]; }
  int32_t id(int64_t i) const { return static_cast<int32_t>(keys_[i] & ((uint64_t{1} << id_bits_) - 1)); }
  double full_normaliser(double max_logit, double temperature) const {
    double total = 0.0;  // in id order
    for (size_t v = 0; v < keys_.size(); ++v) total += std::exp((logits_[v] - max_logit) / temperature);
    return total;
  }

 private:
  static int bits_for(int64_t vocab) {
    int bits = 1;
    while ((int64_t{1} << bits) < vocab) ++bits;
    return bits;
  }
  // Larger logit -> smaller key; equal logits (-0 == +0 included) -> the smaller id first.
  uint64_t key(float logit, uint32_t id) const {
    uint32_t bits = 0;
    if (logit != 0.0f) std::memcpy(&bits, &logit, 4);
    const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;  // orders as the floats
    return (static_cast<uint64_t>(~ascending) << id_bits_) | id;
  }

  const float* logits_;
  int64_t limit_;
  static constexpr int64_t kRadixFrom = 8192;  // fewer keys: std::sort
  int id_bits_;                                // ids take the key's low id_bits_ bits (vocab <= 2^32)
  std::vector<uint64_t> keys_;
  int64_t sorted_ = 0;  // keys_[0, sorted_) are in their final order
};

class CandidateSource {
 public:
  explicit CandidateSource(const CandidateRow& row) : row_(row) {}
  bool place(int64_t i) const { return i < row_.count; }
  float logit(int64_t i) const { return row_.values[i]; }
  int32_t id(int64_t i) const { return row_.ids[i]; }
  double full_normaliser(double, double) const { return row_.normaliser; }

 private:
  const CandidateRow& row_;
};

}  // namespace

int32_t sample_row(const float* logits, int64_t vocab, const ops::SamplingOptions& o) {
  if (o.temperature <= 0.0f || o.top_k == 1)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);  // no sort
  LogitsSource source(logits, vocab, o.top_k > 0 && o.top_k < vocab ? o.top_k : vocab);
  return draw(source, vocab, o);
}

TokenDistribution row_distribution(const float* logits, int64_t vocab, const ops::SamplingOptions& o) {
  if (o.temperature <= 0.0f || o.top_k == 1) return {{sample_row(logits, vocab, o)}, {1.0}};
  LogitsSource source(logits, vocab, o.top_k > 0 && o.top_k < vocab ? o.top_k : vocab);
  KeptCandidates kept;
  keep_candidates(source, vocab, o, kept);  // a full row places every candidate
  TokenDistribution out;
  for (int64_t i = 0; i < kept.keep; ++i) {
    source.place(i);
    out.ids.push_back(source.id(i));
    out.probs.push_back(kept.probability(source.logit(i), o.temperature));
  }
  return out;
}

int32_t sample_candidates(const CandidateRow& row, int64_t vocab, const ops::SamplingOptions& o) {
  CandidateSource source(row);
  return draw(source, vocab, o);
}

void top_candidates_row(const float* logits, int64_t vocab, int64_t count, float temperature, float* values,
                        int32_t* ids, double* normaliser) {
  LogitsSource sorted(logits, vocab, count);
  sorted.place(count - 1);
  for (int64_t i = 0; i < count; ++i) {
    values[i] = sorted.logit(i);
    ids[i] = sorted.id(i);
  }
  const float max = values[0];
  double total = 0.0;
  if (temperature > 0.0f) {
    for (int64_t v = 0; v < vocab; ++v) total += std::exp((static_cast<double>(logits[v]) - max) / temperature);
  } else {
    total = 1.0;
  }
  *normaliser = total;
}

}  // namespace moeserve::cpu
