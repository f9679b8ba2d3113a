// Row-wise and elementwise kernels. bf16 storage, fp32 arithmetic.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/kernels.h"
#include "core/random.h"
#include "cuda_common/common.cuh"
#include "cuda_common/row_norm.cuh"

namespace moeserve::cuda {

namespace {

// Rows of 8-element (16-byte) chunks when `vec` (width % 8 == 0, aligned pointers): a
// decode-sized copy then waits on memory once per thread instead of once per element.
__global__ void embedding_kernel(const int32_t* ids, const bf16* table, bf16* out, int64_t hidden, int64_t vocab_begin,
                                 int64_t vocab_end, bool vec) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int64_t id = ids[t];
  bf16* row = out + t * hidden;
  const bool owned = id >= vocab_begin && id < vocab_end;
  const bf16* src = table + (id - vocab_begin) * hidden;
  if (vec) {
    for (int64_t c = threadIdx.x; c < hidden / 8; c += blockDim.x)
      reinterpret_cast<uint4*>(row)[c] = owned ? reinterpret_cast<const uint4*>(src)[c] : make_uint4(0, 0, 0, 0);
    return;
  }
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) row[i] = owned ? src[i] : to_bf(0.0f);
}

// One block per row. In place (x == y) is safe: the row is reduced before any write.
__global__ void rms_norm_kernel(const bf16* x, const bf16* weight, bf16* y, int64_t dim, int64_t x_stride,
                                int64_t y_stride, float eps) {
  pdl_enter();
  __shared__ float scratch[32];
  const bf16* xr = x + blockIdx.x * x_stride;
  bf16* yr = y + blockIdx.x * y_stride;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = to_f(xr[i]);
    sum_sq += v * v;
  }
  const float inv = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(dim) + eps);
  // transformers: weight * (x * rsqrt(...)).to(bf16)
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    yr[i] = to_bf(to_f(weight[i]) * to_f(to_bf(to_f(xr[i]) * inv)));
}

// The same two row kernels for rows that fit in registers (row_norm.cuh).
// residual (add_rms_norm) or nullptr (rms_norm): with a residual, x_row is the branch and the
// bf16-rounded sum is written back to `residual` and normalised.
struct RowNormArgs {
  const bf16* x;       // [rows, x_stride] bf16 input or branch, or null when x_f32 is set
  const float* x_f32;  // [rows, dim] fp32 branch, or null
  bf16* residual;      // [rows, dim], or null (rms_norm)
  const bf16* weight;  // [dim]
  bf16* y;             // [rows, y_stride]
  int64_t dim, x_stride, y_stride;
  float eps;
};

__global__ void __launch_bounds__(kRowThreads) row_norm_vec_kernel(const RowNormArgs args) {
  const bf16* const x = args.x;
  const float* const x_f32 = args.x_f32;
  bf16* const residual = args.residual;
  const bf16* const weight = args.weight;
  bf16* const y = args.y;
  const int64_t dim = args.dim, x_stride = args.x_stride, y_stride = args.y_stride;
  const float eps = args.eps;
  __shared__ float scratch[32];
  Chunk w[kRowChunks];
  load_row_weight(weight, dim, w);  // does not depend on the previous kernel
  pdl_enter();
  Chunk v[kRowChunks];
  if (residual == nullptr) {
#pragma unroll
    for (int c = 0; c < kRowChunks; ++c)
      if (row_chunk_offset(c) < dim) v[c] = load_bf16x8(x + blockIdx.x * x_stride + row_chunk_offset(c));
    rms_norm_row(v, w, y + blockIdx.x * y_stride, dim, eps, scratch);
    return;
  }
#pragma unroll
  for (int c = 0; c < kRowChunks; ++c) {
    if (row_chunk_offset(c) >= dim) break;
    const int64_t i = blockIdx.x * dim + row_chunk_offset(c);
    v[c] = x_f32 != nullptr ? rounded_f32x8(x_f32 + i) : load_bf16x8(x + i);
  }
  add_rms_norm_row(v, w, residual + blockIdx.x * dim, y + blockIdx.x * y_stride, dim, eps, scratch);
}

bool row_fits_registers(int64_t dim, std::initializer_list<const void*> pointers,
                        std::initializer_list<int64_t> strides) {
  if (dim % 8 != 0 || dim > static_cast<int64_t>(kRowThreads) * 8 * kRowChunks) return false;
  if (!aligned16(pointers)) return false;
  for (int64_t s : strides)
    if (s % 8 != 0) return false;
  return true;
}

__global__ void add_kernel(bf16* acc, const void* x, bool x_f32, int64_t count) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  // An fp32 branch is rounded to bf16 first, as a bf16 branch would have been.
  const float xv = x_f32 ? to_f(to_bf(static_cast<const float*>(x)[i])) : to_f(static_cast<const bf16*>(x)[i]);
  acc[i] = to_bf(to_f(acc[i]) + xv);
}

__global__ void add_f32_kernel(float* acc, const float* x, int64_t count) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) acc[i] += x[i];
}

// One block per row: the residual add (rounded to bf16, as add_kernel), the row's sum of
// squares from the rounded values, then the norm (as rms_norm_kernel). Each thread re-reads
// only the elements it wrote.
__global__ void add_rms_norm_kernel(bf16* hidden, const void* x, bool x_f32, const bf16* weight, bf16* normed,
                                    int64_t dim, float eps) {
  pdl_enter();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x * dim;
  bf16* h = hidden + row;
  bf16* y = normed + row;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float xv =
        x_f32 ? to_f(to_bf(static_cast<const float*>(x)[row + i])) : to_f(static_cast<const bf16*>(x)[row + i]);
    const bf16 sum = to_bf(to_f(h[i]) + xv);
    h[i] = sum;
    const float v = to_f(sum);
    sum_sq += v * v;
  }
  const float inv = rsqrtf(block_sum(sum_sq, scratch) / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) y[i] = to_bf(to_f(weight[i]) * to_f(to_bf(to_f(h[i]) * inv)));
}

__global__ void rope_kernel(const ops::RopeParams p) {
  bf16* const x = static_cast<bf16*>(p.x);
  const int32_t* const positions = p.positions;
  const float* const inv_freq = p.inv_freq;
  const int64_t heads = p.heads, token_stride = p.token_stride, head_stride = p.head_stride, rope_dim = p.rope_dim;
  const float attention_factor = p.attention_factor;
  const bool interleaved = p.interleaved;
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int64_t half = rope_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int64_t h = idx / half, i = idx % half;
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    c *= attention_factor;
    s *= attention_factor;
    bf16* v = x + t * token_stride + h * head_stride;
    const int64_t a = interleaved ? 2 * i : i;
    const int64_t b = interleaved ? 2 * i + 1 : i + half;
    const float x1 = to_f(v[a]), x2 = to_f(v[b]);
    v[a] = to_bf(x1 * c - x2 * s);
    v[b] = to_bf(x2 * c + x1 * s);
  }
}

__global__ void silu_mul_kernel(const bf16* gate_up, bf16* out, int64_t tokens, int64_t inter) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * inter) return;
  const int64_t t = i / inter, n = i % inter;
  const float g = to_f(gate_up[t * 2 * inter + n]);
  const float u = to_f(gate_up[t * 2 * inter + inter + n]);
  // transformers (bf16): act_fn(gate) rounds to bf16 before the product.
  out[i] = to_bf(to_f(to_bf(g / (1.0f + __expf(-g)))) * u);
}

__global__ void copy_rows_kernel(const bf16* src, const int32_t* src_rows, const int32_t* dst_rows, bf16* dst,
                                 int64_t width, bool vec) {
  pdl_enter();
  const int64_t r = blockIdx.x;
  const int64_t s = src_rows ? src_rows[r] : r;
  const int64_t d = dst_rows ? dst_rows[r] : r;
  if (vec) {
    const uint4* from = reinterpret_cast<const uint4*>(src + s * width);
    uint4* to = reinterpret_cast<uint4*>(dst + d * width);
    for (int64_t c = threadIdx.x; c < width / 8; c += blockDim.x) to[c] = from[c];
    return;
  }
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[d * width + i] = src[s * width + i];
}

bool rows_of_chunks(int64_t width, const void* a, const void* b) { return width % 8 == 0 && aligned16({a, b}); }

__global__ void row_combine_kernel(const bf16* src, const int32_t* offsets, const int32_t* src_rows,
                                   const float* weights, void* out, bool out_f32, int64_t width, bool accumulate) {
  pdl_enter();
  const int64_t r = blockIdx.x;
  auto* out32 = static_cast<float*>(out);
  auto* out16 = static_cast<bf16*>(out);
  for (int64_t n = threadIdx.x; n < width; n += blockDim.x) {
    const int64_t o = r * width + n;
    float sum = accumulate ? (out_f32 ? out32[o] : to_f(out16[o])) : 0.0f;
    for (int32_t i = offsets[r]; i < offsets[r + 1]; ++i)
      sum += weights[i] * to_f(src[static_cast<int64_t>(src_rows[i]) * width + n]);
    if (out_f32) {
      out32[o] = sum;
    } else {
      out16[o] = to_bf(sum);
    }
  }
}

__global__ void fill_uniform_kernel(const ops::FillUniformParams p) {
  void* const out = p.out;
  const bool out_f32 = p.out_f32;
  const int64_t rows = p.rows, cols = p.cols, full_cols = p.full_cols, row0 = p.row0, col0 = p.col0;
  const uint64_t seed = p.seed;
  const float offset = p.offset, amplitude = p.amplitude;
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  // Explicit rounding (no FMA contraction) so that values equal the host generator bit for bit.
  const float v = __fadd_rn(
      offset, __fmul_rn(amplitude, uniform_pm1(seed, static_cast<uint64_t>((row0 + r) * full_cols + col0 + c))));
  if (out_f32) {
    static_cast<float*>(out)[i] = v;
  } else {  // bf16: the backend's dtype, and out_bf16's
    static_cast<bf16*>(out)[i] = to_bf(v);
  }
}

__global__ void fill_random_words_kernel(const ops::FillRandomWordsParams p) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.rows * p.words) return;
  const int64_t r = i / p.words, w = i % p.words;
  p.out[i] = random_word(p.seed, static_cast<uint64_t>(p.word0 + r * p.index_stride + w)) & p.mask;
}

__global__ void round_to_bf16_kernel(float* x, int64_t count) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) x[i] = to_f(to_bf(x[i]));
}

// Threads of the row kernels that loop over a row.
int row_loop_threads(int64_t dim) { return dim >= 1024 ? 512 : (dim >= 256 ? 256 : 64); }

}  // namespace

void launch_embedding(const ops::EmbeddingParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  launch_pdl(embedding_kernel, p.tokens, 256, 0, stream, p.ids, static_cast<const bf16*>(p.table),
             static_cast<bf16*>(p.out), p.hidden, p.vocab_begin, p.vocab_end, rows_of_chunks(p.hidden, p.table, p.out));
}

void launch_rms_norm(const ops::RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  if (row_fits_registers(p.dim, {p.x, p.weight, p.y}, {p.x_stride, p.y_stride})) {
    launch_pdl(row_norm_vec_kernel, p.rows, kRowThreads, 0, stream,
               RowNormArgs{.x = static_cast<const bf16*>(p.x),
                           .x_f32 = nullptr,
                           .residual = nullptr,
                           .weight = static_cast<const bf16*>(p.weight),
                           .y = static_cast<bf16*>(p.y),
                           .dim = p.dim,
                           .x_stride = p.x_stride,
                           .y_stride = p.y_stride,
                           .eps = p.eps});
    return;
  }
  launch_pdl(rms_norm_kernel, p.rows, row_loop_threads(p.dim), 0, stream, static_cast<const bf16*>(p.x),
             static_cast<const bf16*>(p.weight), static_cast<bf16*>(p.y), p.dim, p.x_stride, p.y_stride, p.eps);
}

void launch_add(const ops::AddParams& p, cudaStream_t stream) {
  if (p.count == 0) return;
  if (p.acc_f32) {
    launch_pdl(add_f32_kernel, blocks_for(p.count, 256), 256, 0, stream, static_cast<float*>(p.acc),
               static_cast<const float*>(p.x), p.count);
    return;
  }
  launch_pdl(add_kernel, blocks_for(p.count, 256), 256, 0, stream, static_cast<bf16*>(p.acc), p.x, p.x_f32, p.count);
}

void launch_add_rms_norm(const ops::AddRmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  if (row_fits_registers(p.dim, {p.hidden, p.x, p.weight, p.normed}, {})) {
    launch_pdl(row_norm_vec_kernel, p.rows, kRowThreads, 0, stream,
               RowNormArgs{.x = p.x_f32 ? nullptr : static_cast<const bf16*>(p.x),
                           .x_f32 = p.x_f32 ? static_cast<const float*>(p.x) : nullptr,
                           .residual = static_cast<bf16*>(p.hidden),
                           .weight = static_cast<const bf16*>(p.weight),
                           .y = static_cast<bf16*>(p.normed),
                           .dim = p.dim,
                           .x_stride = p.dim,
                           .y_stride = p.dim,
                           .eps = p.eps});
    return;
  }
  launch_pdl(add_rms_norm_kernel, p.rows, row_loop_threads(p.dim), 0, stream, static_cast<bf16*>(p.hidden), p.x,
             p.x_f32, static_cast<const bf16*>(p.weight), static_cast<bf16*>(p.normed), p.dim, p.eps);
}

void launch_rope(const ops::RopeParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  // One (head, pair) per thread where possible: each pass of the loop waits on its loads.
  const int threads = static_cast<int>(std::min<int64_t>(1024, (p.heads * (p.rope_dim / 2) + 31) / 32 * 32));
  launch_pdl(rope_kernel, p.tokens, std::max(threads, 32), 0, stream, p);
}

void launch_silu_mul(const ops::SiluMulParams& p, cudaStream_t stream) {
  if (p.tokens * p.inter == 0) return;
  launch_pdl(silu_mul_kernel, blocks_for(p.tokens * p.inter, 256), 256, 0, stream, static_cast<const bf16*>(p.gate_up),
             static_cast<bf16*>(p.out), p.tokens, p.inter);
}

void launch_kv_write(const ops::KvWriteParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  launch_pdl(copy_rows_kernel, p.tokens, 128, 0, stream, static_cast<const bf16*>(p.entries), nullptr, p.slots,
             static_cast<bf16*>(p.cache), p.width, rows_of_chunks(p.width, p.entries, p.cache));
}

void launch_gather_rows(const ops::GatherRowsParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return;
  launch_pdl(copy_rows_kernel, p.num_rows, 128, 0, stream, static_cast<const bf16*>(p.src), p.rows, nullptr,
             static_cast<bf16*>(p.dst), p.width, rows_of_chunks(p.width, p.src, p.dst));
}

void launch_row_combine(const ops::RowCombineParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  launch_pdl(row_combine_kernel, p.rows, 256, 0, stream, static_cast<const bf16*>(p.src), p.offsets, p.src_rows,
             p.weights, p.out, p.out_f32, p.width, p.accumulate);
}

void launch_fill_uniform(const ops::FillUniformParams& p, cudaStream_t stream) {
  if (p.rows * p.cols == 0) return;
  launch_pdl(fill_uniform_kernel, blocks_for(p.rows * p.cols, 256), 256, 0, stream, p);
}

void launch_fill_random_words(const ops::FillRandomWordsParams& p, cudaStream_t stream) {
  if (p.rows * p.words == 0) return;
  launch_pdl(fill_random_words_kernel, blocks_for(p.rows * p.words, 256), 256, 0, stream, p);
}

void launch_round_to_bf16(float* x, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  launch_pdl(round_to_bf16_kernel, blocks_for(count, 256), 256, 0, stream, x, count);
}

}  // namespace moeserve::cuda
