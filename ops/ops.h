// The backend-neutral op interface. The model forward (model/deepseek_v3.cc) is written once
// against this interface; backend/cpu is the fp32 reference and the oracle for every other
// backend. Ops take raw pointers and sizes in one Params struct each: no framework types, no
// hidden allocation. Activations and weights are in the backend's `activation_dtype()`
// (fp32 on CPU, bf16 on CUDA); pointers typed `float*` / `int32_t*` are always that type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/quant_layout.h"
#include "step/logit_adjust.h"      // LogitAdjustEntry
#include "step/sampling_options.h"  // SamplingOptions

namespace moeserve::ops {

// Memory owned by a backend (host memory for CPU, device memory for CUDA).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t nbytes() const = 0;
};
using BufferPtr = std::unique_ptr<Buffer>;

// out[t, :] = table[ids[t] - vocab_begin, :] when ids[t] is in [vocab_begin, vocab_end),
// else zeros (vocab-parallel embedding: the partial rows are summed across ranks).
struct EmbeddingParams {
  const int32_t* ids;  // [tokens]
  const void* table;   // [vocab_end - vocab_begin, hidden]
  void* out;           // [tokens, hidden]
  int64_t tokens, hidden, vocab_begin, vocab_end;
};

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight. Rows may be strided.
struct RmsNormParams {
  const void* x;       // [rows, x_stride] (first `dim` used)
  const void* weight;  // [dim]
  void* y;             // [rows, y_stride]
  int64_t rows, dim, x_stride, y_stride;
  float eps;
};

// acc[i] += x[i]; with x_f32, x is fp32 and is rounded to the activation dtype first (the
// residual add of a branch that was summed across ranks in fp32). With acc_f32, acc and x are
// both fp32 and the sum stays fp32 (partial sums of a branch added in a fixed order).
struct AddParams {
  void* acc;
  const void* x;
  int64_t count;
  bool x_f32 = false;
  bool acc_f32 = false;
};

// The residual add and the next RMSNorm in one pass (the step between a branch and the next
// branch): hidden[t] += x[t] as AddParams does (an fp32 x is rounded to the activation dtype
// first), then normed[t] = rms_norm(hidden[t]) * weight. Same result as add then rms_norm.
struct AddRmsNormParams {
  void* hidden;        // [rows, dim] residual stream, updated in place
  const void* x;       // [rows, dim] branch output
  const void* weight;  // [dim]
  void* normed;        // [rows, dim]
  int64_t rows, dim;
  float eps;
  bool x_f32 = false;
};

// y[t, n] (+)= sum_k x[t, k] * weight[n, k]   (x @ weight^T, torch's F.linear)
// Accumulation is into fp32 outputs only (y_f32): one fp32 addition, the same on every backend
// (cuBLAS's beta = 1 into a bf16 output would round the product before the addition).
struct LinearParams {
  const void* x;       // [rows, x_stride]
  const void* weight;  // [out_features, in_features]
  void* y;             // [rows, y_stride]; fp32 when y_f32
  int64_t rows, in_features, out_features, x_stride, y_stride;
  bool accumulate = false;        // requires y_f32
  bool y_f32 = false;             // logits are produced in fp32 on every backend
  QuantLayout weight_quant = {};  // quantized: weight is packed as ops/quant_layout.h says
};

// In-place rotary embedding of the first `rope_dim` values of each (token, head) vector.
// interleaved: pairs (2i, 2i+1) rotate by angle pos * inv_freq[i] (DeepSeek's layout);
// otherwise pairs (i, i + rope_dim/2). cos/sin are multiplied by `attention_factor` (YaRN).
struct RopeParams {
  void* x;                   // [tokens, heads, head_stride] at token_stride
  const int32_t* positions;  // [tokens]
  const float* inv_freq;     // [rope_dim / 2]
  int64_t tokens, heads, token_stride, head_stride, rope_dim;
  float attention_factor;
  bool interleaved;
};

// out[t, n] = silu(gate_up[t, n]) * gate_up[t, inter + n]
struct SiluMulParams {
  const void* gate_up;  // [tokens, 2 * inter]
  void* out;            // [tokens, inter]
  int64_t tokens, inter;
};

// MLA, absorbed form. kv_b_proj's weight [heads * (nope + v), latent] holds, per head, the
// key up-projection W_uk [nope, latent] then the value up-projection W_uv [v, latent].
// q_latent[t, h, :] = q_nope[t, h, :] @ W_uk[h]
struct MlaQAbsorbParams {
  const void* q;     // [tokens, heads, q_head_stride]; q_nope is the first `nope` values
  const void* kv_b;  // [heads * (nope + v), latent]
  void* q_latent;    // [tokens, heads, latent]
  int64_t tokens, heads, q_head_stride, nope, v, latent;
};
// out[t, h, :] = attn_latent[t, h, :] @ W_uv[h]^T
struct MlaVUpParams {
  const void* attn_latent;  // [tokens, heads, latent]
  const void* kv_b;         // [heads * (nope + v), latent]
  void* out;                // [tokens, heads * v]
  int64_t tokens, heads, nope, v, latent;
};

// Paged MLA latent cache: per layer [num_pages, page_size, latent + rope] where each row is
// the normalised compressed KV followed by the roped shared key.
struct KvWriteParams {
  const void* entries;   // [tokens, latent + rope]
  const int32_t* slots;  // [tokens]: page * page_size + offset
  void* cache;           // [num_pages * page_size, latent + rope]
  int64_t tokens, width;
  // --kv-cache-dtype fp8_e4m3: the cache holds e4m3fn codes of entry / fp8_scale (rounded to
  // nearest even, saturated to +-448; core/dtype.h f32_to_f8_e4m3), one byte each on the GPU.
  bool fp8 = false;
  float fp8_scale = 1.0f;
};

// Causal attention of each query token over its sequence's cached latents [0, position].
// score = scale * (q_latent . c + q_rope . k_rope); out = softmax(score) @ c.
struct MlaAttentionParams {
  const void* q_latent;         // [tokens, heads, latent]
  const void* q_rope;           // [tokens, heads, q_head_stride] at rope_offset
  const void* cache;            // [num_pages * page_size, latent + rope]
  const int32_t* block_tables;  // [num_seqs, max_pages_per_seq]
  const int32_t* seq_of_token;  // [tokens]
  const int32_t* positions;     // [tokens]: the token attends to cache positions 0..pos
  void* out;                    // [tokens, heads, latent]
  int64_t tokens, heads, latent, rope, q_head_stride, rope_offset, page_size, max_pages_per_seq;
  float scale;
  // The cache as KvWriteParams::fp8 wrote it: a row element is its e4m3 code times cache_scale.
  bool cache_fp8 = false;
  float cache_scale = 1.0f;
};

// DeepSeek-V3 router: logits = x @ weight^T in fp32, sigmoid scores, bias for selection only,
// group-limited top-k, optional normalisation, scaling.
struct MoeRouteParams {
  const void* x;        // [tokens, hidden]
  const float* weight;  // [experts, hidden], fp32 on every backend
  const float* bias;    // [experts] e_score_correction_bias
  int32_t* topk_ids;    // [tokens, top_k]
  float* topk_weights;  // [tokens, top_k]
  int64_t tokens, hidden, experts, n_group, topk_group, top_k;
  bool norm_topk_prob;
  float routed_scaling_factor;
};

// out[t, :] (+)= sum over k with expert_begin <= ids[t, k] < expert_end of
//   weights[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = ids[t, k].
// The sum is formed in k order first; accumulating adds it to out in one fp32 addition.
// w13[e - expert_begin] is [2 * inter, hidden] (gate rows then up rows), w2[...] [hidden, inter];
// the pointer tables themselves live in backend memory (uploaded once at load).
struct MoeExpertsParams {
  const void* x;              // [tokens, hidden]
  const int32_t* topk_ids;    // [tokens, top_k]
  const float* topk_weights;  // [tokens, top_k]
  const void* const* w13;     // [expert_end - expert_begin], in backend memory
  const void* const* w2;      // [expert_end - expert_begin], in backend memory
  void* out;                  // [tokens, hidden]; fp32 when out_f32
  int64_t tokens, top_k, hidden, inter, expert_begin, expert_end;
  // Routed experts of the whole model, of which [expert_begin, expert_end) are this rank's; 0
  // when every pair is routed inside the range (expert parallelism's received rows). Lets a
  // backend estimate the rows per local expert before the routing is known on the host.
  int64_t routed_experts = 0;
  bool accumulate = false;
  bool out_f32 = false;
  // w13 / w2 again in host memory, for backends that launch per-expert work from the host
  // (null when not available).
  const void* const* w13_host = nullptr;
  const void* const* w2_host = nullptr;
  QuantLayout expert_quant = {};  // quantized: every w13 / w2 is packed as ops/quant_layout.h says
};

// out[r, i] = random_word(seed, word0 + r * index_stride + i) & mask (core/random.h) for r in
// [0, rows), i in [0, words): random bits where they live, bit-identical on every backend.
// Synthetic packed weights: int4 (mask ~0: every nibble uniform in [0, 15]) and fp8 e4m3 (a mask
// that clears each byte's top exponent bit keeps every value finite, |v| <= 1.875); a column
// slice of a [N, K] weight is rows of `words` at a stride of the full row's words.
struct FillRandomWordsParams {
  uint32_t* out;  // [rows, words]
  int64_t words, word0;
  uint64_t seed;
  int64_t rows = 1, index_stride = 0;
  uint32_t mask = 0xffffffffu;
};

// out[r, c] = offset + amplitude * uniform_pm1(seed, (row0 + r) * full_cols + col0 + c), in
// the backend's weight dtype (fp32 when out_f32): synthetic weights generated where they
// live, bit-identical to SyntheticWeightSource::read on the host.
struct FillUniformParams {
  void* out;  // [rows, cols]
  int64_t rows, cols, full_cols, row0, col0;
  uint64_t seed;
  float offset, amplitude;
  bool out_f32 = false;
  bool out_bf16 = false;  // bf16 whatever the backend's dtype (the scales of int4 weights)
};

// dst[r, :] = src[rows[r], :]   (rows in backend memory)
struct GatherRowsParams {
  const void* src;      // [*, width]
  const int32_t* rows;  // [num_rows]
  void* dst;            // [num_rows, width]
  int64_t num_rows, width;
};

// out[r, :] (+)= sum over i in [offsets[r], offsets[r + 1]) of weights[i] * src[src_rows[i], :],
// summed in i order in fp32: a deterministic weighted scatter (the combine step of expert
// dispatch). Rows with an empty range get 0 (or keep their value when accumulating).
struct RowCombineParams {
  const void* src;          // [*, width]
  const int32_t* offsets;   // [rows + 1]
  const int32_t* src_rows;  // [offsets[rows]]
  const float* weights;     // [offsets[rows]]
  void* out;                // [rows, width]; fp32 when out_f32
  int64_t rows, width;
  bool accumulate = false;
  bool out_f32 = false;
};

// Greedy decoding without moving logits: per row, the largest logit and its id (+ id_offset,
// the first id of a vocab slice); ties go to the smallest id, as cpu::sample_row's argmax.
struct ArgmaxRowsParams {
  const float* logits;  // [rows, vocab]
  float* values;        // [rows]
  int32_t* ids;         // [rows]
  int64_t rows, vocab, id_offset;
};

// Sampling without moving logits: per row, the `count` largest logits in descending order
// (ties: the smaller id first; ids + id_offset, the first id of a vocab slice; values[0] is the
// row's maximum), and the softmax normaliser at the row's temperature, sum over the row of
// exp((logit - max) / temperature) in fp64 (1 when the temperature is <= 0). The host merges
// vocab slices and finishes the draw (cpu::sample_candidates). count <= vocab.
struct TopCandidatesParams {
  const float* logits;        // [rows, vocab]
  const float* temperatures;  // [rows], backend memory
  float* values;              // [rows, count]
  int32_t* ids;               // [rows, count]
  double* normaliser;         // [rows]
  int64_t rows, vocab, count, id_offset;
};

// Structured output: a grammar's allowed tokens as a bitmask (bit id % 32 of word id / 32 set:
// allowed, xgrammar's layout) applied to a vocab part's logits in place: a disallowed id's
// logit becomes -inf. Rows whose mask allows every id are left as they are. With a vocab split
// each rank masks its own ids [id_offset, id_offset + vocab).
struct TokenBitmaskParams {
  float* logits;           // [rows, vocab] fp32, this part's slice of each row
  const int32_t* bitmask;  // [rows, words] over the whole vocabulary, backend memory
  int64_t rows, vocab, words, id_offset;
};

// Draws one token per row over its full fp32 logits, exactly as cpu::sample_row does (on a
// device up to the summation order of the fp64 probability sums). Row r reads logit row
// `row_ids[r]` (r when null) of a [slices, logit_rows, vocab / slices] array: a vocabulary split
// over `slices` ranks and gathered slice after slice (slices == 1: plain [logit_rows, vocab]).
struct SampleParams {
  const float* logits;             // [slices, logit_rows, vocab / slices]
  const SamplingOptions* options;  // [rows] (host memory)
  int32_t* tokens;                 // [rows]
  int64_t rows, vocab;
  const int32_t* row_ids = nullptr;  // [rows] (host memory); null: row r reads logit row r
  int64_t slices = 1;
  int64_t logit_rows = -1;  // -1: rows
};
// The logit row that row r reads.
inline int64_t sample_logit_row(const SampleParams& p, int64_t r) { return p.row_ids ? p.row_ids[r] : r; }
// Checks the vocab split and every row id against the logit rows (errors name the row);
// returns the number of logit rows. Every backend's sample() starts with it.
int64_t checked_logit_rows(const SampleParams& p);

// Logit adjustments in place (step/logit_adjust.h: bias, min_tokens masks, penalties), before
// the sampler reduces the logits. Entry e changes logits[part, row, token - vocab_begin] when its
// token is in this rank's parts [vocab_begin, vocab_begin + parts * vocab_part); other ranks of a
// vocab split see the same entries and skip it. The count is read from backend memory, so a
// captured graph replays any number of entries up to `capacity`; entries whose row is not
// below `rows` are skipped.
struct LogitAdjustParams {
  float* logits;                    // [parts, rows, vocab_part] fp32
  const LogitAdjustEntry* entries;  // [capacity], backend memory
  const int32_t* count;             // [1], backend memory: the entries in use (<= capacity)
  int64_t capacity, rows, vocab_part, parts, vocab_begin;
};

// A recorded sequence of ops that can be replayed with the same pointers (a CUDA graph).
class Graph {
 public:
  virtual ~Graph() = default;
};

// A 2-D copy: `rows` rows of `row_bytes` bytes, `src_pitch` / `dst_pitch` bytes apart.
struct CopyRowsParams {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t rows = 0, row_bytes = 0, src_pitch = 0, dst_pitch = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual DType activation_dtype() const = 0;

  virtual BufferPtr alloc(size_t nbytes) = 0;
  // A buffer whose bytes the caller writes in full before anything reads them (a re-plan's
  // copies): backends may skip zeroing it.
  virtual BufferPtr alloc_for_overwrite(size_t nbytes) { return alloc(nbytes); }
  // A buffer over bytes [offset, offset + nbytes) of `src` (a buffer of this backend or of
  // another rank's in the same address space) that keeps them alive after `src` is freed: a
  // re-plan's new shard viewing bytes an old shard holds instead of copying them. Null where
  // the backend cannot alias (device memory of another GPU: the bytes are copied).
  virtual BufferPtr alias(Buffer& /*src*/, size_t /*offset*/, size_t /*nbytes*/) { return nullptr; }
  // `rows` rows of `row_bytes` bytes from src to dst, both in memory of this backend or of
  // another rank's of this process (a re-plan's weight moves: host memory on CPU ranks; device
  // memory on GPUs, a peer GPU's included); complete when it returns.
  virtual void copy_rows(const CopyRowsParams& p) = 0;
  // Copies between host memory and a buffer (offsets in bytes).
  virtual void upload(Buffer& dst, size_t offset, const void* src, size_t nbytes) = 0;
  virtual void download(void* dst, const Buffer& src, size_t offset, size_t nbytes) = 0;
  // Writes an fp32 host tensor, converted to the activation dtype (or kept fp32), into `dst`
  // at byte `offset`.
  virtual void upload_weight_into(Buffer& dst, size_t offset, const Tensor& host_f32, bool keep_f32) = 0;
  // The same into a new buffer of exactly its size.
  BufferPtr upload_weight(const Tensor& host_f32, bool keep_f32 = false) {
    const size_t elem = keep_f32 ? 4 : dtype_size(activation_dtype());
    BufferPtr buffer = alloc(static_cast<size_t>(host_f32.numel()) * elem);
    upload_weight_into(*buffer, 0, host_f32, keep_f32);
    return buffer;
  }
  virtual void synchronize() = 0;

  virtual void embedding(const EmbeddingParams& p) = 0;
  virtual void rms_norm(const RmsNormParams& p) = 0;
  virtual void add(const AddParams& p) = 0;
  // Backends without a fused kernel run the two ops (the CPU reference does).
  virtual void add_rms_norm(const AddRmsNormParams& p) {
    add({p.hidden, p.x, p.rows * p.dim, p.x_f32});
    rms_norm({p.hidden, p.weight, p.normed, p.rows, p.dim, p.dim, p.dim, p.eps});
  }
  virtual void linear(const LinearParams& p) = 0;
  virtual void rope(const RopeParams& p) = 0;
  virtual void silu_mul(const SiluMulParams& p) = 0;
  virtual void mla_q_absorb(const MlaQAbsorbParams& p) = 0;
  virtual void mla_v_up(const MlaVUpParams& p) = 0;
  virtual void kv_write(const KvWriteParams& p) = 0;
  virtual void mla_attention(const MlaAttentionParams& p) = 0;
  virtual void moe_route(const MoeRouteParams& p) = 0;
  virtual void moe_experts(const MoeExpertsParams& p) = 0;
  virtual void sample(const SampleParams& p) = 0;
  virtual void argmax_rows(const ArgmaxRowsParams& p) = 0;
  virtual void top_candidates(const TopCandidatesParams& p) = 0;
  virtual void apply_token_bitmask(const TokenBitmaskParams& p) = 0;
  virtual void logit_adjust(const LogitAdjustParams& p) = 0;
  virtual void fill_uniform(const FillUniformParams& p) = 0;
  virtual void fill_random_words(const FillRandomWordsParams& p) = 0;
  virtual void gather_rows(const GatherRowsParams& p) = 0;
  virtual void row_combine(const RowCombineParams& p) = 0;

  // Overlap inside a step. Ops issued after side_begin() run on a side stream, starting once
  // everything issued before it has run; side_end() sends later ops back to the main stream
  // without waiting; side_join() makes later main-stream ops wait for the side ops issued so
  // far. The side ops must not touch what the main ops between side_begin() and side_join()
  // touch; collectives and host copies stay on the main stream. Backends that run ops in
  // issue order (the CPU reference) ignore all three: the results are the same.
  virtual void side_begin() {}
  virtual void side_end() {}
  virtual void side_join() {}

  // Graph capture: ops issued between begin_capture() and end_capture() are recorded, not
  // run; replay() runs them again. Backends without graphs return nullptr from end_capture.
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture() {}
  virtual std::unique_ptr<Graph> end_capture() { return nullptr; }
  virtual void replay(Graph& graph) {}
};

}  // namespace moeserve::ops
