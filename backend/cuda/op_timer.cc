#include "backend/cuda/op_timer.h"

#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

namespace moeserve::cuda {

OpTimingBackend::OpTimingBackend(std::unique_ptr<ops::Backend> inner) : owned_(std::move(inner)), inner_(*owned_) {}

OpTimingBackend::~OpTimingBackend() {
  collect();
  for (void* e : free_events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void* OpTimingBackend::next_event() {
  cudaEvent_t event;
  if (free_events_.empty()) {
    MS_CHECK(cudaEventCreate(&event) == cudaSuccess, "cudaEventCreate failed");
  } else {
    event = static_cast<cudaEvent_t>(free_events_.back());
    free_events_.pop_back();
  }
  cudaEventRecord(event, stream_of(inner_));
  return event;
}

void OpTimingBackend::collect() {
  for (const auto& p : pending_) {
    cudaEventSynchronize(static_cast<cudaEvent_t>(p.stop));
    float ms = 0;
    cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(p.start), static_cast<cudaEvent_t>(p.stop));
    auto& t = totals_[p.op];
    ++t.calls;
    t.ms += ms;
    free_events_.push_back(p.start);
    free_events_.push_back(p.stop);
  }
  pending_.clear();
}

}  // namespace moeserve::cuda
