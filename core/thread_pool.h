// A fixed pool of worker threads with a deterministic parallel_for: the index range is cut
// into the same chunks whatever the timing, so every output element is computed by exactly
// one task in a fixed order and results never depend on scheduling.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moeserve {

class ThreadPool {
 public:
  // num_threads == 0 picks the hardware concurrency.
  explicit ThreadPool(size_t num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Calls fn(begin, end) over [0, n) in chunks of at least `grain` indices; blocks until
  // all chunks are done. The calling thread takes part. Re-entrant calls run inline.
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

  // The process-wide pool used by the CPU backend (sized by MOESERVE_CPU_THREADS).
  static ThreadPool& global();

 private:
  void worker_loop();
  bool run_one_chunk();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0;
  size_t job_chunk_ = 0;
  size_t next_chunk_ = 0;
  size_t num_chunks_ = 0;
  size_t chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::mutex submit_mutex_;
};

}  // namespace moeserve
