#include "runtime/rank_workers.h"

#include <chrono>

#include "core/error.h"

namespace moeserve::runtime {

RankWorkers::RankWorkers(int ranks, comm::World& world, int spin_us)
    : world_(world), spin_us_(spin_us), errors_(ranks), aborted_by_peer_(ranks, false) {
  for (int r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
}

RankWorkers::~RankWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  job_ready_.notify_all();
  for (auto& t : threads_) t.join();
}

bool spin_until(int spin_us, const std::function<bool()>& done) {
  if (spin_us <= 0) return done();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return false;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

void RankWorkers::loop(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    spin_until(spin_us_, [&] { return stopping_.load() || generation_.load() != seen; });
    {
      std::unique_lock<std::mutex> lock(mutex_);
      job_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = &job_;  // unchanged until every rank has finished it
    }
    std::string error;
    try {
      (*job)(rank);
    } catch (const std::exception& e) {
      error = e.what();
    }
    // A rank that failed inside a collective because a peer aborted the world is not the cause.
    const bool by_peer = error.rfind("communication aborted", 0) == 0;
    if (!error.empty()) world_.abort(fmt::format("rank {} failed: {}", rank, error));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      errors_[rank] = std::move(error);
      aborted_by_peer_[rank] = by_peer;
      if (++finished_ == size()) job_done_.notify_all();
    }
  }
}

void RankWorkers::run(const std::function<void(int rank)>& job) {
  start(job);
  finish();
}

void RankWorkers::start(std::function<void(int rank)> job) {
  MS_CHECK(!started_, "RankWorkers: a job is already running");
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = std::move(job);
  finished_ = 0;
  ++generation_;
  started_ = true;
  job_ready_.notify_all();
}

void RankWorkers::finish() {
  MS_CHECK(started_, "RankWorkers: no job to finish");
  spin_until(spin_us_, [&] { return finished_.load() == size(); });
  std::unique_lock<std::mutex> lock(mutex_);
  job_done_.wait(lock, [&] { return finished_ == size(); });
  job_ = nullptr;
  started_ = false;
  // The root cause: the first rank whose error is not "aborted because a peer failed".
  for (int pass = 0; pass < 2; ++pass)
    for (int r = 0; r < size(); ++r)
      if (!errors_[r].empty() && (pass == 1 || !aborted_by_peer_[r])) fail("{}", errors_[r]);
}

}  // namespace moeserve::runtime
