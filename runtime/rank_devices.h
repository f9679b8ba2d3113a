// Where each rank runs: its backend ("cpu": the fp32 reference; "cpu-bf16": the CUDA backend's
// bf16 numerics on the host, backend/cpu/cpu_backend.h; "cuda": GPU `rank`) and,
// on GPUs, its NCCL communicators. CPU ranks talk through the in-process world
// (runtime/rank_comms.h); GPU ranks of one process through NCCL: the world communicators are
// made on the leader thread, then every rank splits its own into the plan's groups on its
// own thread (NCCL's split is collective), with the members runtime/rank_comms.h defines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "parallel/plan.h"
#include "runtime/rank_comms.h"

namespace moeserve::runtime {

// Backends this build can run ("cpu", "cpu-bf16", and "cuda" in the CUDA flavour).
std::vector<std::string> available_backends();
// GPUs visible to this process (0 without the CUDA flavour or a driver).
int visible_gpus();
// GPU `gpu`'s free and total memory now (zeros without the CUDA flavour).
struct GpuMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
GpuMemory gpu_memory(int gpu);
// The backend a command runs on when --backend is not given: cuda when a GPU is visible.
std::string default_backend();

// batch_invariant: cuda::CudaBackendOptions::batch_invariant (CPU ranks are batch-invariant
// already: every row's sums run in the same order whatever the batch).
std::unique_ptr<ops::Backend> make_rank_backend(const std::string& kind, int rank, bool batch_invariant = false);

// A GPU world over several processes: this process's world ranks (on its GPUs 0, 1, ...) and
// the NCCL id every process of the world was given (runtime/multinode.h sends it).
struct NcclSpan {
  std::vector<std::byte> id;
  int world_size = 0;
  std::vector<int> ranks;
};

// The NCCL world of a GPU run: one communicator per rank, bound to that rank's backend stream.
class NcclWorld {
 public:
  // One process: rank_backends[r] is world rank r. With `span`: rank_backends[i] is world rank
  // span->ranks[i], and the groups whose members live in other processes get no peer all-reduce.
  explicit NcclWorld(const std::vector<ops::Backend*>& rank_backends, const NcclSpan* span = nullptr);
  ~NcclWorld();
  // A fresh NCCL unique id (throws in a build without CUDA).
  static std::vector<std::byte> unique_id();
  // Called on world rank `rank`'s thread by every local rank together.
  RankComms split_for(const parallel::ParallelPlan& plan, int rank);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::runtime
