// The sampler: what a step's logit rows become, by the batch's DrawKind, on the rank that holds
// them. The model leaves fp32 logits on the device; the sampler reduces them there (argmax
// pairs, top candidates and softmax normaliser, or nothing), gathers only the reduced values
// over the vocab split, and brings the result to the host: fp32 logits, greedy ids, merged
// candidates or tokens drawn on the device (ops::SampleParams). The device part is separate
// from the host part so that a captured decode graph holds it beside the forward.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "step/forward_batch.h"

namespace moeserve::sample {

// Candidates per row and vocab slice of a kCandidates draw (fewer when the slice is smaller).
inline constexpr int64_t kCandidatesPerSlice = 256;

// A step's sampling candidates, merged over the vocab split (host memory): per row the
// `count` largest logits in descending order (ties: smaller id first) and the softmax
// normaliser at the row's temperature over the whole vocabulary (ops::TopCandidatesParams).
struct SampleCandidates {
  int64_t rows = 0, count = 0;
  std::vector<float> values;       // [rows, count]
  std::vector<int32_t> ids;        // [rows, count]
  std::vector<double> normaliser;  // [rows], relative to values[row * count]
};

// What a draw leaves on the host.
struct Drawn {
  // kLogits: fp32 [rows, vocab] (empty without logits asked); kGreedy, kSampled: I32 [rows] ids.
  Tensor rows;
  SampleCandidates candidates;  // kCandidates
  std::vector<float> maxima;    // kGreedy: each row's largest logit (NaN or infinite: broken weights)
};

// The device buffers a draw reads and writes, R = capacity rows (the model's head arena;
// the gathered ones are null without a vocab split over ranks). Per part in part order.
struct SamplerBuffers {
  ops::Buffer* logits = nullptr;           // [parts, rows, vocab_part] fp32: the forward's logits
  ops::Buffer* gathered_logits = nullptr;  // [attn_tp * parts, rows, vocab_part]
  ops::Buffer* temperatures = nullptr;     // [R] fp32, uploaded with a kCandidates batch
  ops::Buffer* token_bitmask = nullptr;    // [R, ceil(vocab / 32)] int32, uploaded with a constrained batch
  // Per part its rows' maxima, values [R] then ids [R], so one all-gather moves both.
  ops::Buffer* greedy_pairs = nullptr;    // [parts, 2R]
  ops::Buffer* gathered_pairs = nullptr;  // [attn_tp * parts, 2R]
  // C = candidates per row and part; a row's first value is its part's maximum.
  ops::Buffer* cand_values = nullptr;               // [parts, R, C] fp32
  ops::Buffer* cand_ids = nullptr;                  // [parts, R, C] int32
  ops::Buffer* cand_normaliser = nullptr;           // [parts, R] fp64
  ops::Buffer* gathered_cand_values = nullptr;      // [attn_tp * parts, R, C]
  ops::Buffer* gathered_cand_ids = nullptr;         // [attn_tp * parts, R, C]
  ops::Buffer* gathered_cand_normaliser = nullptr;  // [attn_tp * parts, R]
  // Logit adjustments applied before the draw (ops::LogitAdjustParams): entries and their
  // count, uploaded with the batch; null when the step has none (then nothing is enqueued).
  ops::Buffer* adjust_entries = nullptr;  // [adjust_capacity] ops::LogitAdjustEntry
  ops::Buffer* adjust_count = nullptr;    // [1] int32
  int64_t adjust_capacity = 0;
  int64_t capacity = 0;  // R
};

struct SamplerParams {
  ops::Backend& backend;
  comm::Communicator* attn_tp;   // the vocab split's group (null with one rank)
  int64_t vocab_size;            // the whole vocabulary
  int64_t vocab_begin;           // this rank's first id
  int64_t vocab_local;           // this rank's ids: parts * vocab_part
  int parts;                     // vocab parts this rank computes
  int vocab_slices;              // of the whole vocabulary: parts * attn_tp ranks
  int64_t candidates_per_slice;  // C: min(kCandidatesPerSlice, vocab_part)
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params) : p_(params) {}

  // The device work of a draw on `rows` logit rows: enqueued only (no host work, so it can be
  // captured in a graph), every rank of the vocab split at once (collectives). The logit
  // adjustments (b.adjust_entries) come first, so every draw kind sees the adjusted logits.
  void reduce(const SamplerBuffers& b, int64_t rows, DrawKind draw);
  // Structured output, enqueued before reduce(): each part's logits masked by the rows'
  // token bitmasks (ops::TokenBitmaskParams), so every draw kind sees only allowed tokens.
  void apply_token_bitmask(const SamplerBuffers& b, int64_t rows);
  // The host side of the draw that reduce() enqueued for `batch` (its logit rows, temperatures
  // and options). kLogits brings the logits unless set_return_logits(false); then it only
  // waits for the step.
  Drawn finish(const SamplerBuffers& b, const ForwardBatch& batch);
  // Benchmarks time the device work alone: kLogits steps without the logits' download.
  void set_return_logits(bool enabled) { return_logits_ = enabled; }
  // Draws logit rows `rows` of the last finished step (still on the device until the next
  // one) under `options`, over the whole vocabulary (ops::SampleParams, the same tokens as
  // cpu::sample_row); a vocab split is first gathered over attn_tp, so every rank of the
  // split takes part and draws the same tokens.
  std::vector<int32_t> draw_rows(const std::vector<int64_t>& rows, const std::vector<ops::SamplingOptions>& options);

 private:
  int64_t vocab_part() const { return p_.vocab_local / p_.parts; }
  void* logits_of(const SamplerBuffers& b, int64_t rows, int v) const;  // [rows, vocab_part] of part v
  void adjust(const SamplerBuffers& b, int64_t rows);
  void argmax(const SamplerBuffers& b, int64_t rows);
  void top_candidates(const SamplerBuffers& b, int64_t rows);
  Tensor logits_to_host(const SamplerBuffers& b, int64_t rows);
  Tensor greedy_to_host(const SamplerBuffers& b, int64_t rows, std::vector<float>& maxima);
  SampleCandidates candidates_to_host(const SamplerBuffers& b, int64_t rows, const std::vector<float>& temperatures);
  Tensor draw_all(int64_t rows, const std::vector<ops::SamplingOptions>& options);

  SamplerParams p_;
  SamplerBuffers last_;            // of the last finished step (valid until the next forward)
  int64_t last_logit_rows_ = 0;    // its rows
  ops::BufferPtr sampled_tokens_;  // [rows] int32: draw_rows()'s tokens
  bool return_logits_ = true;
};

}  // namespace moeserve::sample
