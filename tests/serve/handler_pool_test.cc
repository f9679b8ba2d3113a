// serve::HandlerPool: a task never waits behind a running one while the pool is under its cap
// (a long completion must not hold up /health), and beyond the cap tasks wait their turn.
#include "serve/handler_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace moeserve::serve {
namespace {

// Tasks that block until released, counting how many run at once.
struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
  std::atomic<int> running{0}, done{0};

  void task() {
    ++running;
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [this] { return open; });
    --running;
    ++done;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    open = true;
    cv.notify_all();
  }
  bool wait_running(int n) {
    for (int i = 0; i < 500 && running.load() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return running.load() == n;
  }
};

TEST(HandlerPool, EveryTaskRunsAtOnceUnderTheCap) {
  HandlerPool pool(8);
  Gate gate;
  for (int i = 0; i < 6; ++i) pool.post([&] { gate.task(); });
  EXPECT_TRUE(gate.wait_running(6));
  gate.release();
  pool.stop();
  EXPECT_EQ(gate.done.load(), 6);
}

TEST(HandlerPool, BeyondTheCapTasksWaitAndThreadsAreReused) {
  HandlerPool pool(3);
  Gate gate;
  for (int i = 0; i < 5; ++i) pool.post([&] { gate.task(); });
  EXPECT_TRUE(gate.wait_running(3));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(gate.running.load(), 3);  // the cap holds
  EXPECT_EQ(pool.busy(), 5);
  gate.release();
  pool.stop();
  EXPECT_EQ(gate.done.load(), 5);
}

}  // namespace
}  // namespace moeserve::serve
