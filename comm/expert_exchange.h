// The host side of expert-parallel token exchange (DeepEP-style layout / dispatch / combine)
// over a stage's MoE group, written against ops::Backend and comm::Communicator:
//   layout:   from a rank's top-k routing, which rows go to which rank and expert; the
//             [ranks, experts_per_group] row counts are exchanged by all_to_all_v "moe_counts";
//   dispatch: the rows, gathered in (destination, expert, token, k) order, travel by
//             all_to_all_v "moe_dispatch"; a row goes to every MoE-TP rank of its expert's
//             EP group;
//   combine:  the experts' outputs return by all_to_all_v "moe_combine" in the order they
//             were sent, and the sender sums them in a fixed order (k, then MoE-TP index)
//             with the routing weights.
// Rows move in backend memory (gather_rows, all_to_all_v, row_combine); only the routing and
// the row counts come to the host to lay the exchange out.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "ops/ops.h"

namespace moeserve::comm {

// How routed experts sit on the group's ranks: rank r holds expert group r / moe_tp (experts
// [group * experts_per_group, (group + 1) * experts_per_group)), column part r % moe_tp.
struct ExpertPlacement {
  int ranks = 1;
  int moe_tp = 1;
  int64_t experts_per_group = 0;
  int64_t top_k = 1;
};

// Where a rank's routed (token, k) pairs go, computed on the host from its top-k ids alone.
struct ExpertLayout {
  int64_t tokens = 0;                       // routed tokens of this rank
  std::vector<int32_t> send_expert_counts;  // [ranks, experts_per_group] rows per (destination, expert)
  std::vector<size_t> send_rows;            // [ranks] rows per destination
  std::vector<int32_t> send_source_rows;    // [sent]: sent row -> the token's row (offset by row_begin)
  std::vector<int64_t> position;            // [tokens * top_k * moe_tp]: (i * top_k + k) * moe_tp + j -> sent row
};

// topk_ids [tokens, top_k] (global expert ids); the tokens are rows [row_begin, row_begin +
// tokens) of the dispatched activations.
ExpertLayout expert_layout(const ExpertPlacement& placement, const std::vector<int32_t>& topk_ids, int64_t row_begin);

class ExpertExchange {
 public:
  struct Params {
    ops::Backend& backend;
    Communicator& group;  // the stage's MoE group, placement.ranks members
    ExpertPlacement placement;
    int64_t local_expert_begin;  // the first (global) expert of this rank's group
    int64_t hidden;              // row width, in the backend's activation dtype
  };
  explicit ExpertExchange(const Params& params);

  // One exchange: the layout, the counts received, and the backend buffers that must live
  // until the combine's work has run (the caller synchronises before dropping it).
  struct Handle {
    ExpertLayout layout;
    int64_t row_begin = 0;
    std::vector<int32_t> recv_expert_counts;  // [ranks (source), experts_per_group]
    std::vector<size_t> recv_rows;            // [ranks] rows per source
    int64_t sent = 0, received = 0;
    std::vector<ops::BufferPtr> buffers;
  };
  // The rows a rank received, for its experts: one expert per row, weight 1 (the routing
  // weights are applied by the sender's combine).
  struct Received {
    const void* x;              // [rows, hidden]
    const int32_t* expert_ids;  // [rows] global expert ids
    const float* weights;       // [rows] ones
    void* y;                    // [rows, hidden]: where the experts write their outputs
    int64_t rows;
  };
  struct CombineTarget {
    void* out;  // [rows, hidden]; fp32 when out_f32. Rows outside the handle's tokens get 0
    int64_t rows;
    bool out_f32 = false;
  };

  // topk_ids [tokens, top_k] route rows [row_begin, row_begin + tokens) of what dispatch sends.
  Handle layout(const std::vector<int32_t>& topk_ids, int64_t row_begin);
  Received dispatch(const void* x, Handle& handle);
  // out[row_begin + i] = sum over k, then MoE-TP j, of topk_weights[i, k] * y's row for (i, k, j).
  void combine(const void* y, const std::vector<float>& topk_weights, Handle& handle, const CombineTarget& target);

 private:
  // At least one element each, so that every pointer is valid.
  ops::BufferPtr alloc(int64_t elements, size_t elem);
  ops::BufferPtr upload_i32(const std::vector<int32_t>& values);
  ops::BufferPtr upload_f32(const std::vector<float>& values);
  // The handle keeps `buffer` alive; returns its data.
  static void* keep(Handle& handle, ops::BufferPtr buffer);

  ops::Backend& backend_;
  Communicator& group_;
  ExpertPlacement placement_;
  int64_t local_expert_begin_;
  int64_t hidden_;
};

}  // namespace moeserve::comm
