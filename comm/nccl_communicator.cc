#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace moeserve::comm {

namespace {

#define MS_NCCL(call)                                                                             \
  do {                                                                                            \
    const ncclResult_t status_ = (call);                                                          \
    MS_CHECK(status_ == ncclSuccess, "NCCL error in {}: {}", #call, ncclGetErrorString(status_)); \
  } while (0)

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
    case DType::I8:
      return ncclInt8;
    default:
      fail("NCCL: unsupported dtype {}", dtype_name(dtype));
  }
}

void keep_nvls_off() { setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0); }

}  // namespace

NcclCommunicator::NcclCommunicator(ncclComm_t comm, cudaStream_t stream, std::string name)
    : comm_(comm), stream_(stream), name_(std::move(name)) {
  MS_NCCL(ncclCommUserRank(comm_, &rank_));
  MS_NCCL(ncclCommCount(comm_, &size_));
  MS_CHECK(cudaMalloc(&barrier_scratch_, 4) == cudaSuccess, "NCCL barrier buffer allocation failed");
}

NcclCommunicator::~NcclCommunicator() {
  collect_timing();
  cudaFree(barrier_scratch_);
  ncclCommDestroy(comm_);
}

void* NcclCommunicator::record_event() {
  cudaEvent_t event;
  MS_CHECK(cudaEventCreate(&event) == cudaSuccess, "{}: cudaEventCreate failed", name_);
  cudaEventRecord(event, stream_);
  return event;
}

template <typename Fn>
void NcclCommunicator::maybe_timed(Collective c, Fn&& fn) {
  if (!timing_) {
    fn();
    return;
  }
  void* start = record_event();
  fn();
  timed_.push_back({c, start, record_event()});
}

std::map<Collective, double> NcclCommunicator::collect_timing() {
  std::map<Collective, double> ms_by_collective;
  for (const Timed& t : timed_) {
    cudaEventSynchronize(static_cast<cudaEvent_t>(t.stop));
    float ms = 0;
    cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(t.start), static_cast<cudaEvent_t>(t.stop));
    ms_by_collective[t.collective] += ms;
    cudaEventDestroy(static_cast<cudaEvent_t>(t.start));
    cudaEventDestroy(static_cast<cudaEvent_t>(t.stop));
  }
  timed_.clear();
  return ms_by_collective;
}

void NcclCommunicator::use_peer_all_reduce(std::shared_ptr<PeerAllReduce> group) {
  if (group) {
    int device = -1;
    MS_CHECK(cudaStreamGetDevice(stream_, &device) == cudaSuccess, "{}: cudaStreamGetDevice failed", name_);
    MS_CHECK(group->size() == size_ && group->device(rank_) == device,
             "{}: the peer all-reduce group ({} GPUs, rank {} on GPU {}) does not match this communicator "
             "(rank {} of {} on GPU {})",
             name_, group->size(), rank_, group->device(rank_), rank_, size_, device);
  }
  peer_ = std::move(group);
}

void NcclCommunicator::all_reduce_sum(void* data, size_t count, DType dtype) {
  stats_.record(Collective::AllReduce, static_cast<int64_t>(count * dtype_size(dtype)));
  if (peer_ && peer_->fits(data, count, dtype)) {
    maybe_timed(Collective::AllReduce, [&] { peer_->all_reduce_sum(rank_, data, count, dtype, stream_); });
    return;
  }
  maybe_timed(Collective::AllReduce,
              [&] { MS_NCCL(ncclAllReduce(data, data, count, nccl_type(dtype), ncclSum, comm_, stream_)); });
}

bool NcclCommunicator::all_reduce_add_rms_norm(float* branch, const ResidualNorm& norm) {
  if (!peer_ || !peer_->fits_rows(branch, norm)) return false;
  stats_.record(Collective::AllReduce, norm.rows * norm.dim * 4);
  maybe_timed(Collective::AllReduce, [&] { peer_->all_reduce_add_rms_norm(rank_, branch, norm, stream_); });
  return true;
}

void NcclCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  stats_.record(Collective::AllGather, static_cast<int64_t>(count * dtype_size(dtype)));
  maybe_timed(Collective::AllGather,
              [&] { MS_NCCL(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream_)); });
}

void NcclCommunicator::reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype) {
  stats_.record(Collective::ReduceScatter, static_cast<int64_t>(count * dtype_size(dtype) * size_));
  maybe_timed(Collective::ReduceScatter,
              [&] { MS_NCCL(ncclReduceScatter(send, recv, count, nccl_type(dtype), ncclSum, comm_, stream_)); });
}

void NcclCommunicator::all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                    const std::vector<size_t>& recv_counts, DType dtype) {
  MS_CHECK(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(recv_counts.size()) == size_,
           "{}: all_to_all_v needs {} send and receive counts", name_, size_);
  const size_t elem = dtype_size(dtype);
  size_t sent = 0, send_offset = 0, recv_offset = 0;  // sent: every element, own block included
  void* start = timing_ ? record_event() : nullptr;
  MS_NCCL(ncclGroupStart());
  for (int peer = 0; peer < size_; ++peer) {
    if (send_counts[peer] > 0)
      MS_NCCL(ncclSend(static_cast<const char*>(send) + send_offset * elem, send_counts[peer], nccl_type(dtype), peer,
                       comm_, stream_));
    if (recv_counts[peer] > 0)
      MS_NCCL(ncclRecv(static_cast<char*>(recv) + recv_offset * elem, recv_counts[peer], nccl_type(dtype), peer, comm_,
                       stream_));
    send_offset += send_counts[peer];
    recv_offset += recv_counts[peer];
    sent += send_counts[peer];
  }
  MS_NCCL(ncclGroupEnd());
  if (timing_) timed_.push_back({Collective::AllToAllV, start, record_event()});
  stats_.record(Collective::AllToAllV, static_cast<int64_t>(sent * elem));
}

void NcclCommunicator::send(const void* data, size_t count, DType dtype, int peer) {
  stats_.record(Collective::Send, static_cast<int64_t>(count * dtype_size(dtype)));
  maybe_timed(Collective::Send, [&] { MS_NCCL(ncclSend(data, count, nccl_type(dtype), peer, comm_, stream_)); });
}

void NcclCommunicator::recv(void* data, size_t count, DType dtype, int peer) {
  stats_.record(Collective::Recv, static_cast<int64_t>(count * dtype_size(dtype)));
  maybe_timed(Collective::Recv, [&] { MS_NCCL(ncclRecv(data, count, nccl_type(dtype), peer, comm_, stream_)); });
}

void NcclCommunicator::broadcast(void* data, size_t count, DType dtype, int root) {
  stats_.record(Collective::Broadcast, static_cast<int64_t>(count * dtype_size(dtype)));
  MS_NCCL(ncclBroadcast(data, data, count, nccl_type(dtype), root, comm_, stream_));
}

void NcclCommunicator::barrier() {
  stats_.record(Collective::Barrier, 0);
  MS_NCCL(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclInt32, ncclSum, comm_, stream_));
  MS_CHECK(cudaStreamSynchronize(stream_) == cudaSuccess, "{}: barrier failed", name_);
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::split(int color, int key, std::string name) {
  ncclComm_t child = nullptr;
  MS_NCCL(ncclCommSplit(comm_, color, key, &child, nullptr));
  return std::make_unique<NcclCommunicator>(child, stream_, std::move(name));
}

std::vector<std::unique_ptr<NcclCommunicator>> make_nccl_world(const std::vector<cudaStream_t>& streams) {
  keep_nvls_off();
  const int n = static_cast<int>(streams.size());
  std::vector<ncclComm_t> comms(n);
  std::vector<int> devices(n);
  for (int i = 0; i < n; ++i) devices[i] = i;
  MS_NCCL(ncclCommInitAll(comms.data(), n, devices.data()));
  std::vector<std::unique_ptr<NcclCommunicator>> world;
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(i);
    world.push_back(std::make_unique<NcclCommunicator>(comms[i], streams[i], "world"));
  }
  return world;
}

std::vector<std::byte> nccl_unique_id() {
  ncclUniqueId id;
  MS_NCCL(ncclGetUniqueId(&id));
  std::vector<std::byte> bytes(sizeof id);
  std::memcpy(bytes.data(), &id, sizeof id);
  return bytes;
}

std::vector<std::unique_ptr<NcclCommunicator>> make_nccl_world_part(const std::vector<std::byte>& id, int world_size,
                                                                    const std::vector<int>& ranks,
                                                                    const std::vector<cudaStream_t>& streams) {
  keep_nvls_off();
  ncclUniqueId unique;
  MS_CHECK(id.size() == sizeof unique, "NCCL unique id: {} bytes received, {} expected", id.size(), sizeof unique);
  MS_CHECK(ranks.size() == streams.size(), "NCCL world part: {} ranks but {} streams", ranks.size(), streams.size());
  std::memcpy(&unique, id.data(), sizeof unique);
  const int n = static_cast<int>(ranks.size());
  std::vector<ncclComm_t> comms(n);
  MS_NCCL(ncclGroupStart());
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(i);
    MS_NCCL(ncclCommInitRank(&comms[i], world_size, unique, ranks[i]));
  }
  MS_NCCL(ncclGroupEnd());
  std::vector<std::unique_ptr<NcclCommunicator>> world;
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(i);
    world.push_back(std::make_unique<NcclCommunicator>(comms[i], streams[i], "world"));
  }
  return world;
}

}  // namespace moeserve::comm
