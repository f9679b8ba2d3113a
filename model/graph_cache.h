// Captured step graphs, by step shape. Decode-shaped steps replay a captured graph: same
// tokens and block-table width as the capture, pointers fixed by the per-T workspace, no
// host work between the ops. A shape runs once uncaptured first (the warm-up sizes every
// lazily grown workspace), is captured on its second run, and replayed from then on.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "ops/ops.h"
#include "step/forward_batch.h"

namespace moeserve {

class GraphCache {
 public:
  // What a graph holds of its step: all of it, or a constrained step's two halves, the forward
  // to the logits and the draw after the token bitmask (uploaded between the two).
  enum class Part { kWhole, kForward, kDraw };
  struct Key {
    int64_t tokens = 0, logit_rows = 0, max_pages_per_seq = 0;
    bool mtp_draft = false;             // an MTP draft step (ForwardBatch::mtp_draft) or the target's
    DrawKind draw = DrawKind::kLogits;  // the sampler's device part is captured with the step
    bool logit_adjust = false;          // with the logit-adjust op before the draw (or without it)
    Part part = Part::kWhole;
    auto operator<=>(const Key&) const = default;
  };

  explicit GraphCache(ops::Backend& backend) : backend_(backend) {}

  // Runs `step` (the device work of one step of shape `key`), captured or replayed as above.
  void run(const Key& key, const std::function<void()>& step);

  int64_t size() const { return static_cast<int64_t>(graphs_.size()); }
  // The callers synchronise first: the graphs point into buffers about to move.
  void clear() { graphs_.clear(); }
  void drop_tokens(int64_t tokens);  // the graphs of steps of `tokens` tokens

 private:
  ops::Backend& backend_;
  std::map<Key, std::unique_ptr<ops::Graph>> graphs_;
  std::set<Key> warmed_up_;
};

}  // namespace moeserve
