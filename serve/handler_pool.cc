#include "serve/handler_pool.h"

#include <algorithm>

namespace moeserve::serve {

HandlerPool::HandlerPool(int max_threads) : max_threads_(std::max(1, max_threads)) {}

HandlerPool::~HandlerPool() { stop(); }

void HandlerPool::post(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) return;  // the server is gone: the connection it serves is closed anyway
  tasks_.push_back(std::move(task));
  // Idle threads not yet claimed by an earlier task: none left, so start one (under the cap).
  if (static_cast<int>(tasks_.size()) > idle_ && static_cast<int>(threads_.size()) < max_threads_)
    threads_.emplace_back([this] { work(); });
  wake_.notify_one();
}

void HandlerPool::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    --idle_;
    if (tasks_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // what it holds (a connection) goes before the next wait
    lock.lock();
  }
}

int HandlerPool::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(threads_.size()) - idle_ + static_cast<int>(tasks_.size());
}

void HandlerPool::stop() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    threads.swap(threads_);
  }
  wake_.notify_all();
  for (std::thread& t : threads) t.join();
}

}  // namespace moeserve::serve
