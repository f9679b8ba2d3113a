#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/mla_decode.h"
#include "backend/cuda/op_timer.h"
#include "core/error.h"
#include "core/random.h"

namespace moeserve::cuda {

#define MS_CUDA(call)                                                                                             \
  do {                                                                                                            \
    const cudaError_t status_ = (call);                                                                           \
    MS_CHECK(status_ == cudaSuccess, "CUDA error {} at {}:{}: {}", static_cast<int>(status_), __FILE__, __LINE__, \
             cudaGetErrorString(status_));                                                                        \
  } while (0)
#define MS_CUBLAS(call)                                                                                         \
  do {                                                                                                          \
    const cublasStatus_t status_ = (call);                                                                      \
    MS_CHECK(status_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error {} at {}:{}", static_cast<int>(status_), __FILE__, \
             __LINE__);                                                                                         \
  } while (0)

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

DeviceMemory device_memory(int device) {
  MS_CUDA(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  MS_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

namespace {

using namespace moeserve::ops;

// Caching allocator: freed blocks are kept by exact size and handed out again, so the
// per-step activation buffers cost no cudaMalloc after the first step of each shape.
class BlockCache {
 public:
  explicit BlockCache(int device) : device_(device) {}
  ~BlockCache() {
    for (auto& [bytes, ptr] : free_) cudaFree(ptr);
  }
  void* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      return p;
    }
    void* p = nullptr;
    cudaSetDevice(device_);
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status != cudaSuccess) {
      // Give cached blocks back to the driver and retry once.
      for (auto& [b, q] : free_) cudaFree(q);
      free_.clear();
      cudaGetLastError();
      MS_CUDA(cudaMalloc(&p, bytes));
    }
    return p;
  }
  void give_back(void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.emplace(bytes, p);
  }

 private:
  int device_;
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
};

// One cache per GPU, shared by every backend on it while any lives: a re-plan's new engine
// reuses the blocks its old one frees, where per-backend caches would hold them apart.
std::shared_ptr<BlockCache> cache_of_device(int device) {
  static std::mutex mutex;
  static std::map<int, std::weak_ptr<BlockCache>> caches;
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<BlockCache> cache = caches[device].lock();
  if (!cache) {
    cache = std::make_shared<BlockCache>(device);
    caches[device] = cache;
  }
  return cache;
}

// One cudaMalloc'd block, back to its device's cache when the last buffer over it goes.
class DeviceBlock {
 public:
  DeviceBlock(std::shared_ptr<BlockCache> cache, int device, size_t bytes)
      : cache_(std::move(cache)), device_(device), bytes_(bytes), ptr_(cache_->take(bytes)) {}
  ~DeviceBlock() { cache_->give_back(ptr_, bytes_); }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(ptr_); }
  int device() const { return device_; }

 private:
  std::shared_ptr<BlockCache> cache_;
  int device_;
  size_t bytes_;
  void* ptr_;
};

// A whole block, or bytes [offset, offset + nbytes) of one (a re-plan's view of an old shard).
class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(std::shared_ptr<BlockCache> cache, int device, size_t nbytes)
      : block_(std::make_shared<DeviceBlock>(std::move(cache), device, std::max<size_t>(nbytes, 256))),
        nbytes_(nbytes) {}
  DeviceBuffer(const DeviceBuffer& of, size_t offset, size_t nbytes)
      : block_(of.block_), offset_(of.offset_ + offset), nbytes_(nbytes) {}
  void* data() override { return block_->data() + offset_; }
  size_t nbytes() const override { return nbytes_; }
  int device() const { return block_->device(); }

 private:
  std::shared_ptr<DeviceBlock> block_;
  size_t offset_ = 0;
  size_t nbytes_;
};

// One line on stderr per policy a process runs with (every rank's backend usually has the same).
void report_policy(const KernelPolicy& policy) {
  static std::mutex mutex;
  static std::set<std::string> reported;
  const std::string line = policy.describe();
  std::lock_guard<std::mutex> lock(mutex);
  if (reported.insert(line).second) std::fprintf(stderr, "[moeserve] cuda kernel policy: %s\n", line.c_str());
}

struct CudaGraph final : Graph {
  cudaGraphExec_t exec = nullptr;
  ~CudaGraph() override {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

}  // namespace

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const KernelPolicy& policy)
      : device_(device), policy_(policy), cache_(cache_of_device(device)) {
    const int count = device_count();
    MS_CHECK(device >= 0 && device < count, "CUDA device {} requested, {} visible", device, count);
    MS_CUDA(cudaSetDevice(device));
    MS_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MS_CUDA(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
    MS_CUDA(cudaEventCreateWithFlags(&fork_event_, cudaEventDisableTiming));
    MS_CUDA(cudaEventCreateWithFlags(&join_event_, cudaEventDisableTiming));
    cur_ = stream_;
    // One cuBLAS handle per stream, each with a fixed workspace (no allocation inside
    // CUDA-graph capture; a handle's workspace must not be shared by concurrent streams).
    for (int i = 0; i < 2; ++i) {
      MS_CUBLAS(cublasCreate(&cublas_handles_[i]));
      MS_CUBLAS(cublasSetStream(cublas_handles_[i], i == 0 ? stream_ : side_stream_));
      MS_CUDA(cudaMalloc(&cublas_workspaces_[i], kCublasWorkspaceBytes));
      MS_CUBLAS(cublasSetWorkspace(cublas_handles_[i], cublas_workspaces_[i], kCublasWorkspaceBytes));
      MS_CUBLAS(cublasSetMathMode(cublas_handles_[i], CUBLAS_DEFAULT_MATH));
    }
    MS_CUDA(cudaMallocHost(reinterpret_cast<void**>(&staging_), kStagingBytes));
    report_policy(policy_);
  }
  ~CudaBackend() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamSynchronize(side_stream_);
    moe_workspace_.reset();
    route_workspace_.reset();
    mla_workspace_.reset();
    candidates_workspace_.reset();
    for (int i = 0; i < 2; ++i) {
      cublasDestroy(cublas_handles_[i]);
      cudaFree(cublas_workspaces_[i]);
    }
    cudaFreeHost(staging_);
    cudaEventDestroy(fork_event_);
    cudaEventDestroy(join_event_);
    cudaStreamDestroy(side_stream_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  DType activation_dtype() const override { return DType::BF16; }
  cudaStream_t stream() const { return stream_; }

  BufferPtr alloc(size_t nbytes) override {
    cudaSetDevice(device_);
    return std::make_unique<DeviceBuffer>(cache_, device_, nbytes);
  }
  // Views of this GPU's memory only (another GPU's bytes are copied), 256-byte aligned as
  // cudaMalloc's blocks are: the kernels' vector loads and cp.async assume it.
  BufferPtr alias(Buffer& src, size_t offset, size_t nbytes) override {
    const auto* device = dynamic_cast<const DeviceBuffer*>(&src);
    if (device == nullptr || device->device() != device_ || offset % 256 != 0 || offset + nbytes > src.nbytes())
      return nullptr;
    return std::make_unique<DeviceBuffer>(*device, offset, nbytes);
  }
  // Through unified addressing: the same GPU, a peer, or host memory alike. The copies go in
  // this backend's stream and are waited for: the loader's next kernels run in it anyway, but a
  // peer's stream would not see them otherwise.
  void copy_rows(const CopyRowsParams& p) override {
    cudaSetDevice(device_);
    MS_CUDA(cudaMemcpy2DAsync(p.dst, p.dst_pitch, p.src, p.src_pitch, p.row_bytes, p.rows, cudaMemcpyDefault, stream_));
    MS_CUDA(cudaStreamSynchronize(stream_));
  }
  void upload(Buffer& dst, size_t offset, const void* src, size_t nbytes) override {
    MS_CHECK(offset + nbytes <= dst.nbytes(), "upload of {} bytes at {} overruns a {}-byte buffer", nbytes, offset,
             dst.nbytes());
    char* target = static_cast<char*>(dst.data()) + offset;
    if (nbytes <= kStagingBytes / 4) {
      // Step uploads (metadata, routing tables, token bitmasks): copied into pinned staging and sent
      // asynchronously, in stream order, so the host never waits for the device here. A
      // region is reused only after a wrap, which waits for every copy still reading it.
      const size_t aligned = (nbytes + 255) & ~size_t{255};
      if (staging_used_ + aligned > kStagingBytes) {
        MS_CUDA(cudaStreamSynchronize(stream_));
        staging_used_ = 0;
      }
      char* stage = staging_ + staging_used_;
      staging_used_ += aligned;
      std::memcpy(stage, src, nbytes);
      MS_CUDA(cudaMemcpyAsync(target, stage, nbytes, cudaMemcpyHostToDevice, stream_));
      return;
    }
    MS_CUDA(cudaMemcpyAsync(target, src, nbytes, cudaMemcpyHostToDevice, stream_));
    // Pageable source memory may be reused by the caller as soon as we return.
    MS_CUDA(cudaStreamSynchronize(stream_));
  }
  void download(void* dst, const Buffer& src, size_t offset, size_t nbytes) override {
    MS_CHECK(offset + nbytes <= src.nbytes(), "download of {} bytes at {} overruns a {}-byte buffer", nbytes, offset,
             src.nbytes());
    MS_CUDA(cudaMemcpyAsync(dst, static_cast<const char*>(const_cast<Buffer&>(src).data()) + offset, nbytes,
                            cudaMemcpyDeviceToHost, stream_));
    MS_CUDA(cudaStreamSynchronize(stream_));
  }
  void upload_weight_into(Buffer& dst, size_t offset, const Tensor& host_f32, bool keep_f32) override {
    const int64_t n = host_f32.numel();
    if (keep_f32) {
      upload(dst, offset, host_f32.raw(), static_cast<size_t>(n) * 4);
      return;
    }
    std::vector<uint16_t> bf(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) bf[i] = f32_to_bf16(host_f32.f32()[i]);
    upload(dst, offset, bf.data(), static_cast<size_t>(n) * 2);
  }
  void synchronize() override {
    MS_CUDA(cudaStreamSynchronize(side_stream_));
    MS_CUDA(cudaStreamSynchronize(stream_));
  }

  // The side stream: forked from the main stream's current point, joined back by an event
  // wait (captured into a graph as two branches and an edge). Without
  // KernelPolicy::overlap_streams every op stays on the main stream.
  void side_begin() override {
    if (!policy_.overlap_streams) return;
    MS_CHECK(cur_ == stream_, "side_begin() while already on the side stream");
    MS_CUDA(cudaEventRecord(fork_event_, stream_));
    MS_CUDA(cudaStreamWaitEvent(side_stream_, fork_event_, 0));
    cur_ = side_stream_;
    side_pending_ = true;
  }
  void side_end() override { cur_ = stream_; }
  void side_join() override {
    cur_ = stream_;
    if (!side_pending_) return;
    MS_CUDA(cudaEventRecord(join_event_, side_stream_));
    MS_CUDA(cudaStreamWaitEvent(stream_, join_event_, 0));
    side_pending_ = false;
  }

  void embedding(const EmbeddingParams& p) override { launch_embedding(p, cur_); }
  void rms_norm(const RmsNormParams& p) override { launch_rms_norm(p, cur_); }
  void add(const AddParams& p) override { launch_add(p, cur_); }
  void add_rms_norm(const AddRmsNormParams& p) override { launch_add_rms_norm(p, cur_); }

  void linear(const LinearParams& p) override {
    MS_CHECK(!p.accumulate || p.y_f32, "linear: accumulate needs an fp32 output (y_f32)");
    if (p.weight_quant.quantized()) return launch_quant_linear(p, cur_);  // every row count, batch-invariant
    if (p.rows == 0) return;
    if (policy_.batch_invariant && linear_mma_supported(p, policy_.linear_mma_min_rows)) {
      launch_linear_mma(p, cur_);
      return;
    }
    if (small_linear_supported(p) || (policy_.batch_invariant && streaming_linear_supported(p))) {
      launch_streaming_linear({.linear = p}, cur_);
      return;
    }
    refuse_in_invariant_mode("linear", p.in_features);
    // Row-major y[T, N] = x[T, K] W[N, K]^T is column-major y^T = W^T^T x^T: A = W (K x N,
    // transposed), B = x (K x T), C = y (N x T).
    const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
    MS_CUBLAS(cublasGemmEx(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.out_features),
                           static_cast<int>(p.rows), static_cast<int>(p.in_features), &alpha, p.weight, CUDA_R_16BF,
                           static_cast<int>(p.in_features), p.x, CUDA_R_16BF, static_cast<int>(p.x_stride), &beta, p.y,
                           p.y_f32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(p.y_stride), CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
  }

  void rope(const RopeParams& p) override { launch_rope(p, cur_); }
  void silu_mul(const SiluMulParams& p) override { launch_silu_mul(p, cur_); }

  void mla_q_absorb(const MlaQAbsorbParams& p) override {
    if (p.tokens == 0) return;
    if (mla_q_absorb_small_supported(p) || (policy_.batch_invariant && mla_q_absorb_streaming_supported(p))) {
      launch_mla_q_absorb_small(p, cur_);
      return;
    }
    refuse_in_invariant_mode("mla_q_absorb", p.latent);
    // Per head h: q_latent_h [T, L] = q_nope_h [T, nope] @ W_uk_h [nope, L]; column-major
    // q_latent_h^T [L, T] = W_uk_h^T [L, nope] (W_uk_h row-major is col-major L x nope) x q_nope_h^T.
    const float alpha = 1.0f, beta = 0.0f;
    MS_CUBLAS(cublasGemmStridedBatchedEx(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(p.latent),
                                         static_cast<int>(p.tokens), static_cast<int>(p.nope), &alpha, p.kv_b,
                                         CUDA_R_16BF, static_cast<int>(p.latent), (p.nope + p.v) * p.latent, p.q,
                                         CUDA_R_16BF, static_cast<int>(p.heads * p.q_head_stride), p.q_head_stride,
                                         &beta, p.q_latent, CUDA_R_16BF, static_cast<int>(p.heads * p.latent), p.latent,
                                         static_cast<int>(p.heads), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void mla_v_up(const MlaVUpParams& p) override {
    if (p.tokens == 0) return;
    const void* w_uv = static_cast<const char*>(p.kv_b) + p.nope * p.latent * 2;  // head 0's W_uv [v, latent]
    // Per head h: out[:, h, :] = attn_latent[:, h, :] @ W_uv[h]^T, one streaming launch for all heads.
    const StreamingLinearParams per_head{.linear = {.x = p.attn_latent,
                                                    .weight = w_uv,
                                                    .y = p.out,
                                                    .rows = p.tokens,
                                                    .in_features = p.latent,
                                                    .out_features = p.v,
                                                    .x_stride = p.heads * p.latent,
                                                    .y_stride = p.heads * p.v},
                                         .batches = p.heads,
                                         .x_batch = p.latent,
                                         .w_batch = (p.nope + p.v) * p.latent,
                                         .y_batch = p.v};
    if ((small_linear_supported(per_head.linear) ||
         (policy_.batch_invariant && streaming_linear_supported(per_head.linear))) &&
        per_head.w_batch % 8 == 0) {
      launch_streaming_linear(per_head, cur_);
      return;
    }
    refuse_in_invariant_mode("mla_v_up", p.latent);
    // Per head h: out_h [T, v] = latent_h [T, L] @ W_uv_h^T; column-major out_h^T [v, T] =
    // W_uv_h [v, L] (col-major L x v, transposed) x latent_h^T [L, T].
    const float alpha = 1.0f, beta = 0.0f;
    MS_CUBLAS(cublasGemmStridedBatchedEx(
        cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.v), static_cast<int>(p.tokens),
        static_cast<int>(p.latent), &alpha, w_uv, CUDA_R_16BF, static_cast<int>(p.latent), (p.nope + p.v) * p.latent,
        p.attn_latent, CUDA_R_16BF, static_cast<int>(p.heads * p.latent), p.latent, &beta, p.out, CUDA_R_16BF,
        static_cast<int>(p.heads * p.v), p.v, static_cast<int>(p.heads), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void kv_write(const KvWriteParams& p) override {
    if (p.fp8)
      launch_kv_write_fp8(p, cur_);
    else
      launch_kv_write(p, cur_);
  }

  void mla_attention(const MlaAttentionParams& p) override {
    void* ws = workspace(mla_workspace_, mla_workspace_bytes(p, policy_.batch_invariant));
    launch_mla_attention(p, policy_, ws, cur_);
  }

  void moe_route(const MoeRouteParams& p) override {
    void* ws = workspace(route_workspace_, route_workspace_bytes(p));
    launch_moe_route(p, policy_.batch_invariant, ws, cur_);
  }

  void moe_experts(const MoeExpertsParams& p) override {
    if (p.tokens == 0) return;
    const int64_t local = p.expert_end - p.expert_begin, pairs = p.tokens * p.top_k;
    const MoeExpertsLaunch m{
        .op = p,
        .pairs = pairs,
        .local_experts = local,
        // Pairs expected on this rank's experts (routing is uniform in expectation).
        .local_pairs = p.routed_experts > 0 ? pairs * local / p.routed_experts : pairs,
        .workspace = workspace(moe_workspace_, moe_workspace_bytes(p)),
    };
    launch_moe_sort(m, cur_);
    if (p.expert_quant.quantized()) {  // one path at every batch size (batch-invariant, no host sync)
      launch_moe_quant_expert_kernels(m, cur_);
      launch_moe_combine(m, cur_);
      return;
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MS_CUDA(cudaStreamIsCapturing(cur_, &capture));
    // Many rows per expert (prefill): tensor-core GEMMs per active expert, which needs the row
    // counts on the host. Few rows (decode): the streaming kernels, no synchronisation.
    const bool gemm_path = !policy_.batch_invariant && capture == cudaStreamCaptureStatusNone &&
                           p.w13_host != nullptr && pairs >= kGemmRowsPerExpert * local;
    if (gemm_path) {
      expert_gemms(m);
    } else {
      launch_moe_expert_kernels(m, policy_, cur_);
    }
    launch_moe_combine(m, cur_);
  }

  void sample(const SampleParams& p) override {
    if (p.rows == 0) return;
    const int64_t logit_rows = checked_logit_rows(p);
    std::vector<DrawOptions> options(static_cast<size_t>(p.rows));
    std::vector<int32_t> row_ids(static_cast<size_t>(p.rows));
    bool greedy = p.row_ids == nullptr && p.slices == 1;
    for (int64_t r = 0; r < p.rows; ++r) {
      const SamplingOptions& o = p.options[r];
      options[r] = {o.temperature, o.top_k, o.top_p, o.min_p, uniform01(o.seed, o.step)};
      row_ids[r] = static_cast<int32_t>(sample_logit_row(p, r));
      greedy &= o.temperature <= 0.0f || o.top_k == 1;
    }
    if (greedy) {
      return launch_argmax_rows(
          {.logits = p.logits, .values = nullptr, .ids = p.tokens, .rows = p.rows, .vocab = p.vocab, .id_offset = 0},
          cur_);
    }
    void* ws = workspace(sample_workspace_, sample_rows_workspace_bytes(p.rows, p.vocab));
    launch_sample_rows({.logits = p.logits,
                        .row_ids = row_ids.data(),
                        .options = options.data(),
                        .tokens = p.tokens,
                        .rows = p.rows,
                        .vocab = p.vocab,
                        .logit_rows = logit_rows,
                        .slices = p.slices},
                       ws, cur_);
    synchronize();  // the host vectors above are the copies' sources
  }
  void argmax_rows(const ArgmaxRowsParams& p) override { launch_argmax_rows(p, cur_); }
  void apply_token_bitmask(const TokenBitmaskParams& p) override { launch_apply_token_bitmask(p, cur_); }
  void logit_adjust(const LogitAdjustParams& p) override { launch_logit_adjust(p, cur_); }

  void top_candidates(const TopCandidatesParams& p) override {
    if (p.rows == 0) return;
    void* ws = workspace(candidates_workspace_, top_candidates_workspace_bytes(p));
    launch_top_candidates(p, ws, cur_);
  }

  void fill_uniform(const FillUniformParams& p) override { launch_fill_uniform(p, cur_); }
  void fill_random_words(const FillRandomWordsParams& p) override { launch_fill_random_words(p, cur_); }
  void gather_rows(const GatherRowsParams& p) override { launch_gather_rows(p, cur_); }
  void row_combine(const RowCombineParams& p) override { launch_row_combine(p, cur_); }

  bool supports_graphs() const override { return true; }
  void begin_capture() override { MS_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal)); }
  std::unique_ptr<Graph> end_capture() override {
    cudaGraph_t graph = nullptr;
    MS_CUDA(cudaStreamEndCapture(stream_, &graph));
    auto captured = std::make_unique<CudaGraph>();
    const cudaError_t status = cudaGraphInstantiate(&captured->exec, graph, 0);
    cudaGraphDestroy(graph);
    MS_CHECK(status == cudaSuccess, "CUDA graph instantiation failed: {}", cudaGetErrorString(status));
    return captured;
  }
  void replay(Graph& graph) override { MS_CUDA(cudaGraphLaunch(static_cast<CudaGraph&>(graph).exec, stream_)); }

 private:
  static constexpr size_t kCublasWorkspaceBytes = 32u << 20;
  // Pinned host ring for a step's uploads: metadata, routing tables, and the token bitmask a
  // constrained step uploads after its forward was enqueued (64 rows of a 163840-id vocabulary:
  // 1.3 MB), which must not wait for that forward.
  static constexpr size_t kStagingBytes = 32u << 20;
  char* staging_ = nullptr;
  size_t staging_used_ = 0;
  int device_;
  KernelPolicy policy_;
  std::shared_ptr<BlockCache> cache_;
  cudaStream_t stream_ = nullptr;       // main: every op, copy and collective by default
  cudaStream_t side_stream_ = nullptr;  // between side_begin() and side_end()
  cudaStream_t cur_ = nullptr;          // where ops are issued now
  cudaEvent_t fork_event_ = nullptr, join_event_ = nullptr;
  bool side_pending_ = false;
  cublasHandle_t cublas_handles_[2] = {nullptr, nullptr};  // main, side
  void* cublas_workspaces_[2] = {nullptr, nullptr};
  cublasHandle_t cublas() const { return cublas_handles_[cur_ == stream_ ? 0 : 1]; }
  static constexpr int64_t kGemmRowsPerExpert = 8;

  // Per active expert e with rows [o, o + n) in expert order:
  //   gate_up[o:o+n] = x_sorted[o:o+n] @ W13_e^T   [n, 2 * inter]
  //   act = silu(gate) * up                         [n, inter]  (one launch over all rows)
  //   partial[o:o+n] = act[o:o+n] @ W2_e^T          [n, hidden] fp32, rounded to bf16 values
  //                                                 (a bf16 linear output, as the streaming and
  //                                                 tensor-core expert kernels store it)
  void expert_gemms(const MoeExpertsLaunch& m) {
    const MoeExpertsParams& p = m.op;
    const int64_t local = m.local_experts;
    const MoeGemmBuffers b = moe_gemm_buffers(m);
    std::vector<int32_t> offsets(local + 1);
    MS_CUDA(cudaMemcpyAsync(offsets.data(), b.offsets, offsets.size() * 4, cudaMemcpyDeviceToHost, cur_));
    MS_CUDA(cudaStreamSynchronize(cur_));
    launch_moe_gather_sorted(m, cur_);
    const float alpha = 1.0f, beta = 0.0f;
    for (int64_t e = 0; e < local; ++e) {
      const int64_t o = offsets[e], n = offsets[e + 1] - offsets[e];
      if (n == 0) continue;
      MS_CUBLAS(cublasGemmEx(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(2 * p.inter), static_cast<int>(n),
                             static_cast<int>(p.hidden), &alpha, p.w13_host[e], CUDA_R_16BF, static_cast<int>(p.hidden),
                             static_cast<const char*>(b.x_sorted) + o * p.hidden * 2, CUDA_R_16BF,
                             static_cast<int>(p.hidden), &beta, static_cast<char*>(b.gate_up) + o * 2 * p.inter * 2,
                             CUDA_R_16BF, static_cast<int>(2 * p.inter), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    const int64_t rows = offsets[local];
    launch_silu_mul({.gate_up = b.gate_up, .out = b.act, .tokens = rows, .inter = p.inter}, cur_);
    for (int64_t e = 0; e < local; ++e) {
      const int64_t o = offsets[e], n = offsets[e + 1] - offsets[e];
      if (n == 0) continue;
      MS_CUBLAS(cublasGemmEx(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.hidden), static_cast<int>(n),
                             static_cast<int>(p.inter), &alpha, p.w2_host[e], CUDA_R_16BF, static_cast<int>(p.inter),
                             static_cast<const char*>(b.act) + o * p.inter * 2, CUDA_R_16BF, static_cast<int>(p.inter),
                             &beta, b.partial + o * p.hidden, CUDA_R_32F, static_cast<int>(p.hidden),
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    launch_round_to_bf16(b.partial, rows * p.hidden, cur_);
  }

  // cuBLAS picks its kernel by shape, so a row's result depends on the batch: batch-invariant
  // mode takes the streaming kernels, which need 16-byte rows (inner dimension % 8 == 0).
  void refuse_in_invariant_mode(const char* op, int64_t inner) const {
    MS_CHECK(!policy_.batch_invariant,
             "--batch-invariant: {} with an inner dimension of {} (or unaligned rows) has no "
             "batch-invariant kernel (it needs a multiple of 8)",
             op, inner);
  }

  // Grow-only scratch of one op. Growing waits for the stream (the old block may be in use);
  // the first run of each shape grows it, so a graph captured afterwards never does.
  void* workspace(BufferPtr& slot, int64_t bytes) {
    if (!slot || static_cast<int64_t>(slot->nbytes()) < bytes) {
      synchronize();
      slot = alloc(static_cast<size_t>(std::max<int64_t>(bytes, 256)));
    }
    return slot->data();
  }

  BufferPtr moe_workspace_, route_workspace_, mla_workspace_, candidates_workspace_, sample_workspace_;
};

std::string KernelPolicy::describe() const {
  return fmt::format(
      "batch_invariant={} mla_tensor_cores={} moe_tensor_cores={} linear_mma_min_rows={} "
      "overlap_streams={} quantized=int4/fp8-tensor-cores",
      batch_invariant ? 1 : 0, mla_tensor_cores ? 1 : 0, moe_tensor_cores ? 1 : 0, linear_mma_min_rows,
      overlap_streams ? 1 : 0);
}

KernelPolicy kernel_policy(const CudaBackendOptions& options) { return {.batch_invariant = options.batch_invariant}; }

std::unique_ptr<ops::Backend> make_cuda_backend(int device, const CudaBackendOptions& options) {
  return make_cuda_backend_with_policy(device, kernel_policy(options));
}

std::unique_ptr<ops::Backend> make_cuda_backend_with_policy(int device, const KernelPolicy& policy) {
  return std::make_unique<CudaBackend>(device, policy);
}

cudaStream_t stream_of(ops::Backend& backend) {
  if (auto* timing = dynamic_cast<OpTimingBackend*>(&backend)) return stream_of(timing->inner());
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  MS_CHECK(cuda != nullptr, "backend '{}' is not a CUDA backend", backend.name());
  return cuda->stream();
}

}  // namespace moeserve::cuda
