// The peer all-reduce kernel (peer_all_reduce.h describes the protocol).
#include "backend/cuda/common.cuh"
#include "comm/peer_all_reduce_kernel.h"

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

__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(Args a) {
  __shared__ uint32_t call_shared;
  cuda::pdl_enter();  // the message is the previous kernel's output
  const int block = blockIdx.x;
  if (threadIdx.x == 0) call_shared = a.calls[block] + 1;
  __syncthreads();
  const uint32_t call = call_shared;
  const size_t half = static_cast<size_t>(call & 1) * a.size * kMaxBytes;
  // 1. This block's chunks into every peer's receive buffer (slot a.rank of the half).
  for (int64_t offset = block * kChunkBytes + threadIdx.x * 16; offset < a.bytes; offset += gridDim.x * kChunkBytes) {
    const uint4 v = *reinterpret_cast<const uint4*>(a.data + offset);
    for (int peer = 0; peer < a.size; ++peer)
      if (peer != a.rank)
        *reinterpret_cast<uint4*>(a.receive[peer] + half + a.rank * kMaxBytes + offset) = v;
  }
  __syncthreads();  // every thread's stores before the flags (the release is cumulative)
  const int peer = threadIdx.x;
  if (peer < a.size && peer != a.rank) {
    // 2. Raise this block's flag at the peer; 3. wait for the peer's in this rank's memory. A
    // peer may already be one call ahead (it has seen this rank's flag of this call).
    store_release_system(a.flags[peer] + a.rank * kMaxBlocks + block, call);
    const uint32_t* mine = a.flags[a.rank] + peer * kMaxBlocks + block;
    while (static_cast<int32_t>(load_acquire_system(mine) - call) < 0) {
    }
  }
  __syncthreads();
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

}  // namespace

void launch(const Args& args, cudaStream_t stream) {
  const int64_t chunks = (args.bytes + kChunkBytes - 1) / kChunkBytes;
  const unsigned blocks = static_cast<unsigned>(chunks < kMaxBlocks ? chunks : kMaxBlocks);
  cuda::launch_pdl(peer_all_reduce_kernel, dim3(blocks), dim3(kThreads), 0, stream, args);
}

}  // namespace moeserve::comm::peer
