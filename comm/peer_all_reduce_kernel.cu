// The peer all-reduce kernel (peer_all_reduce.h describes the protocol).
#include "comm/peer_all_reduce_kernel.h"
#include "cuda_common/common.cuh"
#include "cuda_common/row_norm.cuh"

namespace moeserve::comm::peer {

namespace {

using cuda::bf16;

__device__ __forceinline__ void store_release_system(uint32_t* flag, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_system(const uint32_t* flag) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

// Adds 16 bytes of `part` (8 bf16 or 4 fp32) into the fp32 accumulators.
__device__ __forceinline__ void accumulate(float (&acc)[8], uint4 part, bool bf16_values, bool first) {
  if (bf16_values) {
    const bf16* v = reinterpret_cast<const bf16*>(&part);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = first ? cuda::to_f(v[i]) : acc[i] + cuda::to_f(v[i]);
  } else {
    const float* v = reinterpret_cast<const float*>(&part);
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = first ? v[i] : acc[i] + v[i];
  }
}

__device__ __forceinline__ uint4 pack(const float (&acc)[8], bool bf16_values) {
  uint4 out;
  if (bf16_values) {
    bf16* v = reinterpret_cast<bf16*>(&out);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = cuda::to_bf(acc[i]);
  } else {
    float* v = reinterpret_cast<float*>(&out);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = acc[i];
  }
  return out;
}

// After the block's pushes: 2. raise its flag at every peer; 3. wait for every peer's flag of
// the same block in this rank's memory. A peer may already be one call ahead (it has seen this
// rank's flag of this call). Block-wide barriers on both sides (the release is cumulative over
// the block's stores; the acquire covers the block's loads after it).
__device__ __forceinline__ void exchange_flags(const Args& a, int block, uint32_t call) {
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < a.size && peer != a.rank) {
    store_release_system(a.flags[peer] + a.rank * kMaxBlocks + block, call);
    const uint32_t* mine = a.flags[a.rank] + peer * kMaxBlocks + block;
    while (static_cast<int32_t>(load_acquire_system(mine) - call) < 0) {
    }
  }
  __syncthreads();
}

// This block's call number (its counter + 1), read after pdl_enter().
__device__ __forceinline__ uint32_t next_call(const Args& a, int block) {
  __shared__ uint32_t call_shared;
  if (threadIdx.x == 0) call_shared = a.calls[block] + 1;
  __syncthreads();
  return call_shared;
}

__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(Args a) {
  cuda::pdl_enter();  // the message is the previous kernel's output
  const int block = blockIdx.x;
  const uint32_t call = next_call(a, block);
  const size_t half = static_cast<size_t>(call & 1) * a.size * kMaxBytes;
  // 1. This block's chunks into every peer's receive buffer (slot a.rank of the half).
  for (int64_t offset = block * kChunkBytes + threadIdx.x * 16; offset < a.bytes; offset += gridDim.x * kChunkBytes) {
    const uint4 v = *reinterpret_cast<const uint4*>(a.data + offset);
    for (int peer = 0; peer < a.size; ++peer)
      if (peer != a.rank) *reinterpret_cast<uint4*>(a.receive[peer] + half + a.rank * kMaxBytes + offset) = v;
  }
  exchange_flags(a, block, call);
  // 4. Rank-order sum of the chunks; the received ones bypass L1 (written by another GPU).
  const char* received = a.receive[a.rank] + half;
  for (int64_t offset = block * kChunkBytes + threadIdx.x * 16; offset < a.bytes; offset += gridDim.x * kChunkBytes) {
    float acc[8];
    for (int r = 0; r < a.size; ++r) {
      const uint4 part = r == a.rank ? *reinterpret_cast<const uint4*>(a.data + offset)
                                     : __ldcg(reinterpret_cast<const uint4*>(received + r * kMaxBytes + offset));
      accumulate(acc, part, a.bf16, r == 0);
    }
    *reinterpret_cast<uint4*>(a.data + offset) = pack(acc, a.bf16);
  }
  if (threadIdx.x == 0) a.calls[block] = call;
}

static_assert(cuda::kRowThreads * 8 * cuda::kRowChunks == kMaxRowElements);

// One block per row of the fp32 branch: steps 1-4 above for the row (chunks of 8 values per
// thread, row_norm.cuh's layout), then the residual add and RMSNorm on the sum in registers.
__global__ void __launch_bounds__(cuda::kRowThreads) peer_all_reduce_norm_kernel(Args a) {
  using cuda::Chunk;
  using cuda::kRowChunks;
  __shared__ float scratch[32];
  Chunk w[kRowChunks];
  cuda::load_row_weight(static_cast<const bf16*>(a.weight), a.dim, w);  // before the wait: not an output
  cuda::pdl_enter();
  const int row = blockIdx.x;
  const uint32_t call = next_call(a, row);
  const size_t half = static_cast<size_t>(call & 1) * a.size * kMaxBytes;
  float* branch = reinterpret_cast<float*>(a.data) + row * a.dim;
  const int64_t row_bytes = row * a.dim * 4;
  uint4 own[kRowChunks][2];
#pragma unroll
  for (int c = 0; c < kRowChunks; ++c) {
    const int64_t i = cuda::row_chunk_offset(c);
    if (i >= a.dim) break;
    own[c][0] = *reinterpret_cast<const uint4*>(branch + i);
    own[c][1] = *reinterpret_cast<const uint4*>(branch + i + 4);
    for (int peer = 0; peer < a.size; ++peer) {
      if (peer == a.rank) continue;
      uint4* slot = reinterpret_cast<uint4*>(a.receive[peer] + half + a.rank * kMaxBytes + row_bytes + i * 4);
      slot[0] = own[c][0];
      slot[1] = own[c][1];
    }
  }
  exchange_flags(a, row, call);
  const char* received = a.receive[a.rank] + half + row_bytes;
  Chunk sum[kRowChunks];
#pragma unroll
  for (int c = 0; c < kRowChunks; ++c) {
    const int64_t i = cuda::row_chunk_offset(c);
    if (i >= a.dim) break;
    float acc[8];
    for (int r = 0; r < a.size; ++r) {  // rank order, as the chunked kernel
      const uint4* part = reinterpret_cast<const uint4*>(received + r * kMaxBytes + i * 4);
      const uint4 halves[2] = {r == a.rank ? own[c][0] : __ldcg(part), r == a.rank ? own[c][1] : __ldcg(part + 1)};
      const float* v = reinterpret_cast<const float*>(halves);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] = r == 0 ? v[q] : acc[q] + v[q];
    }
    reinterpret_cast<float4*>(branch + i)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    reinterpret_cast<float4*>(branch + i)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    sum[c] = cuda::rounded_chunk(acc);
  }
  cuda::add_rms_norm_row(sum, w, static_cast<bf16*>(a.hidden) + row * a.dim, static_cast<bf16*>(a.normed) + row * a.dim,
                         a.dim, a.eps, scratch);
  if (threadIdx.x == 0) a.calls[row] = call;
}

}  // namespace

void launch_add_rms_norm(const Args& args, cudaStream_t stream) {
  cuda::launch_pdl(peer_all_reduce_norm_kernel, dim3(static_cast<unsigned>(args.rows)), dim3(cuda::kRowThreads), 0,
                   stream, args);
}

void launch(const Args& args, cudaStream_t stream) {
  const int64_t chunks = (args.bytes + kChunkBytes - 1) / kChunkBytes;
  const unsigned blocks = static_cast<unsigned>(chunks < kMaxBlocks ? chunks : kMaxBlocks);
  cuda::launch_pdl(peer_all_reduce_kernel, dim3(blocks), dim3(kThreads), 0, stream, args);
}

}  // namespace moeserve::comm::peer
