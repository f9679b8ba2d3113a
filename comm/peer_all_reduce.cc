#include "comm/peer_all_reduce.h"

#include <cuda_runtime.h>

#include "comm/peer_all_reduce_kernel.h"
#include "core/error.h"

namespace moeserve::comm {

namespace {

#define MS_CUDA_OK(call, what)                                                                             \
  do {                                                                                                     \
    const cudaError_t status_ = (call);                                                                    \
    MS_CHECK(status_ == cudaSuccess, "peer all-reduce: {} failed: {}", what, cudaGetErrorString(status_)); \
  } while (0)

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

PeerAllReduce::PeerAllReduce(std::vector<int> devices) : devices_(std::move(devices)), memory_(devices_.size()) {}

std::shared_ptr<PeerAllReduce> PeerAllReduce::create(const std::vector<int>& devices) {
  const int n = static_cast<int>(devices.size());
  if (n < 2 || n > kMaxRanks) return nullptr;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      int ok = 0;
      if (i != j && (cudaDeviceCanAccessPeer(&ok, devices[i], devices[j]) != cudaSuccess || !ok)) return nullptr;
    }
  int previous = 0;
  MS_CUDA_OK(cudaGetDevice(&previous), "cudaGetDevice");
  struct RestoreDevice {  // the calling rank thread keeps its GPU current, on every return
    int device;
    ~RestoreDevice() { cudaSetDevice(device); }
  } restore{previous};
  std::shared_ptr<PeerAllReduce> group(new PeerAllReduce(devices));
  for (int i = 0; i < n; ++i) {
    MS_CUDA_OK(cudaSetDevice(devices[i]), "cudaSetDevice");
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const cudaError_t status = cudaDeviceEnablePeerAccess(devices[j], 0);
      if (status == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // NCCL (or an earlier group) enabled it: fine
      } else if (status != cudaSuccess) {
        cudaGetLastError();  // e.g. too many peers: NCCL does every all-reduce
        return nullptr;
      }
    }
    RankMemory& m = group->memory_[i];
    MS_CUDA_OK(cudaMalloc(&m.receive, 2 * n * kMaxBytes), "receive buffer allocation");
    MS_CUDA_OK(cudaMalloc(&m.flags, n * peer::kMaxBlocks * sizeof(uint32_t)), "flag allocation");
    MS_CUDA_OK(cudaMalloc(&m.calls, peer::kMaxBlocks * sizeof(uint32_t)), "counter allocation");
    MS_CUDA_OK(cudaMemset(m.flags, 0, n * peer::kMaxBlocks * sizeof(uint32_t)), "flag reset");
    MS_CUDA_OK(cudaMemset(m.calls, 0, peer::kMaxBlocks * sizeof(uint32_t)), "counter reset");
    MS_CUDA_OK(cudaDeviceSynchronize(), "initialisation");
  }
  return group;
}

PeerAllReduce::~PeerAllReduce() {
  int previous = 0;
  cudaGetDevice(&previous);
  for (size_t i = 0; i < memory_.size(); ++i) {
    cudaSetDevice(devices_[i]);
    cudaFree(memory_[i].receive);
    cudaFree(memory_[i].flags);
    cudaFree(memory_[i].calls);
  }
  cudaSetDevice(previous);
}

bool PeerAllReduce::fits(const void* data, size_t count, DType dtype) const {
  if (dtype != DType::F32 && dtype != DType::BF16) return false;
  const size_t bytes = count * dtype_size(dtype);
  return bytes > 0 && bytes <= kMaxBytes && bytes % 16 == 0 && aligned16(data);
}

peer::Args PeerAllReduce::arguments(int rank, void* data, int64_t bytes, bool bf16) const {
  peer::Args args{};
  args.rank = rank;
  args.size = size();
  for (int r = 0; r < size(); ++r) {
    args.receive[r] = memory_[r].receive;
    args.flags[r] = memory_[r].flags;
  }
  args.calls = memory_[rank].calls;
  args.data = static_cast<char*>(data);
  args.bytes = bytes;
  args.bf16 = bf16;
  return args;
}

bool PeerAllReduce::fits_rows(const float* branch, const ResidualNorm& norm) const {
  return norm.rows > 0 && norm.rows <= peer::kMaxBlocks && norm.dim > 0 && norm.dim % 8 == 0 &&
         norm.dim <= peer::kMaxRowElements && norm.rows * norm.dim * 4 <= peer::kMaxBytes && aligned16(branch) &&
         aligned16(norm.hidden) && aligned16(norm.weight) && aligned16(norm.normed);
}

void PeerAllReduce::all_reduce_add_rms_norm(int rank, float* branch, const ResidualNorm& norm, cudaStream_t stream) {
  MS_CHECK(rank >= 0 && rank < size() && fits_rows(branch, norm),
           "peer all-reduce: rank {} of {}, a [{}, {}] branch does not fit the fused kernel", rank, size(), norm.rows,
           norm.dim);
  peer::Args args = arguments(rank, branch, norm.rows * norm.dim * 4, false);
  args.hidden = norm.hidden;
  args.weight = norm.weight;
  args.normed = norm.normed;
  args.rows = norm.rows;
  args.dim = norm.dim;
  args.eps = norm.eps;
  peer::launch_add_rms_norm(args, stream);
}

void PeerAllReduce::all_reduce_sum(int rank, void* data, size_t count, DType dtype, cudaStream_t stream) {
  MS_CHECK(rank >= 0 && rank < size() && fits(data, count, dtype),
           "peer all-reduce: rank {} of {}, {} x {} does not fit", rank, size(), count, dtype_name(dtype));
  peer::launch(arguments(rank, data, static_cast<int64_t>(count * dtype_size(dtype)), dtype == DType::BF16), stream);
}

}  // namespace moeserve::comm
