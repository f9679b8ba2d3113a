#include "comm/expert_exchange.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve::comm {

ExpertLayout expert_layout(const ExpertPlacement& placement, const std::vector<int32_t>& topk_ids, int64_t row_begin) {
  const int ranks = placement.ranks, moe_tp = placement.moe_tp;
  const int64_t top_k = placement.top_k, experts_per_group = placement.experts_per_group;
  ExpertLayout out;
  out.tokens = static_cast<int64_t>(topk_ids.size()) / top_k;
  // (token, k) pairs per expert, in token then k order.
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(ranks / moe_tp * experts_per_group));
  for (int64_t i = 0; i < out.tokens; ++i)
    for (int64_t k = 0; k < top_k; ++k) by_expert[topk_ids[i * top_k + k]].push_back(i * top_k + k);
  // Row counts per (destination rank, expert of its group); where each (i, k, j) row sits.
  out.send_expert_counts.assign(ranks * experts_per_group, 0);
  out.send_rows.assign(ranks, 0);
  out.position.assign(out.tokens * top_k * moe_tp, 0);
  for (int dest = 0; dest < ranks; ++dest) {
    const int64_t group = dest / moe_tp, j = dest % moe_tp;
    for (int64_t le = 0; le < experts_per_group; ++le) {
      const auto& rows = by_expert[group * experts_per_group + le];
      out.send_expert_counts[dest * experts_per_group + le] = static_cast<int32_t>(rows.size());
      out.send_rows[dest] += rows.size();
      for (int64_t ik : rows) {
        out.position[ik * moe_tp + j] = static_cast<int64_t>(out.send_source_rows.size());
        out.send_source_rows.push_back(static_cast<int32_t>(row_begin + ik / top_k));
      }
    }
  }
  return out;
}

ExpertExchange::ExpertExchange(const Params& params)
    : backend_(params.backend),
      group_(params.group),
      placement_(params.placement),
      local_expert_begin_(params.local_expert_begin),
      hidden_(params.hidden) {
  MS_CHECK(group_.size() == placement_.ranks && placement_.ranks % placement_.moe_tp == 0,
           "expert exchange: a group of {} ranks for a placement of {} ranks, MoE TP {}", group_.size(),
           placement_.ranks, placement_.moe_tp);
}

ops::BufferPtr ExpertExchange::alloc(int64_t elements, size_t elem) {
  return backend_.alloc(std::max<int64_t>(elements, 1) * elem);
}

ops::BufferPtr ExpertExchange::upload_i32(const std::vector<int32_t>& values) {
  ops::BufferPtr b = alloc(static_cast<int64_t>(values.size()), 4);
  if (!values.empty()) backend_.upload(*b, 0, values.data(), values.size() * 4);
  return b;
}

ops::BufferPtr ExpertExchange::upload_f32(const std::vector<float>& values) {
  ops::BufferPtr b = alloc(static_cast<int64_t>(values.size()), 4);
  if (!values.empty()) backend_.upload(*b, 0, values.data(), values.size() * 4);
  return b;
}

void* ExpertExchange::keep(Handle& handle, ops::BufferPtr buffer) {
  handle.buffers.push_back(std::move(buffer));
  return handle.buffers.back()->data();
}

ExpertExchange::Handle ExpertExchange::layout(const std::vector<int32_t>& topk_ids, int64_t row_begin) {
  const int ranks = placement_.ranks;
  const int64_t experts_per_group = placement_.experts_per_group;
  Handle handle;
  handle.layout = expert_layout(placement_, topk_ids, row_begin);
  handle.row_begin = row_begin;
  handle.recv_expert_counts.resize(ranks * experts_per_group);
  const std::vector<size_t> count_blocks(ranks, static_cast<size_t>(experts_per_group));
  {
    // Counts travel through backend memory like every other payload.
    ops::BufferPtr send_counts = upload_i32(handle.layout.send_expert_counts),
                   recv_counts = alloc(ranks * experts_per_group, 4);
    group_.set_site("moe_counts");
    group_.all_to_all_v(send_counts->data(), count_blocks, recv_counts->data(), count_blocks, DType::I32);
    backend_.download(handle.recv_expert_counts.data(), *recv_counts, 0, handle.recv_expert_counts.size() * 4);
  }
  handle.recv_rows.assign(ranks, 0);
  for (int src = 0; src < ranks; ++src)
    for (int64_t le = 0; le < experts_per_group; ++le)
      handle.recv_rows[src] += handle.recv_expert_counts[src * experts_per_group + le];
  handle.sent = static_cast<int64_t>(handle.layout.send_source_rows.size());
  for (size_t n : handle.recv_rows) handle.received += static_cast<int64_t>(n);
  return handle;
}

namespace {

std::vector<size_t> elements_of(const std::vector<size_t>& rows, int64_t width) {
  std::vector<size_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * static_cast<size_t>(width);
  return out;
}

}  // namespace

ExpertExchange::Received ExpertExchange::dispatch(const void* x, Handle& handle) {
  const DType act_dtype = backend_.activation_dtype();
  const size_t act = dtype_size(act_dtype);
  const int64_t hidden = hidden_, experts_per_group = placement_.experts_per_group;
  // send [sent, hidden] gathered from x; recv [received, hidden].
  void* send_x = keep(handle, alloc(handle.sent * hidden, act));
  void* recv_x = keep(handle, alloc(handle.received * hidden, act));
  const auto* source_rows = static_cast<const int32_t*>(keep(handle, upload_i32(handle.layout.send_source_rows)));
  backend_.gather_rows({x, source_rows, send_x, handle.sent, hidden});
  group_.set_site("moe_dispatch");
  group_.all_to_all_v(send_x, elements_of(handle.layout.send_rows, hidden), recv_x,
                      elements_of(handle.recv_rows, hidden), act_dtype);

  std::vector<int32_t> recv_ids;  // [received]
  for (int src = 0; src < placement_.ranks; ++src)
    for (int64_t le = 0; le < experts_per_group; ++le)
      recv_ids.insert(recv_ids.end(), handle.recv_expert_counts[src * experts_per_group + le],
                      static_cast<int32_t>(local_expert_begin_ + le));
  const auto* ids = static_cast<const int32_t*>(keep(handle, upload_i32(recv_ids)));
  const auto* ones = static_cast<const float*>(keep(handle, upload_f32(std::vector<float>(handle.received, 1.0f))));
  void* y = keep(handle, alloc(handle.received * hidden, act));  // [received, hidden]
  return {recv_x, ids, ones, y, handle.received};
}

void ExpertExchange::combine(const void* y, const std::vector<float>& topk_weights, Handle& handle,
                             const CombineTarget& target) {
  const DType act_dtype = backend_.activation_dtype();
  const int64_t hidden = hidden_, top_k = placement_.top_k, T = target.rows;
  const int moe_tp = placement_.moe_tp;
  // The outputs travel back: [sent, hidden] in the order the rows were sent.
  void* combined = keep(handle, alloc(handle.sent * hidden, dtype_size(act_dtype)));
  group_.set_site("moe_combine");
  group_.all_to_all_v(y, elements_of(handle.recv_rows, hidden), combined, elements_of(handle.layout.send_rows, hidden),
                      act_dtype);

  // out[t] = sum over k (then MoE-TP j) of weight[t, k] * output; zero outside the handle's
  // tokens. As CSR per output row: offsets [T + 1], the combined rows and their weights.
  const int64_t begin = handle.row_begin, end = begin + handle.layout.tokens;
  std::vector<int32_t> offsets(T + 1, 0), rows_of;
  std::vector<float> weights_of;
  for (int64_t t = 0; t < T; ++t) {
    offsets[t] = static_cast<int32_t>(rows_of.size());
    if (t < begin || t >= end) continue;
    const int64_t i = t - begin;
    for (int64_t k = 0; k < top_k; ++k)
      for (int j = 0; j < moe_tp; ++j) {
        rows_of.push_back(static_cast<int32_t>(handle.layout.position[(i * top_k + k) * moe_tp + j]));
        weights_of.push_back(topk_weights[i * top_k + k]);
      }
  }
  offsets[T] = static_cast<int32_t>(rows_of.size());
  const auto* offsets_device = static_cast<const int32_t*>(keep(handle, upload_i32(offsets)));
  const auto* rows_device = static_cast<const int32_t*>(keep(handle, upload_i32(rows_of)));
  const auto* weights_device = static_cast<const float*>(keep(handle, upload_f32(weights_of)));
  backend_.row_combine({.src = combined,
                        .offsets = offsets_device,
                        .src_rows = rows_device,
                        .weights = weights_device,
                        .out = target.out,
                        .rows = T,
                        .width = hidden,
                        .out_f32 = target.out_f32});
}

}  // namespace moeserve::comm
