#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace moeserve::sample {
namespace {
void* data(ops::Buffer* b) { return b != nullptr ? b->data() : nullptr; }
std::byte* bytes(ops::Buffer* b) { return static_cast<std::byte*>(data(b)); }
}  // namespace

void* Sampler::logits_of(const SamplerBuffers& b, int64_t rows, int v) const {
  return bytes(b.logits) + v * rows * vocab_part() * 4;
}

void Sampler::reduce(const SamplerBuffers& b, int64_t rows, DrawKind draw) {
  if (b.adjust_entries != nullptr) adjust(b, rows);
  if (draw == DrawKind::kCandidates) return top_candidates(b, rows);
  if (draw == DrawKind::kGreedy) return argmax(b, rows);
  // kSampled gathers in draw_rows(), after the step; kLogits here, inside the step's graph.
  if (b.gathered_logits != nullptr && draw == DrawKind::kLogits) {
    p_.attn_tp->set_site("lm_head");
    p_.attn_tp->all_gather(data(b.logits), data(b.gathered_logits), static_cast<size_t>(rows * p_.vocab_local),
                           DType::F32);
  }
}

void Sampler::apply_token_bitmask(const SamplerBuffers& b, int64_t rows) {
  MS_CHECK(b.token_bitmask != nullptr, "sampler: a constrained step without a token_bitmask buffer");
  const int64_t vocab_part = this->vocab_part(), words = (p_.vocab_size + 31) / 32;
  for (int v = 0; v < p_.parts; ++v)
    p_.backend.apply_token_bitmask({static_cast<float*>(logits_of(b, rows, v)),
                                    static_cast<const int32_t*>(data(b.token_bitmask)), rows, vocab_part, words,
                                    p_.vocab_begin + v * vocab_part});
}

void Sampler::adjust(const SamplerBuffers& b, int64_t rows) {
  // In place on this rank's parts: each rank of a vocab split changes the ids it holds.
  p_.backend.logit_adjust({static_cast<float*>(data(b.logits)),
                           static_cast<const ops::LogitAdjustEntry*>(data(b.adjust_entries)),
                           static_cast<const int32_t*>(data(b.adjust_count)), b.adjust_capacity, rows, vocab_part(),
                           p_.parts, p_.vocab_begin});
}

void Sampler::top_candidates(const SamplerBuffers& b, int64_t rows) {
  // Each row's top candidates of each vocab part, then (vocab split) every part's on every rank.
  const int64_t n = p_.candidates_per_slice, vocab_part = this->vocab_part();
  const int parts = p_.parts;
  for (int v = 0; v < parts; ++v)
    p_.backend.top_candidates({reinterpret_cast<const float*>(logits_of(b, rows, v)),
                               static_cast<const float*>(data(b.temperatures)),
                               reinterpret_cast<float*>(bytes(b.cand_values) + v * rows * n * 4),
                               reinterpret_cast<int32_t*>(bytes(b.cand_ids) + v * rows * n * 4),
                               reinterpret_cast<double*>(bytes(b.cand_normaliser) + v * rows * 8), rows, vocab_part, n,
                               p_.vocab_begin + v * vocab_part});
  if (b.gathered_cand_values != nullptr) {
    comm::Communicator& tp = *p_.attn_tp;
    tp.set_site("lm_head");
    tp.all_gather(data(b.cand_values), data(b.gathered_cand_values), static_cast<size_t>(parts * rows * n), DType::F32);
    tp.all_gather(data(b.cand_ids), data(b.gathered_cand_ids), static_cast<size_t>(parts * rows * n), DType::I32);
    // fp64 normalisers travel as pairs of 4-byte words.
    tp.all_gather(data(b.cand_normaliser), data(b.gathered_cand_normaliser), static_cast<size_t>(2 * parts * rows),
                  DType::F32);
  }
}

void Sampler::argmax(const SamplerBuffers& b, int64_t rows) {
  // Per part: values [capacity] then ids [capacity].
  const int64_t capacity = std::max<int64_t>(b.capacity, 1), vocab_part = this->vocab_part();
  for (int v = 0; v < p_.parts; ++v) {
    std::byte* pairs = bytes(b.greedy_pairs) + v * 2 * capacity * 4;
    p_.backend.argmax_rows({reinterpret_cast<const float*>(logits_of(b, rows, v)), reinterpret_cast<float*>(pairs),
                            reinterpret_cast<int32_t*>(pairs + capacity * 4), rows, vocab_part,
                            p_.vocab_begin + v * vocab_part});
  }
  if (b.gathered_pairs != nullptr) {  // values and ids in one collective (the whole capacity: a few KB)
    p_.attn_tp->set_site("lm_head");
    p_.attn_tp->all_gather(data(b.greedy_pairs), data(b.gathered_pairs), static_cast<size_t>(p_.parts * 2 * capacity),
                           DType::F32);
  }
}

Drawn Sampler::finish(const SamplerBuffers& b, const ForwardBatch& batch) {
  const int64_t rows = static_cast<int64_t>(batch.logit_rows.size());
  last_ = b;
  last_logit_rows_ = rows;
  Drawn out;
  switch (batch.draw) {
    case DrawKind::kGreedy:
      out.rows = greedy_to_host(b, rows, out.maxima);
      break;
    case DrawKind::kCandidates:
      out.candidates = candidates_to_host(b, rows, batch.temperatures);
      break;
    case DrawKind::kSampled:
      out.rows = draw_all(rows, batch.sampling);
      break;
    case DrawKind::kLogits:
      if (return_logits_) {
        out.rows = logits_to_host(b, rows);
      } else {
        p_.backend.synchronize();
      }
      break;
  }
  return out;
}

Tensor Sampler::draw_all(int64_t rows, const std::vector<ops::SamplingOptions>& options) {
  std::vector<int64_t> all(static_cast<size_t>(rows));
  std::iota(all.begin(), all.end(), int64_t{0});
  const std::vector<int32_t> drawn = draw_rows(all, options);
  Tensor tokens(DType::I32, {rows});
  std::copy(drawn.begin(), drawn.end(), tokens.i32());
  return tokens;
}

Tensor Sampler::logits_to_host(const SamplerBuffers& b, int64_t rows) {
  const int slices = p_.vocab_slices;
  const int64_t vocab = p_.vocab_size, slice = vocab / slices;
  Tensor logits(DType::F32, {rows, vocab});
  if (slices == 1) {
    if (rows) p_.backend.download(logits.raw(), *b.logits, 0, logits.nbytes());
    return logits;
  }
  // [slices, rows, slice] (the ranks' parts in order) -> [rows, vocab]; the plan and
  // check_reduction_plan guarantee vocab % slices == 0.
  Tensor host(DType::F32, {slices, rows, slice});
  if (rows) p_.backend.download(host.raw(), b.gathered_logits ? *b.gathered_logits : *b.logits, 0, host.nbytes());
  for (int k = 0; k < slices; ++k)
    for (int64_t row = 0; row < rows; ++row)
      std::memcpy(logits.f32() + row * vocab + k * slice, host.f32() + (k * rows + row) * slice, slice * sizeof(float));
  return logits;
}

Tensor Sampler::greedy_to_host(const SamplerBuffers& b, int64_t rows, std::vector<float>& maxima) {
  Tensor ids(DType::I32, {rows});
  maxima.assign(static_cast<size_t>(rows), 0.0f);
  if (rows == 0) return ids;
  const int slices = p_.vocab_slices;
  const int64_t capacity = std::max<int64_t>(b.capacity, 1);
  if (slices == 1) {  // part 0's values [capacity] and ids [capacity], in one download
    std::vector<float> pairs(static_cast<size_t>(capacity + rows));
    p_.backend.download(pairs.data(), *b.greedy_pairs, 0, pairs.size() * 4);
    std::copy(pairs.begin(), pairs.begin() + rows, maxima.begin());
    std::memcpy(ids.raw(), pairs.data() + capacity, ids.nbytes());
    return ids;
  }
  // [slices, 2 * capacity]: each vocab slice's maxima (values, then ids). The largest value
  // wins, ties to the smallest id (slices are in id order, so the first slice holding it).
  std::vector<float> pairs(static_cast<size_t>(slices * 2 * capacity));
  p_.backend.download(pairs.data(), b.gathered_pairs ? *b.gathered_pairs : *b.greedy_pairs, 0, pairs.size() * 4);
  auto value = [&](int k, int64_t r) { return pairs[(k * 2) * capacity + r]; };
  for (int64_t r = 0; r < rows; ++r) {
    int best = 0;
    for (int k = 1; k < slices; ++k)
      if (value(k, r) > value(best, r)) best = k;
    maxima[static_cast<size_t>(r)] = value(best, r);
    std::memcpy(ids.i32() + r, &pairs[(best * 2 + 1) * capacity + r], 4);
  }
  return ids;
}

SampleCandidates Sampler::candidates_to_host(const SamplerBuffers& b, int64_t rows,
                                             const std::vector<float>& temperatures) {
  const int64_t c = p_.candidates_per_slice;
  const int tp = p_.vocab_slices;
  // [slices, rows, c] sorted slices (each slice's first value is its maximum) and their
  // normalisers, each relative to its slice's maximum.
  std::vector<float> values(static_cast<size_t>(tp * rows * c));
  std::vector<int32_t> ids(values.size());
  std::vector<double> sums(static_cast<size_t>(tp * rows));
  if (rows) {
    const bool gathered = b.gathered_cand_values != nullptr;
    ops::Backend& backend = p_.backend;
    backend.download(values.data(), gathered ? *b.gathered_cand_values : *b.cand_values, 0, values.size() * 4);
    backend.download(ids.data(), gathered ? *b.gathered_cand_ids : *b.cand_ids, 0, ids.size() * 4);
    backend.download(sums.data(), gathered ? *b.gathered_cand_normaliser : *b.cand_normaliser, 0, sums.size() * 8);
  }
  SampleCandidates out;
  out.rows = rows;
  out.count = std::min(kCandidatesPerSlice, tp * c);
  out.values.resize(static_cast<size_t>(rows * out.count));
  out.ids.resize(out.values.size());
  out.normaliser.resize(static_cast<size_t>(rows));
  std::vector<int64_t> next(static_cast<size_t>(tp));
  for (int64_t r = 0; r < rows; ++r) {
    // Merge the slices' sorted lists: larger value first, ties to the lower slice (its ids are
    // smaller); the normaliser rescales each slice's sum to the row maximum.
    std::fill(next.begin(), next.end(), 0);
    for (int64_t j = 0; j < out.count; ++j) {
      int best = -1;
      for (int k = 0; k < tp; ++k)
        if (next[k] < c &&
            (best < 0 || values[(k * rows + r) * c + next[k]] > values[(best * rows + r) * c + next[best]]))
          best = k;
      out.values[r * out.count + j] = values[(best * rows + r) * c + next[best]];
      out.ids[r * out.count + j] = ids[(best * rows + r) * c + next[best]];
      ++next[best];
    }
    auto slice_max = [&](int k) { return values[(k * rows + r) * c]; };
    const float row_max = out.values[r * out.count];
    const double temperature = temperatures[r];
    double total = 0.0;
    for (int k = 0; k < tp; ++k)
      total += sums[k * rows + r] * std::exp((static_cast<double>(slice_max(k)) - row_max) / temperature);
    out.normaliser[r] = temperature > 0.0 ? total : 1.0;
  }
  return out;
}

std::vector<int32_t> Sampler::draw_rows(const std::vector<int64_t>& rows,
                                        const std::vector<ops::SamplingOptions>& options) {
  MS_CHECK(rows.size() == options.size(), "sample_logits_rows: {} rows and {} options", rows.size(), options.size());
  std::vector<int32_t> row_ids(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    MS_CHECK(rows[i] >= 0 && rows[i] < last_logit_rows_,
             "sample_logits_rows: row {} is not among the last step's {} logit rows", rows[i], last_logit_rows_);
    row_ids[i] = static_cast<int32_t>(rows[i]);
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  const void* logits = data(last_.logits);  // [parts, logit rows, vocab part]
  if (last_.gathered_logits != nullptr) {   // [attn_tp * parts, logit rows, vocab part]
    comm::Communicator& tp = *p_.attn_tp;
    tp.set_site("sample");
    tp.all_gather(data(last_.logits), data(last_.gathered_logits),
                  static_cast<size_t>(last_logit_rows_ * p_.vocab_local), DType::F32);
    logits = data(last_.gathered_logits);
  }
  if (!sampled_tokens_ || static_cast<int64_t>(sampled_tokens_->nbytes()) < n * 4)
    sampled_tokens_ = p_.backend.alloc(static_cast<size_t>(std::max<int64_t>(n, 1)) * 4);
  ops::SampleParams params{static_cast<const float*>(logits), options.data(),
                           static_cast<int32_t*>(sampled_tokens_->data()), n, p_.vocab_size};
  params.row_ids = row_ids.data();
  params.slices = p_.vocab_slices;
  params.logit_rows = last_logit_rows_;
  p_.backend.sample(params);
  std::vector<int32_t> tokens(rows.size());
  if (n) p_.backend.download(tokens.data(), *sampled_tokens_, 0, static_cast<size_t>(n) * 4);
  return tokens;
}

}  // namespace moeserve::sample
