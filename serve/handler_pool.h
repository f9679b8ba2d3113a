// The threads that run HTTP handlers, off the io threads: a handler may wait for the engine for
// minutes (a long completion, an SSE stream). The pool grows on demand, one thread per request
// handled at once, up to a cap; threads are kept for the next requests, and a request beyond the
// cap waits for one to be free.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moeserve::serve {

class HandlerPool {
 public:
  explicit HandlerPool(int max_threads);
  ~HandlerPool();  // stop()s

  void post(std::function<void()> task);
  // Runs what is queued, then joins every thread.
  void stop();
  int busy() const;

 private:
  void work();

  const int max_threads_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  int idle_ = 0;  // threads waiting for a task
  bool stopping_ = false;
};

}  // namespace moeserve::serve
