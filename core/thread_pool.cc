#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace moeserve {

namespace {
thread_local bool tls_inside_pool = false;
}

ThreadPool::ThreadPool(size_t num_threads) {
  if (num_threads == 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) worker.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    const char* env = std::getenv("MOESERVE_CPU_THREADS");
    return env ? static_cast<size_t>(std::max(1, std::atoi(env))) : size_t{0};
  }());
  return pool;
}

bool ThreadPool::run_one_chunk() {
  size_t chunk;
  const std::function<void(size_t, size_t)>* job;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (job_ == nullptr || next_chunk_ >= num_chunks_) return false;
    chunk = next_chunk_++;
    job = job_;
  }
  const size_t begin = chunk * job_chunk_;
  const size_t end = std::min(job_n_, begin + job_chunk_);
  tls_inside_pool = true;
  (*job)(begin, end);
  tls_inside_pool = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (++chunks_done_ == num_chunks_) work_done_.notify_all();
  }
  return true;
}

void ThreadPool::worker_loop() {
  uint64_t seen_generation = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
    }
    while (run_one_chunk()) {
    }
  }
}

void ThreadPool::parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t max_chunks = size() * 4;
  const size_t chunk = std::max(grain, (n + max_chunks - 1) / max_chunks);
  if (tls_inside_pool || workers_.empty() || chunk >= n) {
    fn(0, n);
    return;
  }
  // One job at a time: several rank threads may share this pool.
  std::lock_guard<std::mutex> submit_lock(submit_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    next_chunk_ = 0;
    num_chunks_ = (n + chunk - 1) / chunk;
    chunks_done_ = 0;
    ++generation_;
  }
  work_ready_.notify_all();
  while (run_one_chunk()) {
  }
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return chunks_done_ == num_chunks_; });
  job_ = nullptr;
}

}  // namespace moeserve
