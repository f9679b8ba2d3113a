// OpTimingBackend: wraps a CUDA backend and, while enabled, times every op with CUDA events,
// for `bench-step --breakdown`. Events are recorded on the backend's stream around each call
// and read after the step, so the step itself is not synchronised more than without it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace moeserve::cuda {

struct OpTime {
  int64_t calls = 0;
  double ms = 0;
};

class OpTimingBackend final : public ops::Backend {
 public:
  explicit OpTimingBackend(std::unique_ptr<ops::Backend> inner);
  ~OpTimingBackend() override;

  // Off: every op passes straight through (no events).
  void set_enabled(bool enabled) { enabled_ = enabled; }
  bool supports_graphs() const override { return inner_.supports_graphs(); }
  void begin_capture() override { inner_.begin_capture(); }
  std::unique_ptr<ops::Graph> end_capture() override { return inner_.end_capture(); }
  void replay(ops::Graph& graph) override { inner_.replay(graph); }

  // Collects the events recorded since the last call (synchronises) into the totals.
  void collect();
  void reset() { totals_.clear(); }
  const std::map<std::string, OpTime>& totals() const { return totals_; }
  ops::Backend& inner() { return inner_; }

  std::string name() const override { return inner_.name(); }
  DType activation_dtype() const override { return inner_.activation_dtype(); }
  ops::BufferPtr alloc(size_t nbytes) override { return inner_.alloc(nbytes); }
  ops::BufferPtr alloc_for_overwrite(size_t nbytes) override { return inner_.alloc_for_overwrite(nbytes); }
  ops::BufferPtr alias(ops::Buffer& src, size_t offset, size_t nbytes) override {
    return inner_.alias(src, offset, nbytes);
  }
  void copy_rows(const ops::CopyRowsParams& p) override { inner_.copy_rows(p); }
  void upload(ops::Buffer& dst, size_t offset, const void* src, size_t nbytes) override {
    inner_.upload(dst, offset, src, nbytes);
  }
  void download(void* dst, const ops::Buffer& src, size_t offset, size_t nbytes) override {
    inner_.download(dst, src, offset, nbytes);
  }
  void upload_weight_into(ops::Buffer& dst, size_t offset, const Tensor& host_f32, bool keep_f32) override {
    inner_.upload_weight_into(dst, offset, host_f32, keep_f32);
  }
  void synchronize() override { inner_.synchronize(); }
  // Timed ops stay on the main stream, where the events are recorded: no overlap while timing.
  void side_begin() override {
    if (!enabled_) inner_.side_begin();
  }
  void side_end() override { inner_.side_end(); }
  void side_join() override { inner_.side_join(); }

  void embedding(const ops::EmbeddingParams& p) override {
    timed("embedding", [&] { inner_.embedding(p); });
  }
  void rms_norm(const ops::RmsNormParams& p) override {
    timed("rms_norm", [&] { inner_.rms_norm(p); });
  }
  void add(const ops::AddParams& p) override {
    timed("add", [&] { inner_.add(p); });
  }
  void add_rms_norm(const ops::AddRmsNormParams& p) override {
    timed("add_rms_norm", [&] { inner_.add_rms_norm(p); });
  }
  void linear(const ops::LinearParams& p) override {
    timed("linear", [&] { inner_.linear(p); });
  }
  void rope(const ops::RopeParams& p) override {
    timed("rope", [&] { inner_.rope(p); });
  }
  void silu_mul(const ops::SiluMulParams& p) override {
    timed("silu_mul", [&] { inner_.silu_mul(p); });
  }
  void mla_q_absorb(const ops::MlaQAbsorbParams& p) override {
    timed("mla_q_absorb", [&] { inner_.mla_q_absorb(p); });
  }
  void mla_v_up(const ops::MlaVUpParams& p) override {
    timed("mla_v_up", [&] { inner_.mla_v_up(p); });
  }
  void kv_write(const ops::KvWriteParams& p) override {
    timed("kv_write", [&] { inner_.kv_write(p); });
  }
  void mla_attention(const ops::MlaAttentionParams& p) override {
    timed("mla_attention", [&] { inner_.mla_attention(p); });
  }
  void moe_route(const ops::MoeRouteParams& p) override {
    timed("moe_route", [&] { inner_.moe_route(p); });
  }
  void moe_experts(const ops::MoeExpertsParams& p) override {
    timed("moe_experts", [&] { inner_.moe_experts(p); });
  }
  void sample(const ops::SampleParams& p) override {
    timed("sample", [&] { inner_.sample(p); });
  }
  void argmax_rows(const ops::ArgmaxRowsParams& p) override {
    timed("argmax_rows", [&] { inner_.argmax_rows(p); });
  }
  void top_candidates(const ops::TopCandidatesParams& p) override {
    timed("top_candidates", [&] { inner_.top_candidates(p); });
  }
  void apply_token_bitmask(const ops::TokenBitmaskParams& p) override {
    timed("apply_token_bitmask", [&] { inner_.apply_token_bitmask(p); });
  }
  void logit_adjust(const ops::LogitAdjustParams& p) override {
    timed("logit_adjust", [&] { inner_.logit_adjust(p); });
  }
  void fill_uniform(const ops::FillUniformParams& p) override { inner_.fill_uniform(p); }
  void fill_random_words(const ops::FillRandomWordsParams& p) override { inner_.fill_random_words(p); }
  void gather_rows(const ops::GatherRowsParams& p) override {
    timed("gather_rows", [&] { inner_.gather_rows(p); });
  }
  void row_combine(const ops::RowCombineParams& p) override {
    timed("row_combine", [&] { inner_.row_combine(p); });
  }

 private:
  template <typename Fn>
  void timed(const char* op, Fn&& fn) {
    if (!enabled_) {
      fn();
      return;
    }
    void* start = next_event();
    fn();
    pending_.push_back({op, start, next_event()});
  }
  void* next_event();  // records a new event on the stream

  struct Pending {
    std::string op;
    void* start;
    void* stop;
  };
  std::unique_ptr<ops::Backend> owned_;
  ops::Backend& inner_;
  bool enabled_ = false;
  std::vector<Pending> pending_;
  std::vector<void*> free_events_;
  std::map<std::string, OpTime> totals_;
};

}  // namespace moeserve::cuda
