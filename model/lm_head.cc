#include "model/lm_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace moeserve {

void* LmHead::logits_of(Activations& a, int64_t rows, int v) const {
  return bytes(a.local_logits) + v * rows * vocab_part() * 4;
}

void LmHead::run(Activations& a, int64_t rows, HeadMode mode) {
  const ModelConfig& c = p_.config;
  const int64_t hidden = c.hidden_size, vocab_part = this->vocab_part();
  ops::Backend& backend = p_.backend;
  // selected [rows, hidden] = norm(hidden[logit_rows]); local logits [parts, rows, vocab_part] fp32.
  backend.gather_rows({ptr(a.hidden), static_cast<const int32_t*>(ptr(a.logit_rows)), ptr(a.selected), rows, hidden});
  backend.rms_norm({ptr(a.selected), ptr(p_.weights.final_norm), ptr(a.selected), rows, hidden, hidden, hidden,
                    static_cast<float>(c.rms_norm_eps)});
  for (int v = 0; v < p_.parts; ++v) {
    ops::LinearParams head{
        ptr(a.selected), ptr(p_.weights.lm_head[v]), logits_of(a, rows, v), rows, hidden, vocab_part, hidden,
        vocab_part};
    head.y_f32 = true;
    backend.linear(head);
  }
  if (mode == HeadMode::kCandidates) return top_candidates(a, rows);
  if (mode == HeadMode::kGreedy) return argmax(a, rows);
  if (a.gathered_logits && mode == HeadMode::kLogits) {
    p_.attn_tp->set_site("lm_head");
    p_.attn_tp->all_gather(ptr(a.local_logits), ptr(a.gathered_logits),
                           static_cast<size_t>(rows * p_.shard.vocab.size()), DType::F32);
  }
}

void LmHead::top_candidates(Activations& a, int64_t rows) {
  // Each row's top candidates of each vocab part, then (vocab split) every part's on every rank.
  const int64_t n = p_.candidates_per_slice, vocab_part = this->vocab_part();
  const int parts = p_.parts;
  for (int v = 0; v < parts; ++v)
    p_.backend.top_candidates({reinterpret_cast<const float*>(logits_of(a, rows, v)),
                               static_cast<const float*>(ptr(a.temperatures)),
                               reinterpret_cast<float*>(bytes(a.cand_values) + v * rows * n * 4),
                               reinterpret_cast<int32_t*>(bytes(a.cand_ids) + v * rows * n * 4),
                               reinterpret_cast<double*>(bytes(a.cand_normaliser) + v * rows * 8), rows, vocab_part, n,
                               p_.shard.vocab.begin + v * vocab_part});
  if (a.gathered_cand_values) {
    comm::Communicator& tp = *p_.attn_tp;
    tp.set_site("lm_head");
    tp.all_gather(ptr(a.cand_values), ptr(a.gathered_cand_values), static_cast<size_t>(parts * rows * n), DType::F32);
    tp.all_gather(ptr(a.cand_ids), ptr(a.gathered_cand_ids), static_cast<size_t>(parts * rows * n), DType::I32);
    // fp64 normalisers travel as pairs of 4-byte words.
    tp.all_gather(ptr(a.cand_normaliser), ptr(a.gathered_cand_normaliser), static_cast<size_t>(2 * parts * rows),
                  DType::F32);
  }
}

void LmHead::argmax(Activations& a, int64_t rows) {
  // Per part: values [capacity] then ids [capacity].
  const int64_t capacity = std::max<int64_t>(p_.workspace.head_rows(), 1), vocab_part = this->vocab_part();
  for (int v = 0; v < p_.parts; ++v) {
    std::byte* pairs = bytes(a.greedy_pairs) + v * 2 * capacity * 4;
    p_.backend.argmax_rows({reinterpret_cast<const float*>(logits_of(a, rows, v)), reinterpret_cast<float*>(pairs),
                            reinterpret_cast<int32_t*>(pairs + capacity * 4), rows, vocab_part,
                            p_.shard.vocab.begin + v * vocab_part});
  }
  if (a.gathered_pairs) {  // values and ids in one collective (the whole capacity: a few KB)
    p_.attn_tp->set_site("lm_head");
    p_.attn_tp->all_gather(ptr(a.greedy_pairs), ptr(a.gathered_pairs), static_cast<size_t>(p_.parts * 2 * capacity),
                           DType::F32);
  }
}

Tensor LmHead::finish(Activations& a, int64_t rows, HeadMode mode, bool return_logits) {
  last_logit_rows_ = rows;
  const bool last = p_.shard.last_stage;
  if (last && mode == HeadMode::kGreedy) return greedy_to_host(a, rows);
  if (last && mode == HeadMode::kCandidates) {
    candidates_to_host(a, rows);
    return Tensor();
  }
  if (last && mode == HeadMode::kSampled) return sample_all(rows);
  if (last && return_logits) return logits_to_host(a, rows);
  p_.backend.synchronize();
  return Tensor();
}

Tensor LmHead::sample_all(int64_t rows) {
  std::vector<int64_t> all(static_cast<size_t>(rows));
  std::iota(all.begin(), all.end(), int64_t{0});
  const std::vector<int32_t> drawn = sample_logits_rows(all, sampling_);
  Tensor tokens(DType::I32, {rows});
  std::copy(drawn.begin(), drawn.end(), tokens.i32());
  return tokens;
}

Tensor LmHead::logits_to_host(Activations& a, int64_t rows) {
  const int64_t vocab = p_.config.vocab_size, slice = vocab / vocab_slices();
  Tensor logits(DType::F32, {rows, vocab});
  if (vocab_slices() == 1) {
    if (rows) p_.backend.download(logits.raw(), *a.local_logits, 0, logits.nbytes());
    return logits;
  }
  // [slices, rows, slice] (the ranks' parts in order) -> [rows, vocab]; the plan and
  // check_reduction_plan guarantee vocab % slices == 0.
  Tensor host(DType::F32, {vocab_slices(), rows, slice});
  if (rows) p_.backend.download(host.raw(), a.gathered_logits ? *a.gathered_logits : *a.local_logits, 0, host.nbytes());
  for (int k = 0; k < vocab_slices(); ++k)
    for (int64_t row = 0; row < rows; ++row)
      std::memcpy(logits.f32() + row * vocab + k * slice, host.f32() + (k * rows + row) * slice, slice * sizeof(float));
  return logits;
}

Tensor LmHead::greedy_to_host(Activations& a, int64_t rows) {
  Tensor ids(DType::I32, {rows});
  if (rows == 0) return ids;
  if (vocab_slices() == 1) {
    p_.backend.download(ids.raw(), *a.greedy_ids, 0, ids.nbytes());
    return ids;
  }
  // [slices, 2 * capacity]: each vocab slice's maxima (values, then ids). The largest value
  // wins, ties to the smallest id (slices are in id order, so the first slice holding it).
  const int slices = vocab_slices();
  const int64_t capacity = std::max<int64_t>(p_.workspace.head_rows(), 1);
  std::vector<float> pairs(static_cast<size_t>(slices * 2 * capacity));
  p_.backend.download(pairs.data(), a.gathered_pairs ? *a.gathered_pairs : *a.greedy_pairs, 0, pairs.size() * 4);
  auto value = [&](int k, int64_t r) { return pairs[(k * 2) * capacity + r]; };
  for (int64_t r = 0; r < rows; ++r) {
    int best = 0;
    for (int k = 1; k < slices; ++k)
      if (value(k, r) > value(best, r)) best = k;
    std::memcpy(ids.i32() + r, &pairs[(best * 2 + 1) * capacity + r], 4);
  }
  return ids;
}

void LmHead::candidates_to_host(Activations& a, int64_t rows) {
  const int64_t c = p_.candidates_per_slice;
  const int tp = vocab_slices();
  // [slices, rows, c] sorted slices (each slice's first value is its maximum) and their
  // normalisers, each relative to its slice's maximum.
  std::vector<float> values(static_cast<size_t>(tp * rows * c));
  std::vector<int32_t> ids(values.size());
  std::vector<double> sums(static_cast<size_t>(tp * rows));
  if (rows) {
    const bool gathered = a.gathered_cand_values != nullptr;
    ops::Backend& backend = p_.backend;
    backend.download(values.data(), gathered ? *a.gathered_cand_values : *a.cand_values, 0, values.size() * 4);
    backend.download(ids.data(), gathered ? *a.gathered_cand_ids : *a.cand_ids, 0, ids.size() * 4);
    backend.download(sums.data(), gathered ? *a.gathered_cand_normaliser : *a.cand_normaliser, 0, sums.size() * 8);
  }
  SampleCandidates out;
  out.rows = rows;
  out.count = std::min(DeepseekV3::kSampleCandidates, tp * c);
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
    const double temperature = temperatures_[r];
    double total = 0.0;
    for (int k = 0; k < tp; ++k)
      total += sums[k * rows + r] * std::exp((static_cast<double>(slice_max(k)) - row_max) / temperature);
    out.normaliser[r] = temperature > 0.0 ? total : 1.0;
  }
  candidates_ = std::move(out);
}

std::vector<int32_t> LmHead::sample_logits_rows(const std::vector<int64_t>& rows,
                                                const std::vector<ops::SamplingOptions>& options) {
  MS_CHECK(p_.shard.last_stage && rows.size() == options.size(),
           "sample_logits_rows: {} rows and {} options on a {} rank", rows.size(), options.size(),
           p_.shard.last_stage ? "last-stage" : "non-last-stage");
  std::vector<int32_t> row_ids(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    MS_CHECK(rows[i] >= 0 && rows[i] < last_logit_rows_,
             "sample_logits_rows: row {} is not among the last step's {} logit rows", rows[i], last_logit_rows_);
    row_ids[i] = static_cast<int32_t>(rows[i]);
  }
  Activations& a = p_.workspace.any();
  const int64_t vocab_local = p_.shard.vocab.size(), n = static_cast<int64_t>(rows.size());
  const void* logits = ptr(a.local_logits);  // [parts, logit rows, vocab part]
  if (a.gathered_logits) {                   // [attn_tp * parts, logit rows, vocab part]
    comm::Communicator& tp = *p_.attn_tp;
    tp.set_site("sample");
    tp.all_gather(ptr(a.local_logits), ptr(a.gathered_logits), static_cast<size_t>(last_logit_rows_ * vocab_local),
                  DType::F32);
    logits = ptr(a.gathered_logits);
  }
  if (!sampled_tokens_ || static_cast<int64_t>(sampled_tokens_->nbytes()) < n * 4)
    sampled_tokens_ = p_.backend.alloc(static_cast<size_t>(std::max<int64_t>(n, 1)) * 4);
  ops::SampleParams params{static_cast<const float*>(logits), options.data(),
                           static_cast<int32_t*>(sampled_tokens_->data()), n, p_.config.vocab_size};
  params.row_ids = row_ids.data();
  params.slices = vocab_slices();
  params.logit_rows = last_logit_rows_;
  p_.backend.sample(params);
  std::vector<int32_t> tokens(rows.size());
  if (n) p_.backend.download(tokens.data(), *sampled_tokens_, 0, static_cast<size_t>(n) * 4);
  return tokens;
}

}  // namespace moeserve
