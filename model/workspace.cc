#include "model/workspace.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/env.h"
#include "core/error.h"
#include "model/deepseek_v3.h"

namespace moeserve {
namespace {

using ops::BufferPtr;

// A non-owning window of a larger buffer (the activation arena).
class BufferView final : public ops::Buffer {
 public:
  BufferView(void* data, size_t nbytes) : data_(data), nbytes_(nbytes) {}
  void* data() override { return data_; }
  size_t nbytes() const override { return nbytes_; }

 private:
  void* data_;
  size_t nbytes_;
};

// Lays buffers (at least one element each) out one after the other, 256-byte aligned, in
// `arena`: with an Activations object, points its members there; without one, only adds up
// the bytes the layout needs.
class ArenaLayout {
 public:
  ArenaLayout(Activations* a, ops::Buffer* arena) : a_(a), arena_(arena) {}
  void place(BufferPtr Activations::*member, int64_t elements, size_t elem) {
    const size_t n = static_cast<size_t>(std::max<int64_t>(elements, 1)) * elem;
    if (a_ != nullptr) a_->*member = std::make_unique<BufferView>(static_cast<std::byte*>(arena_->data()) + used_, n);
    used_ += (n + 255) & ~size_t{255};
  }
  size_t used() const { return used_; }

 private:
  Activations* a_;
  ops::Buffer* arena_;
  size_t used_ = 0;
};

}  // namespace

size_t Workspace::lay_out_activations(Activations* a, int64_t T, ops::Buffer* arena) const {
  const ModelConfig& c = dims_.config;
  const parallel::RankShard& shard = dims_.shard;
  const size_t act = dtype_size(backend_.activation_dtype());
  const int64_t heads_local = shard.heads.size();
  const int64_t latent = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  const int64_t max_inter =
      std::max({shard.dense_intermediate.size(), shard.shared_intermediate.size(), shard.expert_intermediate.size()});
  ArenaLayout layout(a, arena);
  layout.place(&Activations::hidden, T * c.hidden_size, act);
  layout.place(&Activations::normed, T * c.hidden_size, act);
  if (dims_.parts > 1) {
    layout.place(&Activations::branch_parts, dims_.parts * T * c.hidden_size, 4);
    if (a != nullptr) a->branch = std::make_unique<BufferView>(a->branch_parts->data(), T * c.hidden_size * 4);
  } else {
    layout.place(&Activations::branch, T * c.hidden_size, 4);
  }
  if (dims_.reduction_plan && dims_.attn_tp > 2)
    layout.place(&Activations::branch_gather, dims_.attn_tp * T * c.hidden_size, 4);
  layout.place(&Activations::q_a, T * c.q_lora_rank, act);
  layout.place(&Activations::q_a_normed, T * c.q_lora_rank, act);
  layout.place(&Activations::q, T * heads_local * c.qk_head_dim(), act);
  layout.place(&Activations::kv, T * (latent + rope), act);
  layout.place(&Activations::q_latent, T * heads_local * latent, act);
  layout.place(&Activations::attn_latent, T * heads_local * latent, act);
  layout.place(&Activations::attn_v, T * heads_local * c.v_head_dim, act);
  layout.place(&Activations::gate_up, T * 2 * max_inter, act);
  layout.place(&Activations::act, T * max_inter, act);
  layout.place(&Activations::topk_ids, T * c.num_experts_per_tok, 4);
  layout.place(&Activations::topk_weights, T * c.num_experts_per_tok, 4);
  if (dims_.mtp) layout.place(&Activations::mtp_in, T * 2 * c.hidden_size, act);
  return layout.used();
}

size_t Workspace::lay_out_head(Activations* a, int64_t rows, ops::Buffer* arena) const {
  // Per vocab part of this rank (parts of them, each vocab_local / parts wide), in part order.
  const int tp = dims_.head_tp, parts = dims_.parts;
  const int64_t vocab_local = dims_.shard.vocab.size(), n = std::max<int64_t>(rows, 1);
  ArenaLayout layout(a, arena);
  layout.place(&Activations::selected, n * dims_.config.hidden_size, dtype_size(backend_.activation_dtype()));
  layout.place(&Activations::local_logits, n * vocab_local, 4);  // [parts, R, vocab part]
  layout.place(&Activations::greedy_pairs, parts * 2 * n, 4);    // [parts, 2R]
  const int64_t c = dims_.candidates_per_slice;
  layout.place(&Activations::temperatures, n, 4);
  layout.place(&Activations::token_bitmask, n * ((dims_.config.vocab_size + 31) / 32), 4);
  layout.place(&Activations::cand_values, parts * n * c, 4);  // [parts, R, C]
  layout.place(&Activations::cand_ids, parts * n * c, 4);
  layout.place(&Activations::cand_normaliser, parts * n, 8);  // [parts, R]
  if (tp > 1) {
    layout.place(&Activations::gathered_logits, tp * n * vocab_local, 4);
    layout.place(&Activations::gathered_pairs, tp * parts * 2 * n, 4);
    layout.place(&Activations::gathered_cand_values, tp * parts * n * c, 4);
    layout.place(&Activations::gathered_cand_ids, tp * parts * n * c, 4);
    layout.place(&Activations::gathered_cand_normaliser, tp * parts * n, 8);
  }
  return layout.used();
}

sample::SamplerBuffers Workspace::sampler_buffers(const Activations& a) const {
  return {.logits = a.local_logits.get(),
          .gathered_logits = a.gathered_logits.get(),
          .temperatures = a.temperatures.get(),
          .token_bitmask = a.token_bitmask.get(),
          .greedy_pairs = a.greedy_pairs.get(),
          .gathered_pairs = a.gathered_pairs.get(),
          .cand_values = a.cand_values.get(),
          .cand_ids = a.cand_ids.get(),
          .cand_normaliser = a.cand_normaliser.get(),
          .gathered_cand_values = a.gathered_cand_values.get(),
          .gathered_cand_ids = a.gathered_cand_ids.get(),
          .gathered_cand_normaliser = a.gathered_cand_normaliser.get(),
          .adjust_entries = a.logit_adjust ? adjust_entries_.get() : nullptr,
          .adjust_count = a.logit_adjust ? adjust_count_.get() : nullptr,
          .adjust_capacity = a.logit_adjust ? adjust_capacity_ : 0,
          .capacity = std::max<int64_t>(head_rows_, 1)};
}

Activations& Workspace::of(int64_t T) {
  if (!arena_ || T > arena_tokens_) {
    // Every step size shares one arena laid out for the largest size seen: growing it moves
    // every buffer, so the graphs captured so far (which point into it) are dropped.
    backend_.synchronize();
    graphs_.clear();
    workspaces_.clear();
    arena_.reset();
    arena_ = backend_.alloc(lay_out_activations(nullptr, T, nullptr));
    arena_tokens_ = T;
  }
  auto& slot = workspaces_[T];
  if (slot) return *slot;
  auto a = std::make_unique<Activations>();
  auto alloc = [&](int64_t elements, size_t elem) { return backend_.alloc(std::max<int64_t>(elements, 1) * elem); };
  a->tokens = T;
  a->ids = alloc(T, 4);  // step metadata: per size, uploaded before each step
  a->positions = alloc(T, 4);
  a->seq_of_token = alloc(T, 4);
  a->slots = alloc(T, 4);
  a->logit_rows = alloc(T, 4);
  if (dims_.mtp) a->mtp_ids = alloc(T, 4);
  if (dims_.mtp) a->mtp_rows = alloc(T, 4);
  lay_out_activations(a.get(), T, arena_.get());
  if (head_arena_) lay_out_head(a.get(), head_rows_, head_arena_.get());
  slot = std::move(a);
  return *slot;
}

void Workspace::reserve_block_tables(Activations& a, int64_t entries) {
  if (a.block_tables && a.block_table_capacity >= entries) return;
  if (a.block_tables) {  // graphs captured for this T point at the old table
    backend_.synchronize();
    graphs_.drop_tokens(a.tokens);
  }
  a.block_table_capacity = std::max(entries, 2 * a.block_table_capacity);
  a.block_tables = backend_.alloc(static_cast<size_t>(std::max<int64_t>(a.block_table_capacity, 1)) * 4);
}

void Workspace::reserve_logit_rows(int64_t rows) {
  if (!dims_.shard.last_stage || (head_arena_ && head_rows_ >= rows)) return;
  // The head's buffers hold the rows that get logits ([rows, vocab] fp32 for every chunk
  // size would cost gigabytes): one arena for all step sizes, sized by the most rows asked.
  if (head_arena_) {
    backend_.synchronize();
    graphs_.clear();  // they point into the old arena
  }
  head_rows_ = std::max(rows, 2 * head_rows_);
  head_arena_.reset();
  head_arena_ = backend_.alloc(lay_out_head(nullptr, head_rows_, nullptr));
  for (auto& [tokens, a] : workspaces_) lay_out_head(a.get(), head_rows_, head_arena_.get());
}

Activations& Workspace::prepare(const ForwardBatch& batch) {
  Activations& a = of(batch.num_tokens());
  reserve_block_tables(a, static_cast<int64_t>(batch.block_tables.size()));
  reserve_logit_rows(static_cast<int64_t>(batch.logit_rows.size()));
  auto put = [&](ops::BufferPtr& dst, const std::vector<int32_t>& v) {
    if (!v.empty()) backend_.upload(*dst, 0, v.data(), v.size() * 4);
  };
  put(a.ids, batch.tokens);
  put(a.positions, batch.positions);
  put(a.seq_of_token, batch.seq_of_token);
  put(a.slots, batch.slots);
  put(a.block_tables, batch.block_tables);
  put(a.logit_rows, batch.logit_rows);
  if (a.mtp_ids) put(a.mtp_ids, batch.mtp_tokens);
  if (a.mtp_rows) put(a.mtp_rows, batch.mtp_hidden_rows);
  if (batch.draw == DrawKind::kCandidates && dims_.shard.last_stage && !batch.temperatures.empty())
    backend_.upload(*a.temperatures, 0, batch.temperatures.data(), batch.temperatures.size() * 4);
  upload_logit_adjust(a, batch);
  return a;
}

void Workspace::upload_token_bitmask(Activations& a, const TokenBitmask& mask) {
  MS_CHECK(dims_.shard.last_stage, "workspace: a token bitmask uploaded on a stage without the LM head");
  const auto start = std::chrono::steady_clock::now();
  const std::span<const int32_t> words = mask.wait();
  const auto filled = std::chrono::steady_clock::now();
  // Through the backend's pinned staging (asynchronous, in stream order): the forward to the
  // logits may still be running on the device.
  backend_.upload(*a.token_bitmask, 0, words.data(), words.size() * 4);
  // MOESERVE_GRAMMAR_TIMING=N: every N masks, how long this rank waited for them and spent
  // uploading them (is the host's mask filling hidden behind the forward?).
  static const int every = env_int("MOESERVE_GRAMMAR_TIMING", 0);
  if (every <= 0) return;
  using Ms = std::chrono::duration<double, std::milli>;
  mask_wait_ms_ += Ms(filled - start).count();
  mask_upload_ms_ += Ms(std::chrono::steady_clock::now() - filled).count();
  if (++masks_uploaded_ % every != 0) return;
  std::fprintf(stderr, "grammar timing: %lld masks, mean wait %.3f ms, mean upload %.3f ms\n",
               static_cast<long long>(masks_uploaded_), mask_wait_ms_ / masks_uploaded_,
               mask_upload_ms_ / masks_uploaded_);
}

void Workspace::upload_logit_adjust(Activations& a, const ForwardBatch& batch) {
  a.logit_adjust = dims_.shard.last_stage && !batch.logit_adjust.empty();
  if (!a.logit_adjust) return;
  const auto n = static_cast<int64_t>(batch.logit_adjust.size());
  for (const ops::LogitAdjustEntry& e : batch.logit_adjust)
    MS_CHECK(e.row >= 0 && e.row < static_cast<int64_t>(batch.logit_rows.size()) && e.token >= 0 &&
                 e.token < dims_.config.vocab_size,
             "forward batch: logit_adjust entry (row {}, token {}) is outside its {} logit rows or the vocabulary",
             e.row, e.token, batch.logit_rows.size());
  if (!adjust_entries_ || n > adjust_capacity_) {
    if (adjust_entries_) {  // graphs captured with adjustments point at the old buffer
      backend_.synchronize();
      graphs_.clear();
    }
    adjust_capacity_ = std::max(n, 2 * adjust_capacity_);
    adjust_entries_ = backend_.alloc(static_cast<size_t>(adjust_capacity_) * sizeof(ops::LogitAdjustEntry));
    if (!adjust_count_) adjust_count_ = backend_.alloc(4);
  }
  const auto count = static_cast<int32_t>(n);
  backend_.upload(*adjust_entries_, 0, batch.logit_adjust.data(),
                  batch.logit_adjust.size() * sizeof(ops::LogitAdjustEntry));
  backend_.upload(*adjust_count_, 0, &count, 4);
}

}  // namespace moeserve
