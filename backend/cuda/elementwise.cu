// Row-wise and elementwise kernels. bf16 storage, fp32 arithmetic.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/row_norm.cuh"
#include "core/random.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>

namespace moeserve::cuda {

namespace {

// Rows of 8-element (16-byte) chunks when `vec` (width % 8 == 0, aligned pointers): a
// decode-sized copy then waits on memory once per thread instead of once per element.
__global__ void embedding_kernel(const int32_t* ids, const bf16* table, bf16* out, int64_t hidden,
                                 int64_t vocab_begin, int64_t vocab_end, bool vec) {
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
__global__ void __launch_bounds__(kRowThreads)
row_norm_vec_kernel(const bf16* x, const float* x_f32, bf16* residual, const bf16* weight, bf16* y, int64_t dim,
                    int64_t x_stride, int64_t y_stride, float eps) {
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

bool row_fits_registers(int64_t dim, std::initializer_list<const void*> pointers, std::initializer_list<int64_t> strides) {
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

__global__ void rope_kernel(bf16* x, const int32_t* positions, const float* inv_freq, int64_t heads,
                            int64_t token_stride, int64_t head_stride, int64_t rope_dim, float attention_factor,
                            bool interleaved) {
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

bool rows_of_chunks(int64_t width, const void* a, const void* b) {
  return width % 8 == 0 && aligned16({a, b});
}

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

__global__ void fill_uniform_kernel(void* out, bool out_f32, int64_t rows, int64_t cols, int64_t full_cols,
                                    int64_t row0, int64_t col0, uint64_t seed, float offset, float amplitude) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  // Explicit rounding (no FMA contraction) so that values equal the host generator bit for bit.
  const float v =
      __fadd_rn(offset, __fmul_rn(amplitude, uniform_pm1(seed, static_cast<uint64_t>((row0 + r) * full_cols + col0 + c))));
  if (out_f32) {
    static_cast<float*>(out)[i] = v;
  } else {
    static_cast<bf16*>(out)[i] = to_bf(v);
  }
}

__global__ void f32_to_bf16_kernel(const float* src, bf16* dst, int64_t count) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) dst[i] = to_bf(src[i]);
}

__global__ void bf16_to_f32_kernel(const bf16* src, float* dst, int64_t count) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) dst[i] = to_f(src[i]);
}

__global__ void round_to_bf16_kernel(float* x, int64_t count) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) x[i] = to_f(to_bf(x[i]));
}

}  // namespace

void launch_embedding(const int32_t* ids, const void* table, void* out, int64_t tokens, int64_t hidden,
                      int64_t vocab_begin, int64_t vocab_end, cudaStream_t stream) {
  if (tokens == 0) return;
  launch_pdl(embedding_kernel, tokens, 256, 0, stream, ids, static_cast<const bf16*>(table), static_cast<bf16*>(out),
             hidden, vocab_begin, vocab_end, rows_of_chunks(hidden, table, out));
}

void launch_rms_norm(const void* x, const void* weight, void* y, int64_t rows, int64_t dim, int64_t x_stride,
                     int64_t y_stride, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  if (row_fits_registers(dim, {x, weight, y}, {x_stride, y_stride})) {
    launch_pdl(row_norm_vec_kernel, rows, kRowThreads, 0, stream, static_cast<const bf16*>(x), nullptr, nullptr,
               static_cast<const bf16*>(weight), static_cast<bf16*>(y), dim, x_stride, y_stride, eps);
    return;
  }
  const int threads = dim >= 1024 ? 512 : (dim >= 256 ? 256 : 64);
  launch_pdl(rms_norm_kernel, rows, threads, 0, stream, static_cast<const bf16*>(x), static_cast<const bf16*>(weight),
             static_cast<bf16*>(y), dim, x_stride, y_stride, eps);
}

void launch_add(void* acc, const void* x, bool x_f32, bool acc_f32, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  if (acc_f32) {
    launch_pdl(add_f32_kernel, blocks_for(count, 256), 256, 0, stream, static_cast<float*>(acc),
               static_cast<const float*>(x), count);
    return;
  }
  launch_pdl(add_kernel, blocks_for(count, 256), 256, 0, stream, static_cast<bf16*>(acc), x, x_f32, count);
}

void launch_add_rms_norm(void* hidden, const void* x, bool x_f32, const void* weight, void* normed, int64_t rows,
                         int64_t dim, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  if (row_fits_registers(dim, {hidden, x, weight, normed}, {})) {
    launch_pdl(row_norm_vec_kernel, rows, kRowThreads, 0, stream, x_f32 ? nullptr : static_cast<const bf16*>(x),
               x_f32 ? static_cast<const float*>(x) : nullptr, static_cast<bf16*>(hidden),
               static_cast<const bf16*>(weight), static_cast<bf16*>(normed), dim, dim, dim, eps);
    return;
  }
  const int threads = dim >= 1024 ? 512 : (dim >= 256 ? 256 : 64);
  launch_pdl(add_rms_norm_kernel, rows, threads, 0, stream, static_cast<bf16*>(hidden), x, x_f32,
             static_cast<const bf16*>(weight), static_cast<bf16*>(normed), dim, eps);
}

void launch_rope(void* x, const int32_t* positions, const float* inv_freq, int64_t tokens, int64_t heads,
                 int64_t token_stride, int64_t head_stride, int64_t rope_dim, float attention_factor, bool interleaved,
                 cudaStream_t stream) {
  if (tokens == 0) return;
  // One (head, pair) per thread where possible: each pass of the loop waits on its loads.
  const int threads = static_cast<int>(std::min<int64_t>(1024, (heads * (rope_dim / 2) + 31) / 32 * 32));
  launch_pdl(rope_kernel, tokens, std::max(threads, 32), 0, stream, static_cast<bf16*>(x), positions, inv_freq, heads,
             token_stride, head_stride, rope_dim, attention_factor, interleaved);
}

void launch_silu_mul(const void* gate_up, void* out, int64_t tokens, int64_t inter, cudaStream_t stream) {
  if (tokens * inter == 0) return;
  launch_pdl(silu_mul_kernel, blocks_for(tokens * inter, 256), 256, 0, stream, static_cast<const bf16*>(gate_up),
             static_cast<bf16*>(out), tokens, inter);
}

void launch_kv_write(const void* entries, const int32_t* slots, void* cache, int64_t tokens, int64_t width,
                     cudaStream_t stream) {
  if (tokens == 0) return;
  launch_pdl(copy_rows_kernel, tokens, 128, 0, stream, static_cast<const bf16*>(entries), nullptr, slots,
             static_cast<bf16*>(cache), width, rows_of_chunks(width, entries, cache));
}

void launch_gather_rows(const void* src, const int32_t* rows, void* dst, int64_t num_rows, int64_t width,
                        cudaStream_t stream) {
  if (num_rows == 0) return;
  launch_pdl(copy_rows_kernel, num_rows, 128, 0, stream, static_cast<const bf16*>(src), rows, nullptr,
             static_cast<bf16*>(dst), width, rows_of_chunks(width, src, dst));
}

void launch_row_combine(const void* src, const int32_t* offsets, const int32_t* src_rows, const float* weights,
                        void* out, bool out_f32, int64_t rows, int64_t width, bool accumulate, cudaStream_t stream) {
  if (rows == 0) return;
  launch_pdl(row_combine_kernel, rows, 256, 0, stream, static_cast<const bf16*>(src), offsets, src_rows, weights, out,
             out_f32, width, accumulate);
}

void launch_fill_uniform(void* out, bool out_f32, int64_t rows, int64_t cols, int64_t full_cols, int64_t row0,
                         int64_t col0, uint64_t stream_seed, float offset, float amplitude, cudaStream_t stream) {
  if (rows * cols == 0) return;
  launch_pdl(fill_uniform_kernel, blocks_for(rows * cols, 256), 256, 0, stream, out, out_f32, rows, cols, full_cols,
             row0, col0, stream_seed, offset, amplitude);
}

void launch_f32_to_bf16(const float* src, void* dst, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  launch_pdl(f32_to_bf16_kernel, blocks_for(count, 256), 256, 0, stream, src, static_cast<bf16*>(dst), count);
}

void launch_bf16_to_f32(const void* src, float* dst, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  launch_pdl(bf16_to_f32_kernel, blocks_for(count, 256), 256, 0, stream, static_cast<const bf16*>(src), dst, count);
}

void launch_round_to_bf16(float* x, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  launch_pdl(round_to_bf16_kernel, blocks_for(count, 256), 256, 0, stream, x, count);
}

}  // namespace moeserve::cuda
