// NCCL communicators and the peer all-reduce on two GPUs of this machine (label: gpu; skipped,
// reported as skipped, with fewer than two GPUs). Every all-reduce is checked bit for bit
// against the rank-order sum computed on the host (fp32 adds; bf16 summed in fp32 and rounded
// once), for messages the peer kernel takes and for ones that go to NCCL (too large,
// unaligned, other dtypes), called many times in a row (its call counters and buffer halves)
// and replayed from a captured CUDA graph; the all-reduce fused with the residual add and RMSNorm
// against the separate ops.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "backend/cuda/kernels.h"
#include "comm/nccl_communicator.h"
#include "comm/peer_all_reduce.h"
#include "core/dtype.h"
#include "core/random.h"

namespace moeserve {
namespace {

constexpr int kRanks = 2;
constexpr size_t kMaxFloats = comm::PeerAllReduce::kMaxBytes / 4;

// Element i of a message of fp32 values or bf16 bits, as a float.
float element(DType dtype, const std::vector<uint8_t>& bytes, size_t i) {
  if (dtype == DType::F32) {
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, bytes.data() + 2 * i, 2);
  return bf16_to_f32(bits);
}

// Stores v as element i (bf16: rounded to nearest even).
void set_element(DType dtype, std::vector<uint8_t>& bytes, size_t i, float v) {
  if (dtype == DType::F32) {
    std::memcpy(bytes.data() + 4 * i, &v, 4);
    return;
  }
  const uint16_t bits = f32_to_bf16(v);
  std::memcpy(bytes.data() + 2 * i, &bits, 2);
}

// Random message of rank `rank` for call `call`: fp32 values, or bf16 bits.
std::vector<uint8_t> message(DType dtype, size_t count, int rank, int call) {
  std::vector<uint8_t> bytes(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) set_element(dtype, bytes, i, 100.0f * uniform_pm1(1000 * call + rank, i));
  return bytes;
}

std::vector<uint8_t> rank_order_sum(DType dtype, size_t count, int call) {
  std::vector<std::vector<uint8_t>> parts;
  for (int r = 0; r < kRanks; ++r) parts.push_back(message(dtype, count, r, call));
  std::vector<uint8_t> out(parts[0].size());
  for (size_t i = 0; i < count; ++i) {
    float acc = element(dtype, parts[0], i);
    for (int r = 1; r < kRanks; ++r) acc += element(dtype, parts[r], i);
    set_element(dtype, out, i, acc);
  }
  return out;
}

class NcclComm : public ::testing::Test {
 protected:
  void SetUp() override {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < kRanks) GTEST_SKIP() << "needs two GPUs";
    for (int r = 0; r < kRanks; ++r) {
      cudaSetDevice(r);
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      streams_.push_back(s);
    }
    world_ = comm::make_nccl_world(streams_);
    peer_ = comm::PeerAllReduce::create({0, 1});
    ASSERT_NE(peer_, nullptr) << "GPUs 0 and 1 cannot access each other's memory";
  }
  void TearDown() override {
    world_.clear();
    for (int r = 0; r < static_cast<int>(streams_.size()); ++r) {
      cudaSetDevice(r);
      cudaStreamDestroy(streams_[r]);
    }
  }
  // fn(rank) on one thread per rank, device set.
  void on_every_rank(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
      threads.emplace_back([&, r] {
        cudaSetDevice(r);
        fn(r);
      });
    for (auto& t : threads) t.join();
  }

  std::vector<cudaStream_t> streams_;
  std::vector<std::unique_ptr<comm::NcclCommunicator>> world_;
  std::shared_ptr<comm::PeerAllReduce> peer_;
};

struct Case {
  DType dtype;
  size_t count;
  size_t offset_bytes;  // 4: an unaligned message (NCCL)
};

TEST_F(NcclComm, AllReduceIsTheRankOrderSumThroughPeerKernelAndNccl) {
  const std::vector<Case> cases = {{DType::F32, 4, 0},
                                   {DType::F32, 7168, 0},
                                   {DType::F32, 3 * 7168, 0},
                                   {DType::F32, 8 * 7168, 0},
                                   {DType::F32, 64 * 7168, 0},
                                   {DType::F32, kMaxFloats, 0},
                                   {DType::F32, kMaxFloats + 4, 0},  // over the peer kernel's limit: NCCL
                                   {DType::F32, 7168, 4},
                                   {DType::BF16, 8, 0},
                                   {DType::BF16, 7168, 0},
                                   {DType::BF16, 131072, 0},
                                   {DType::BF16, 7, 0}};  // 14 bytes: NCCL
  for (const Case& c : cases) {
    EXPECT_EQ(peer_->fits(reinterpret_cast<void*>(c.offset_bytes == 0 ? 256 : 260), c.count, c.dtype),
              c.count * dtype_size(c.dtype) <= comm::PeerAllReduce::kMaxBytes && c.offset_bytes == 0 &&
                  c.count * dtype_size(c.dtype) % 16 == 0)
        << dtype_name(c.dtype) << " x " << c.count;
  }
  on_every_rank([&](int rank) {
    auto group = world_[rank]->split(0, rank, "tp");
    group->use_peer_all_reduce(peer_);
    for (int round = 0; round < 3; ++round)
      for (size_t k = 0; k < cases.size(); ++k) {
        const Case& c = cases[k];
        const int call = static_cast<int>(round * cases.size() + k);
        const std::vector<uint8_t> mine = message(c.dtype, c.count, rank, call);
        char* buffer = nullptr;
        ASSERT_EQ(cudaMalloc(&buffer, mine.size() + 16), cudaSuccess);
        cudaMemcpyAsync(buffer + c.offset_bytes, mine.data(), mine.size(), cudaMemcpyHostToDevice, streams_[rank]);
        group->all_reduce_sum(buffer + c.offset_bytes, c.count, c.dtype);
        std::vector<uint8_t> got(mine.size());
        cudaMemcpyAsync(got.data(), buffer + c.offset_bytes, got.size(), cudaMemcpyDeviceToHost, streams_[rank]);
        ASSERT_EQ(cudaStreamSynchronize(streams_[rank]), cudaSuccess);
        cudaFree(buffer);
        EXPECT_TRUE(got == rank_order_sum(c.dtype, c.count, call))
            << "rank " << rank << ", " << dtype_name(c.dtype) << " x " << c.count << " at +" << c.offset_bytes;
      }
  });
}

TEST_F(NcclComm, PeerAllReduceBackToBackAndReplayedFromAGraph) {
  constexpr size_t kCount = 7168;  // fp32: one decode row's hidden state
  constexpr int kCalls = 5, kReplays = 40;
  on_every_rank([&](int rank) {
    auto group = world_[rank]->split(0, rank, "tp");
    group->use_peer_all_reduce(peer_);
    cudaStream_t s = streams_[rank];
    // kCalls messages reduced one after the other (no host synchronisation between calls).
    std::vector<float*> buffers(kCalls);
    std::vector<std::vector<uint8_t>> inputs(kCalls);
    for (int i = 0; i < kCalls; ++i) {
      ASSERT_EQ(cudaMalloc(&buffers[i], kCount * 4), cudaSuccess);
      inputs[i] = message(DType::F32, kCount, rank, 500 + i);
    }
    float* source = nullptr;  // the inputs on the device, copied in by the graph before each call
    ASSERT_EQ(cudaMalloc(&source, kCalls * kCount * 4), cudaSuccess);
    for (int i = 0; i < kCalls; ++i)
      cudaMemcpy(source + i * kCount, inputs[i].data(), kCount * 4, cudaMemcpyHostToDevice);
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    for (int i = 0; i < kCalls; ++i) {
      cudaMemcpyAsync(buffers[i], source + i * kCount, kCount * 4, cudaMemcpyDeviceToDevice, s);
      group->all_reduce_sum(buffers[i], kCount, DType::F32);
    }
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < kReplays; ++replay) {
      ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
      if (replay % 8 != 7) continue;  // most replays run back to back
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      for (int i = 0; i < kCalls; ++i) {
        std::vector<uint8_t> got(kCount * 4);
        cudaMemcpy(got.data(), buffers[i], got.size(), cudaMemcpyDeviceToHost);
        EXPECT_TRUE(got == rank_order_sum(DType::F32, kCount, 500 + i)) << "rank " << rank << ", call " << i;
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    for (float* b : buffers) cudaFree(b);
    cudaFree(source);
  });
}

// The fused all-reduce + residual add + RMSNorm gives the bits of the separate ops (the sum,
// then the backend's add_rms_norm kernel), for one, a few and many rows, and declines shapes
// it has no kernel for (the caller then runs the separate ops).
TEST_F(NcclComm, FusedAllReduceAddRmsNormEqualsTheSeparateOps) {
  struct Shape {
    int64_t rows, dim;
  };
  const std::vector<Shape> shapes = {{1, 7168}, {3, 7168}, {64, 7168}, {5, 512}, {2, 8}};
  on_every_rank([&](int rank) {
    auto group = world_[rank]->split(0, rank, "tp");
    EXPECT_EQ(comm::fused_all_reduce_norm(*group), nullptr) << "no peer group: no fused path";
    group->use_peer_all_reduce(peer_);
    comm::FusedAllReduceNorm* fused_path = comm::fused_all_reduce_norm(*group);
    ASSERT_NE(fused_path, nullptr);
    cudaStream_t s = streams_[rank];
    for (size_t k = 0; k < shapes.size(); ++k) {
      const auto [rows, dim] = shapes[k];
      const size_t n = static_cast<size_t>(rows * dim);
      const std::vector<uint8_t> branch = message(DType::F32, n, rank, 900 + static_cast<int>(k));
      const std::vector<uint8_t> hidden = message(DType::BF16, n, 0, 950 + static_cast<int>(k));  // replicated
      const std::vector<uint8_t> weight = message(DType::BF16, static_cast<size_t>(dim), 0, 990);
      std::vector<void*> buffers;
      auto upload = [&](const std::vector<uint8_t>& bytes) {
        void* p = nullptr;
        EXPECT_EQ(cudaMalloc(&p, bytes.size()), cudaSuccess);
        cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
        buffers.push_back(p);
        return p;
      };
      auto download = [&](const void* p, size_t bytes) {
        std::vector<uint8_t> out(bytes);
        cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost);
        return out;
      };
      void* w = upload(weight);
      // Fused.
      void *branch_a = upload(branch), *hidden_a = upload(hidden),
           *normed_a = upload(std::vector<uint8_t>(n * 2, 0xff));
      const comm::ResidualNorm fused{hidden_a, w, normed_a, rows, dim, 1e-6f};
      ASSERT_TRUE(fused_path->all_reduce_add_rms_norm(static_cast<float*>(branch_a), fused)) << rows << " x " << dim;
      // Separate: the all-reduce (peer kernel), then the backend's add_rms_norm.
      void *branch_b = upload(branch), *hidden_b = upload(hidden),
           *normed_b = upload(std::vector<uint8_t>(n * 2, 0xff));
      group->all_reduce_sum(branch_b, n, DType::F32);
      cuda::launch_add_rms_norm({.hidden = hidden_b,
                                 .x = branch_b,
                                 .weight = w,
                                 .normed = normed_b,
                                 .rows = rows,
                                 .dim = dim,
                                 .eps = 1e-6f,
                                 .x_f32 = true},
                                s);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_TRUE(download(branch_a, n * 4) == download(branch_b, n * 4)) << "branch, " << rows << " x " << dim;
      EXPECT_TRUE(download(hidden_a, n * 2) == download(hidden_b, n * 2)) << "hidden, " << rows << " x " << dim;
      EXPECT_TRUE(download(normed_a, n * 2) == download(normed_b, n * 2)) << "normed, " << rows << " x " << dim;
      for (void* p : buffers) cudaFree(p);
    }
    // No fused kernel: more rows than blocks, or rows wider than the registers hold.
    float* scratch = nullptr;
    ASSERT_EQ(cudaMalloc(&scratch, 200 * 9000 * 4), cudaSuccess);
    EXPECT_FALSE(fused_path->all_reduce_add_rms_norm(scratch, {scratch, scratch, scratch, 129, 16, 1e-6f}));
    EXPECT_FALSE(fused_path->all_reduce_add_rms_norm(scratch, {scratch, scratch, scratch, 1, 8200, 1e-6f}));
    cudaFree(scratch);
  });
}

TEST_F(NcclComm, PeerGroupMustMatchTheCommunicator) {
  on_every_rank([&](int rank) {
    auto group = world_[rank]->split(0, 1 - rank, "reversed");  // group rank 0 is GPU 1
    EXPECT_THROW(group->use_peer_all_reduce(peer_), std::exception);
  });
}

}  // namespace
}  // namespace moeserve
