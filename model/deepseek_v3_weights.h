// What each rank of a plan loads, tensor by tensor, without loading it: the accounting behind
// `moeserve plan show`, the memory-fit check and the sharded-loading tests. It mirrors
// load_weights() (model/deepseek_v3_loader.h), and a test checks that the two agree on every
// rank of every plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "parallel/plan.h"

namespace moeserve {

// The dimensions of `config` that sharding needs. The dense intermediate size counts only
// when the model has dense layers.
parallel::ShardDims shard_dims(const ModelConfig& config);

// One checkpoint slice a rank loads.
struct WeightSlice {
  std::string name;      // checkpoint tensor name
  int64_t elements = 0;  // elements of this rank's slice
  WeightShape shape;     // the slice's [N, K]
  WeightFormat format;   // how the checkpoint stores it
  int64_t bytes() const { return stored_bytes(shape, format); }
  // Several ranks may hold the same slice (norms and the MLA latent projection on every rank
  // of a stage, attention heads on every DP replica, a tied LM head on the last stage). The
  // lowest-numbered rank holding a slice owns it; the others hold a replica. Summed over all
  // ranks, owned elements count every model parameter exactly once.
  bool owned = true;
  // Identical slices this one stands for: 1, or the rank's routed experts of a layer when they
  // are listed as one (ExpertSlices::one_per_layer); the name is then the first expert's.
  int64_t count = 1;
};

// Whether a layer's routed experts are listed one slice per expert and projection (what the
// loader reads), or once per projection with `count` (the byte accounting: a K2 layer holds 384
// experts, and a fuzzed config may ask for 65536 in each of 4096 layers).
enum class ExpertSlices { each, one_per_layer };

// Unquantized slices are counted at `element_bytes` (the activation dtype); quantized ones
// (config.quantization) as the checkpoint stores them.
// Whether linear `module` is dequantized at load (the absorbed-MLA ops read kv_b_proj
// unquantized, as in vLLM): held in the activation dtype whatever the checkpoint stores.
bool dequantized_at_load(const std::string& module);
// Bytes the backend holds for `slice` (ModelWeights::bytes): stored_bytes(), except for a
// weight dequantized at load, held at `element_bytes`.
int64_t loaded_bytes(const WeightSlice& slice, int64_t element_bytes);

std::vector<WeightSlice> weight_slices_of_rank(const ModelConfig& config, const parallel::ParallelPlan& plan, int rank,
                                               int64_t element_bytes = 2, ExpertSlices experts = ExpertSlices::each);

struct RankWeights {
  int64_t held_elements = 0;   // everything the rank loads (its memory)
  int64_t owned_elements = 0;  // the slices it owns
  int64_t held_bytes = 0;      // stored_bytes() of the same slices
  int64_t owned_bytes = 0;
};
RankWeights rank_weights(const ModelConfig& config, const parallel::ParallelPlan& plan, int rank,
                         int64_t element_bytes = 2);

// Bytes the whole checkpoint stores (every parameter once), unquantized weights at `element_bytes`.
int64_t stored_model_bytes(const ModelConfig& config, int64_t element_bytes = 2);

// Bytes of MLA latent cache per cached token on `rank`: (kv_lora_rank + rope) per layer of
// its stage. Every attention-TP rank caches the whole latent (it is shared by all heads).
int64_t kv_bytes_per_token(const ModelConfig& config, const parallel::ParallelPlan& plan, int rank,
                           int64_t bytes_per_element);

}  // namespace moeserve
