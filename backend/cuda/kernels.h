// Launchers of the CUDA kernels: plain C++17 signatures (one ops:: Params struct, or a
// launch struct built from it once in cuda_backend.cc, and a stream) so that the backend
// class compiles as ordinary C++. bf16 tensors are passed as void*. A shape a kernel does not
// support throws std::invalid_argument naming the parameter.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernel_policy.h"
#include "ops/ops.h"

namespace moeserve::cuda {

// Elementwise and row-wise ops (elementwise.cu).
void launch_embedding(const ops::EmbeddingParams& p, cudaStream_t stream);
void launch_rms_norm(const ops::RmsNormParams& p, cudaStream_t stream);
// acc_f32: acc and x are fp32 (no rounding); otherwise acc is bf16 and an fp32 x is rounded first.
void launch_add(const ops::AddParams& p, cudaStream_t stream);
void launch_add_rms_norm(const ops::AddRmsNormParams& p, cudaStream_t stream);
void launch_rope(const ops::RopeParams& p, cudaStream_t stream);
void launch_silu_mul(const ops::SiluMulParams& p, cudaStream_t stream);
void launch_kv_write(const ops::KvWriteParams& p, cudaStream_t stream);
void launch_gather_rows(const ops::GatherRowsParams& p, cudaStream_t stream);
void launch_row_combine(const ops::RowCombineParams& p, cudaStream_t stream);
void launch_fill_uniform(const ops::FillUniformParams& p, cudaStream_t stream);
void launch_fill_random_words(const ops::FillRandomWordsParams& p, cudaStream_t stream);
// x[i] = float(bf16(x[i])): fp32 values rounded to bf16 where they are stored as fp32.
void launch_round_to_bf16(float* x, int64_t count, cudaStream_t stream);

// Streamed dense projection (gemv.cu): 16-byte aligned x and weight, in % 8 == 0. Decode-sized
// (rows <= 4: small_linear_supported) it is the fastest; any rows run as groups of 4, each row
// with the arithmetic of a run of its own (the batch-invariant mode's projection).
// `batches` such projections at once: batch b reads x + b * x_batch and weight + b * w_batch
// and writes y + b * y_batch (elements); each batch's pointers must meet the same conditions.
struct StreamingLinearParams {
  ops::LinearParams linear;  // one batch's projection
  int64_t batches = 1, x_batch = 0, w_batch = 0, y_batch = 0;
};
bool streaming_linear_supported(const ops::LinearParams& p);
bool small_linear_supported(const ops::LinearParams& p);
void launch_streaming_linear(const StreamingLinearParams& p, cudaStream_t stream);
// The batch-invariant mode's projection of wide matrices (out_features >= min_out_features,
// in_features % 32 == 0, aligned rows) on tensor cores: any rows, each with the arithmetic of
// a run of its own (gemv.cu). Narrower ones stream (the choice depends on the shape only).
bool linear_mma_supported(const ops::LinearParams& p, int64_t min_out_features);
void launch_linear_mma(const ops::LinearParams& p, cudaStream_t stream);

// The absorbed query of a decode-sized batch (tokens <= 4, latent % 8 == 0, latent <= 2048,
// kv_b 16-byte aligned): q_latent[t, h, :] = q_nope[t, h, :] @ W_uk[h] (mla_attention.cu). Any
// tokens run as groups of 4 with the arithmetic of a run of their own (batch-invariant mode;
// mla_q_absorb_streaming_supported).
bool mla_q_absorb_streaming_supported(const ops::MlaQAbsorbParams& p);
bool mla_q_absorb_small_supported(const ops::MlaQAbsorbParams& p);
void launch_mla_q_absorb_small(const ops::MlaQAbsorbParams& p, cudaStream_t stream);

// MLA attention over the paged latent cache (mla_attention.cu).
// Workspace: per (token, head, context split) partial softmax state (mla_workspace_bytes).
// policy.batch_invariant: each token's context is split by its own length only (the same
// arithmetic in any batch); otherwise the splits fill the GPU for this launch's tokens.
int64_t mla_workspace_bytes(const ops::MlaAttentionParams& p, bool batch_invariant);
void launch_mla_attention(const ops::MlaAttentionParams& p, const KernelPolicy& policy, void* workspace,
                          cudaStream_t stream);

// MoE (moe.cu).
// Workspace: the [tokens, experts] fp32 router logits (route_workspace_bytes).
int64_t route_workspace_bytes(const ops::MoeRouteParams& p);
void launch_moe_route(const ops::MoeRouteParams& p, bool batch_invariant, void* workspace, cudaStream_t stream);

// Grouped experts in phases (the backend picks the compute path between sort and combine):
//   sort: count the (token, k) pairs of each local expert, offsets, pairs in expert order;
//   compute, either the streaming kernels (few rows per expert: decode, graph-capturable) or
//     per-expert tensor-core GEMMs over rows gathered in expert order (many rows: prefill);
//   combine: out[t] (+)= sum over k of weight * the pair's output, in k order.
// Every phase takes the same launch, built once per call.
struct MoeExpertsLaunch {
  ops::MoeExpertsParams op;
  int64_t pairs;          // op.tokens * op.top_k
  int64_t local_experts;  // op.expert_end - op.expert_begin
  // The pairs expected to be routed to the local experts (picks the kernels).
  int64_t local_pairs;
  void* workspace;  // moe_workspace_bytes(op)
};
int64_t moe_workspace_bytes(const ops::MoeExpertsParams& p);
void launch_moe_sort(const MoeExpertsLaunch& m, cudaStream_t stream);
// policy.batch_invariant: one kernel pair whatever the rows per expert (tensor cores where the
// shapes allow), so a row's arithmetic does not depend on the batch.
void launch_moe_expert_kernels(const MoeExpertsLaunch& m, const KernelPolicy& policy, cudaStream_t stream);
// GEMM path: buffers inside the workspace.
struct MoeGemmBuffers {
  int32_t* offsets;  // [local_experts + 1] (device)
  void* x_sorted;    // [pairs, hidden] bf16
  void* gate_up;     // [pairs, 2 * inter] bf16
  void* act;         // [pairs, inter] bf16
  float* partial;    // [pairs, hidden] fp32
};
MoeGemmBuffers moe_gemm_buffers(const MoeExpertsLaunch& m);
void launch_moe_gather_sorted(const MoeExpertsLaunch& m, cudaStream_t stream);
void launch_moe_combine(const MoeExpertsLaunch& m, cudaStream_t stream);

// Packed quantized weights (ops/quant_layout.h) on tensor cores at every batch size, read
// once per 32 rows (quant_linear.cu, quant_moe.cu; the exact per-group scheme of
// quant_mma.cuh): int4 groups of a multiple of 32, fp8 blocks with block_k % 64 == 0 and
// in_features % 64 == 0; 16-byte aligned x rows. check_quant_kernel_shape throws
// std::invalid_argument naming `what` and the field a shape breaks.
void check_quant_kernel_shape(const char* what, int64_t n, int64_t k, const ops::QuantLayout& layout);
void launch_quant_linear(const ops::LinearParams& p, cudaStream_t stream);
// The compute phase of grouped experts with m.op.expert_quant weights (between launch_moe_sort
// and launch_moe_combine), graph-capturable.
void launch_moe_quant_expert_kernels(const MoeExpertsLaunch& m, cudaStream_t stream);

// Sampling (sample.cu). Greedy rows: argmax per row (values may be null).
void launch_argmax_rows(const ops::ArgmaxRowsParams& p, cudaStream_t stream);
// Structured output (token_bitmask.cu): disallowed ids' logits to -inf, in place.
void launch_apply_token_bitmask(const ops::TokenBitmaskParams& p, cudaStream_t stream);
// Sampled rows: candidates (ops::TopCandidatesParams), in two launches through `workspace`.
int64_t top_candidates_workspace_bytes(const ops::TopCandidatesParams& p);
void launch_top_candidates(const ops::TopCandidatesParams& p, void* workspace, cudaStream_t stream);

// Logit adjustments in place (ops::LogitAdjustParams; logit_adjust.cu), graph-capturable.
void launch_logit_adjust(const ops::LogitAdjustParams& p, cudaStream_t stream);

// Whole-row draws (ops::SampleParams): row r reads logit row row_ids[r] (device memory; the
// options and ids are copied from host memory) of [slices, logit_rows, vocab / slices]; sorts
// up to kSampleRowsPerSort rows at a time through `workspace`.
struct DrawOptions {
  float temperature;
  int32_t top_k;
  float top_p, min_p;
  float u;  // the draw's uniform number, uniform01(seed, step)
};
struct SampleRowsParams {
  const float* logits;         // [slices, logit_rows, vocab / slices]
  const int32_t* row_ids;      // [rows] (host memory)
  const DrawOptions* options;  // [rows] (host memory)
  int32_t* tokens;             // [rows]
  int64_t rows, vocab, logit_rows, slices;
};
constexpr int64_t kSampleRowsPerSort = 16;
int64_t sample_rows_workspace_bytes(int64_t rows, int64_t vocab);
void launch_sample_rows(const SampleRowsParams& p, void* workspace, cudaStream_t stream);

}  // namespace moeserve::cuda
