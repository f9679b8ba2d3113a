// The last stage's head: the logit rows normalised and projected over this rank's vocab parts,
// then, by HeadMode, fp32 logits, greedy ids, sampling candidates or sampled tokens brought to
// the host (each vocab-parallel rank reduces its slice on the device where the mode allows,
// so only the reduced values cross ranks). The semantics of each mode: DeepseekV3::set_head_mode.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "model/deepseek_v3.h"
#include "model/deepseek_v3_loader.h"
#include "model/workspace.h"
#include "ops/ops.h"

namespace moeserve {

struct LmHeadParams {
  const ModelConfig& config;
  const parallel::RankShard& shard;
  int parts;                    // vocab parts of this rank (the reduction plan's)
  int vocab_slices;             // of the whole head: parts * the plan's attention TP
  comm::Communicator* attn_tp;  // the vocab split's group (null with one rank)
  ops::Backend& backend;
  const ModelWeights& weights;   // final_norm, lm_head
  Workspace& workspace;          // the head arena's rows (head_rows), its buffers
  int64_t candidates_per_slice;  // kCandidates: per row and vocab part
};

class LmHead {
 public:
  explicit LmHead(const LmHeadParams& params) : p_(params) {}

  // The rows' temperatures (kCandidates) and draws (kSampled) of the next step.
  void set_temperatures(const std::vector<float>& temperatures) { temperatures_ = temperatures; }
  void set_sampling(const std::vector<ops::SamplingOptions>& sampling) { sampling_ = sampling; }

  // The device work: selected [rows, hidden] = norm(hidden[logit_rows]); local logits
  // [parts, rows, vocab_part] fp32, reduced or gathered as `mode` needs.
  void run(Activations& a, int64_t rows, HeadMode mode);
  // The step's result, after the device work (every stage: earlier ones only synchronise).
  Tensor finish(Activations& a, int64_t rows, HeadMode mode, bool return_logits);

  SampleCandidates take_candidates() { return std::move(candidates_); }
  std::vector<int32_t> sample_logits_rows(const std::vector<int64_t>& rows,
                                          const std::vector<ops::SamplingOptions>& options);

 private:
  int vocab_slices() const { return p_.vocab_slices; }
  int64_t vocab_part() const { return p_.shard.vocab.size() / p_.parts; }
  void* logits_of(Activations& a, int64_t rows, int v) const;  // [rows, vocab_part] fp32 of part v
  void top_candidates(Activations& a, int64_t rows);
  void argmax(Activations& a, int64_t rows);
  Tensor logits_to_host(Activations& a, int64_t rows);
  Tensor greedy_to_host(Activations& a, int64_t rows);
  void candidates_to_host(Activations& a, int64_t rows);
  Tensor sample_all(int64_t rows);

  LmHeadParams p_;
  SampleCandidates candidates_;                 // of the last kCandidates step
  std::vector<float> temperatures_;             // its rows' temperatures
  std::vector<ops::SamplingOptions> sampling_;  // a kSampled step's rows' draws
  ops::BufferPtr sampled_tokens_;               // [rows] int32: sample_logits_rows()'s draws
  int64_t last_logit_rows_ = 0;
};

}  // namespace moeserve
