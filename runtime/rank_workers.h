// One persistent thread per rank. The leader (the caller of run()) hands every rank the same
// job and waits for all of them: SPMD execution of one step. When a rank fails, the world is
// aborted so that its peers, blocked in collectives, fail too instead of waiting forever;
// run() then rethrows the first failure (the lowest rank whose error is not the abort).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/world.h"

namespace moeserve::runtime {

// Polls `done` for up to spin_us microseconds (not at all when spin_us <= 0); true once it
// holds, false when the time ran out first (the caller then sleeps on a condition variable).
bool spin_until(int spin_us, const std::function<bool()>& done);

class RankWorkers {
 public:
  // spin_us > 0: a thread waiting for the next job (or the leader for the job's end) polls
  // for that long before it sleeps. GPU ranks' steps follow each other microseconds apart and
  // a sleeping thread takes tens of microseconds to wake, three wake-ups per step; CPU ranks
  // compute on the cores a spinning thread would take (spin_us = 0).
  RankWorkers(int ranks, comm::World& world, int spin_us = 0);
  ~RankWorkers();
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // Runs job(rank) on every rank's thread; returns when all are done.
  void run(const std::function<void(int rank)>& job);
  // The same in two halves: start() hands the job (a copy) to the ranks and returns at once;
  // finish() waits for every rank and rethrows as run() does. One job at a time.
  void start(std::function<void(int rank)> job);
  void finish();
  bool running() const { return started_; }

 private:
  void loop(int rank);

  comm::World& world_;
  std::vector<std::thread> threads_;

  const int spin_us_;
  std::mutex mutex_;
  std::condition_variable job_ready_, job_done_;
  std::function<void(int)> job_;
  bool started_ = false;  // the leader's: between start() and finish()
  // Written under mutex_; atomic so that spinning threads may read them without it.
  std::atomic<uint64_t> generation_ = 0;
  std::atomic<int> finished_ = 0;
  std::atomic<bool> stopping_ = false;
  std::vector<std::string> errors_;    // per rank, this job
  std::vector<bool> aborted_by_peer_;  // the rank failed only because the world was aborted
};

}  // namespace moeserve::runtime
