// Launchers of the CUDA kernels: plain C++ signatures (raw pointers, sizes, a stream) so that
// the backend class compiles as ordinary C++. bf16 tensors are passed as void*.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace moeserve::cuda {

// Elementwise and row-wise ops (elementwise.cu).
void launch_embedding(const int32_t* ids, const void* table, void* out, int64_t tokens, int64_t hidden,
                      int64_t vocab_begin, int64_t vocab_end, cudaStream_t stream);
void launch_rms_norm(const void* x, const void* weight, void* y, int64_t rows, int64_t dim, int64_t x_stride,
                     int64_t y_stride, float eps, cudaStream_t stream);
// Streamed dense projection (gemv.cu): 16-byte aligned x and weight, in % 8 == 0. Decode-sized
// (rows <= 4: small_linear_supported) it is the fastest; any rows run as groups of 4, each row
// with the arithmetic of a run of its own (the batch-invariant mode's projection).
bool streaming_linear_supported(int64_t in, const void* x, const void* weight, int64_t x_stride);
bool small_linear_supported(int64_t rows, int64_t in, const void* x, const void* weight, int64_t x_stride);
// The batch-invariant mode's projection of wide matrices (out >= kLinearMmaMinRows, in % 32 == 0,
// aligned rows) on tensor cores: any rows, each with the arithmetic of a run of its own
// (gemv.cu). Narrower ones stream (the batch-invariant choice depends on the shape only).
constexpr int64_t kLinearMmaMinRows = 2048;
bool linear_mma_supported(int64_t in, int64_t out, const void* x, const void* weight, int64_t x_stride);
void launch_linear_mma(const void* x, const void* weight, void* y, int64_t rows, int64_t in, int64_t out,
                       int64_t x_stride, int64_t y_stride, bool accumulate, bool y_f32, cudaStream_t stream);
void launch_streaming_linear(const void* x, const void* weight, void* y, int64_t rows, int64_t in, int64_t out,
                             int64_t x_stride, int64_t y_stride, bool accumulate, bool y_f32, cudaStream_t stream);
// `batches` such projections at once: batch b reads x + b * x_batch and weight + b * w_batch
// and writes y + b * y_batch (elements); each batch's pointers must meet the same conditions.
void launch_streaming_linear_batched(const void* x, const void* weight, void* y, int64_t rows, int64_t in,
                                     int64_t out, int64_t x_stride, int64_t y_stride, int64_t batches,
                                     int64_t x_batch, int64_t w_batch, int64_t y_batch, bool accumulate, bool y_f32,
                                     cudaStream_t stream);
// acc_f32: acc and x are fp32 (no rounding); otherwise acc is bf16 and an fp32 x is rounded first.
void launch_add(void* acc, const void* x, bool x_f32, bool acc_f32, int64_t count, cudaStream_t stream);
void launch_add_rms_norm(void* hidden, const void* x, bool x_f32, const void* weight, void* normed, int64_t rows,
                         int64_t dim, float eps, cudaStream_t stream);
void launch_rope(void* x, const int32_t* positions, const float* inv_freq, int64_t tokens, int64_t heads,
                 int64_t token_stride, int64_t head_stride, int64_t rope_dim, float attention_factor,
                 bool interleaved, cudaStream_t stream);
void launch_silu_mul(const void* gate_up, void* out, int64_t tokens, int64_t inter, cudaStream_t stream);
void launch_kv_write(const void* entries, const int32_t* slots, void* cache, int64_t tokens, int64_t width,
                     cudaStream_t stream);
void launch_gather_rows(const void* src, const int32_t* rows, void* dst, int64_t num_rows, int64_t width,
                        cudaStream_t stream);
void launch_row_combine(const void* src, const int32_t* offsets, const int32_t* src_rows, const float* weights,
                        void* out, bool out_f32, int64_t rows, int64_t width, bool accumulate, cudaStream_t stream);
// out[r, c] = bf16(offset + amplitude * uniform_pm1(stream_seed, (row0 + r) * full_cols + col0 + c))
void launch_fill_uniform(void* out, bool out_f32, int64_t rows, int64_t cols, int64_t full_cols, int64_t row0,
                         int64_t col0, uint64_t stream_seed, float offset, float amplitude, cudaStream_t stream);
void launch_f32_to_bf16(const float* src, void* dst, int64_t count, cudaStream_t stream);
void launch_bf16_to_f32(const void* src, float* dst, int64_t count, cudaStream_t stream);
// x[i] = float(bf16(x[i])): fp32 values rounded to bf16 where they are stored as fp32.
void launch_round_to_bf16(float* x, int64_t count, cudaStream_t stream);

// The absorbed query of a decode-sized batch (tokens <= 4, latent % 8 == 0, latent <= 2048,
// kv_b 16-byte aligned): q_latent[t, h, :] = q_nope[t, h, :] @ W_uk[h] (mla_attention.cu). Any
// tokens run as groups of 4 with the arithmetic of a run of their own (batch-invariant mode;
// mla_q_absorb_streaming_supported).
bool mla_q_absorb_streaming_supported(int64_t latent, const void* kv_b);
bool mla_q_absorb_small_supported(int64_t tokens, int64_t latent, const void* kv_b);
void launch_mla_q_absorb_small(const void* q, const void* kv_b, void* q_latent, int64_t tokens, int64_t heads,
                               int64_t q_head_stride, int64_t nope, int64_t v, int64_t latent, cudaStream_t stream);

// MLA attention over the paged latent cache (mla_attention.cu).
// Workspace: per (token, head, context split) partial softmax state (mla_workspace_bytes).
// batch_invariant: each token's context is split by its own length only (the same arithmetic in
// any batch); otherwise the splits fill the GPU for this launch's tokens.
int64_t mla_workspace_bytes(int64_t tokens, int64_t heads, int64_t latent, int64_t max_context, bool batch_invariant);
void launch_mla_attention(const void* q_latent, const void* q_rope, const void* cache, const int32_t* block_tables,
                          const int32_t* seq_of_token, const int32_t* positions, void* out, int64_t tokens,
                          int64_t heads, int64_t latent, int64_t rope, int64_t q_head_stride, int64_t rope_offset,
                          int64_t page_size, int64_t max_pages_per_seq, float scale, bool batch_invariant,
                          void* workspace, cudaStream_t stream);

// MoE (moe.cu).
// Workspace: the [tokens, experts] fp32 router logits (route_workspace_bytes).
int64_t route_workspace_bytes(int64_t tokens, int64_t experts);
void launch_moe_route(const void* x, const float* weight, const float* bias, int32_t* topk_ids, float* topk_weights,
                      int64_t tokens, int64_t hidden, int64_t experts, int64_t n_group, int64_t topk_group,
                      int64_t top_k, bool norm_topk_prob, float routed_scaling_factor, bool batch_invariant,
                      void* workspace, cudaStream_t stream);

// Workspace of the grouped expert computation; sized by moe_workspace_bytes().
int64_t moe_workspace_bytes(int64_t tokens, int64_t top_k, int64_t local_experts, int64_t hidden, int64_t inter);
// Grouped experts in phases (the backend picks the compute path between sort and combine):
//   sort: count the (token, k) pairs of each local expert, offsets, pairs in expert order;
//   compute, either the streaming kernels (few rows per expert: decode, graph-capturable) or
//     per-expert tensor-core GEMMs over rows gathered in expert order (many rows: prefill);
//   combine: out[t] (+)= sum over k of weight * the pair's output, in k order.
void launch_moe_sort(const int32_t* topk_ids, int64_t pairs, int64_t expert_begin, int64_t expert_end,
                     int64_t hidden, int64_t inter, void* workspace, cudaStream_t stream);
// `local_pairs`: the pairs expected to be routed to the local experts (picks the kernels).
// batch_invariant: one kernel pair whatever the rows per expert (tensor cores where the shapes
// allow), so a row's arithmetic does not depend on the batch.
void launch_moe_expert_kernels(const void* x, const void* const* w13, const void* const* w2, int64_t pairs,
                               int64_t local_pairs, int64_t top_k, int64_t local_experts, int64_t hidden, int64_t inter,
                               bool batch_invariant, void* workspace, cudaStream_t stream);
// GEMM path: buffers inside the workspace.
struct MoeGemmBuffers {
  int32_t* offsets;  // [local_experts + 1] (device)
  void* x_sorted;    // [pairs, hidden] bf16
  void* gate_up;     // [pairs, 2 * inter] bf16
  void* act;         // [pairs, inter] bf16
  float* partial;    // [pairs, hidden] fp32
};
MoeGemmBuffers moe_gemm_buffers(void* workspace, int64_t pairs, int64_t local_experts, int64_t hidden, int64_t inter);
void launch_moe_gather_sorted(const void* x, int64_t pairs, int64_t top_k, int64_t local_experts, int64_t hidden,
                              int64_t inter, void* workspace, cudaStream_t stream);
void launch_moe_combine(const float* topk_weights, void* out, bool out_f32, int64_t tokens, int64_t top_k,
                        int64_t local_experts, int64_t hidden, int64_t inter, bool accumulate, void* workspace,
                        cudaStream_t stream);

// Sampling (sample.cu). Greedy rows: argmax per row (values may be null).
void launch_argmax_rows(const float* logits, int32_t* tokens, float* values, int64_t rows, int64_t vocab,
                        int64_t id_offset, cudaStream_t stream);
// Sampled rows: candidates (ops::TopCandidatesParams), in two launches through `workspace`.
int64_t top_candidates_workspace_bytes(int64_t rows, int64_t vocab, int64_t count);
void launch_top_candidates(const float* logits, const float* temperatures, float* values, int32_t* ids,
                           double* normaliser, int64_t rows, int64_t vocab, int64_t count,
                           int64_t id_offset, void* workspace, cudaStream_t stream);

// Whole-row draws (ops::SampleParams): row r reads logit row row_ids[r] (device memory; the
// options and ids are copied from host memory) of [slices, logit_rows, vocab / slices]; sorts
// up to kSampleRowsPerSort rows at a time through `workspace`.
struct DrawOptions {
  float temperature;
  int32_t top_k;
  float top_p, min_p;
  float u;  // the draw's uniform number, uniform01(seed, step)
};
constexpr int64_t kSampleRowsPerSort = 16;
int64_t sample_rows_workspace_bytes(int64_t rows, int64_t vocab);
void launch_sample_rows(const float* logits, const int32_t* row_ids, int64_t logit_rows, int64_t slices,
                        const DrawOptions* options, int32_t* tokens, int64_t rows, int64_t vocab, void* workspace,
                        cudaStream_t stream);

}  // namespace moeserve::cuda
