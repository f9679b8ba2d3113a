// The DeepSeek-V3 forward (MLA attention, dense MLP, MoE with shared experts), written once
// against ops::Backend and comm::Communicator. One DeepseekV3 object is one rank's shard of
// the model under a ParallelPlan; the single-rank plan is the whole model.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/config.h"
#include "model/weight_source.h"
#include "ops/ops.h"
#include "parallel/plan.h"

namespace moeserve {

// The groups a rank talks to. Any may be null when its group has one member.
struct RankGroups {
  comm::Communicator* attn_tp = nullptr;   // same stage and DP replica (attention, dense, vocab)
  comm::Communicator* moe = nullptr;       // the whole stage (routed experts)
};

// One step's tokens on this rank (host memory; the forward uploads what the backend needs).
// Tokens of several sequences are concatenated; each token carries its sequence's index
// into `block_tables`, its position, and the cache slot its latent is written to.
struct ForwardBatch {
  std::vector<int32_t> tokens;        // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int32_t> seq_of_token;  // [T]
  std::vector<int32_t> slots;         // [T] page * page_size + offset
  std::vector<int32_t> block_tables;  // [num_seqs * max_pages_per_seq]
  int64_t max_pages_per_seq = 0;
  std::vector<int32_t> logit_rows;    // token indices whose logits are returned
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

// A paged MLA latent cache for this rank's layers: [num_pages * page_size, latent + rope]
// per layer.
struct KvCacheShape {
  int64_t num_pages = 0;
  int64_t page_size = 64;
};

class DeepseekV3 {
 public:
  // Loads this rank's weights from `source` (only the slices the shard owns).
  DeepseekV3(const ModelConfig& config, const parallel::ParallelPlan& plan, int rank, ops::Backend& backend,
             WeightSource& source, RankGroups groups, KvCacheShape cache);
  ~DeepseekV3();

  const ModelConfig& config() const { return config_; }
  const parallel::RankShard& shard() const { return shard_; }
  const KvCacheShape& cache_shape() const { return cache_shape_; }

  // First stage: embeds batch.tokens. Later stages: `hidden_in` [T, hidden] (fp32 host) from
  // the previous stage. Runs this stage's layers. Last stage: returns the fp32 logits
  // [logit_rows, vocab] (gathered over the vocab split); earlier stages: the hidden states
  // [T, hidden] to send on.
  Tensor forward(const ForwardBatch& batch, const Tensor* hidden_in = nullptr);

  // Bytes of weights this rank holds (fp32 on CPU).
  int64_t weight_bytes() const { return weight_bytes_; }

 private:
  struct Layer;
  struct Activations;

  void load(WeightSource& source);
  void attention(const Layer& layer, int64_t local_layer, Activations& a, const ForwardBatch& batch);
  void dense_mlp(const Layer& layer, Activations& a);
  void moe(const Layer& layer, Activations& a);
  void moe_dispatch_combine(const Layer& layer, Activations& a);
  void all_reduce(comm::Communicator* group, ops::Buffer& buffer, int64_t count, const char* site);
  void shared_experts(const Layer& layer, Activations& a);

  ModelConfig config_;
  parallel::ParallelPlan plan_;
  parallel::RankShard shard_;
  ops::Backend& backend_;
  RankGroups groups_;
  KvCacheShape cache_shape_;
  int64_t weight_bytes_ = 0;

  ops::BufferPtr embed_;       // [vocab slice, hidden]
  ops::BufferPtr final_norm_;  // [hidden]
  ops::BufferPtr lm_head_;     // [vocab slice, hidden]
  ops::BufferPtr inv_freq_;    // [rope / 2] fp32
  std::vector<std::unique_ptr<Layer>> layers_;  // this stage's layers
  std::vector<ops::BufferPtr> kv_cache_;        // per local layer
};

}  // namespace moeserve
