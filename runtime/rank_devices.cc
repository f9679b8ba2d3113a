#include "runtime/rank_devices.h"

#include <fmt/format.h>

#include <map>
#include <mutex>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#ifdef MOESERVE_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/op_timer.h"
#include "comm/nccl_communicator.h"
#endif

namespace moeserve::runtime {

std::vector<std::string> available_backends() {
#ifdef MOESERVE_WITH_CUDA
  return {"cpu", "cpu-bf16", "cuda"};
#else
  return {"cpu", "cpu-bf16"};
#endif
}

int visible_gpus() {
#ifdef MOESERVE_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

GpuMemory gpu_memory(int gpu) {
#ifdef MOESERVE_WITH_CUDA
  const cuda::DeviceMemory m = cuda::device_memory(gpu);
  return {m.free_bytes, m.total_bytes};
#else
  (void)gpu;
  return {};
#endif
}

std::string default_backend() { return visible_gpus() > 0 ? "cuda" : "cpu"; }

std::unique_ptr<ops::Backend> make_rank_backend(const std::string& kind, int rank, bool batch_invariant) {
  if (kind == "cpu") return cpu::make_cpu_backend();
  if (kind == "cpu-bf16") return cpu::make_cpu_backend(cpu::CpuNumerics::kBf16);
#ifdef MOESERVE_WITH_CUDA
  if (kind == "cuda") {
    const int gpus = cuda::device_count();
    MS_CHECK(rank < gpus, "--backend cuda: rank {} needs GPU {}, but {} GPU(s) are visible", rank, rank, gpus);
    // Wrapped so that benchmarks can time ops; a disabled timer passes calls straight through.
    return std::make_unique<cuda::OpTimingBackend>(cuda::make_cuda_backend(rank, {batch_invariant}));
  }
  fail("--backend '{}': unknown backend (cpu, cpu-bf16, cuda)", kind);
#else
  fail("--backend '{}': this build has only the cpu and cpu-bf16 backends (build with nvcc for cuda)", kind);
#endif
}

#ifdef MOESERVE_WITH_CUDA
struct NcclWorld::Impl {
  std::vector<std::unique_ptr<comm::NcclCommunicator>> world;  // [local index]
  std::map<int, int> local_of;                                 // world rank -> local index = GPU
  // One peer all-reduce per member list, shared by the communicators of those ranks (attention
  // TP and MoE groups with the same members share it: one stream per rank orders their calls
  // alike on every rank). nullptr where peer access is unavailable or a member lives in
  // another process.
  std::mutex peer_mutex;
  std::map<std::vector<int>, std::shared_ptr<comm::PeerAllReduce>> peer_groups;

  std::shared_ptr<comm::PeerAllReduce> peer_group(const std::vector<int>& members) {
    std::vector<int> gpus;
    for (int m : members) {
      const auto it = local_of.find(m);
      if (it == local_of.end()) return nullptr;
      gpus.push_back(it->second);
    }
    std::lock_guard<std::mutex> lock(peer_mutex);
    auto [it, inserted] = peer_groups.try_emplace(gpus);
    if (inserted) it->second = comm::PeerAllReduce::create(gpus);
    return it->second;
  }
};

NcclWorld::NcclWorld(const std::vector<ops::Backend*>& rank_backends, const NcclSpan* span)
    : impl_(std::make_unique<Impl>()) {
  std::vector<cudaStream_t> streams;
  for (ops::Backend* b : rank_backends) streams.push_back(cuda::stream_of(*b));
  const int n = static_cast<int>(rank_backends.size());
  for (int i = 0; i < n; ++i) impl_->local_of[span ? span->ranks.at(i) : i] = i;
  impl_->world = span ? comm::make_nccl_world_part(span->id, span->world_size, span->ranks, streams)
                      : comm::make_nccl_world(streams);
}

std::vector<std::byte> NcclWorld::unique_id() { return comm::nccl_unique_id(); }

RankComms NcclWorld::split_for(const parallel::ParallelPlan& plan, int rank) {
  const parallel::RankCoord c = parallel::rank_coord(plan, rank);
  comm::NcclCommunicator& world = *impl_->world[impl_->local_of.at(rank)];
  // color: which group; key: the rank's index in it (the group-rank order of rank_comms.h).
  auto attn_tp =
      world.split(c.stage * plan.attn_dp + c.dp_index, c.tp_index, fmt::format("attn_tp.s{}.d{}", c.stage, c.dp_index));
  auto moe = world.split(c.stage, c.moe_index, fmt::format("moe.s{}", c.stage));
  attn_tp->use_peer_all_reduce(impl_->peer_group(attn_tp_members(plan, rank)));
  moe->use_peer_all_reduce(impl_->peer_group(moe_members(plan, rank)));
  RankComms comms;
  comms.attn_tp = std::move(attn_tp);
  comms.moe = std::move(moe);
  comms.pipeline = world.split(c.dp_index * plan.attn_tp + c.tp_index, c.stage,
                               fmt::format("pipeline.d{}.t{}", c.dp_index, c.tp_index));
  return comms;
}
#else
struct NcclWorld::Impl {};
NcclWorld::NcclWorld(const std::vector<ops::Backend*>&, const NcclSpan*) {
  fail("NCCL is not available in this build");
}
std::vector<std::byte> NcclWorld::unique_id() { fail("NCCL is not available in this build"); }
RankComms NcclWorld::split_for(const parallel::ParallelPlan&, int) { fail("NCCL is not available in this build"); }
#endif

NcclWorld::~NcclWorld() = default;

}  // namespace moeserve::runtime
