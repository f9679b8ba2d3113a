// Rank workers: jobs run on every rank; a failing rank aborts the world so that peers
// blocked in collectives return, and run() (or finish() after start()) reports the failing
// rank's error, not the abort.
#include "runtime/rank_workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/in_process.h"
#include "core/error.h"

namespace moeserve::runtime {
namespace {

// Sleeping workers (CPU ranks) and workers that poll for 2 ms before sleeping (GPU ranks).
class EveryWaitMode : public ::testing::TestWithParam<int> {};

TEST_P(EveryWaitMode, RunsEveryRankEachTime) {
  comm::InProcessWorld world(4);
  RankWorkers workers(4, world, GetParam());
  std::atomic<int> sum{0};
  for (int i = 0; i < 3; ++i) workers.run([&](int rank) { sum += rank + 1; });
  EXPECT_EQ(sum.load(), 30);
  // Jobs far apart (the pollers have gone to sleep) and back to back, each seen exactly once.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::vector<std::atomic<int>> per_rank(4);
  for (int i = 0; i < 200; ++i) workers.run([&](int rank) { ++per_rank[rank]; });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(per_rank[r].load(), 200) << "rank " << r;
}

TEST_P(EveryWaitMode, FailureOfOneRankReleasesItsPeers) {
  comm::InProcessWorld world(3);
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  for (int r = 0; r < 3; ++r) comms.push_back(world.communicator(r, "all", {0, 1, 2}));
  RankWorkers workers(3, world, GetParam());
  try {
    workers.run([&](int rank) {
      if (rank == 1) fail("rank 1 cannot load 'model.layers.3.mlp.experts.7.up_proj.weight'");
      comms[rank]->barrier();  // ranks 0 and 2 would wait forever without the abort
    });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 1 cannot load 'model.layers.3.mlp.experts.7.up_proj.weight'");
  }
  EXPECT_TRUE(world.aborted());
}

// start() returns while the ranks work (the leader can feed them), finish() waits and reports
// as run() does; a second start() before finish() is refused.
TEST_P(EveryWaitMode, StartReturnsAtOnceAndFinishWaitsAndReports) {
  comm::InProcessWorld world(2);
  RankWorkers workers(2, world, GetParam());
  std::atomic<bool> go{false};
  std::atomic<int> done{0};
  workers.start([&](int) {
    while (!go.load()) std::this_thread::yield();
    ++done;
  });
  EXPECT_TRUE(workers.running());
  EXPECT_THROW(workers.start([](int) {}), Error);
  EXPECT_EQ(done.load(), 0);  // the ranks wait for the leader, which is not blocked
  go = true;
  workers.finish();
  EXPECT_FALSE(workers.running());
  EXPECT_EQ(done.load(), 2);
  workers.start([](int rank) {
    if (rank == 0) fail("rank 0 failed in a started job");
  });
  try {
    workers.finish();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 0 failed in a started job");
  }
  EXPECT_THROW(workers.finish(), Error);  // nothing started
}

INSTANTIATE_TEST_SUITE_P(Waits, EveryWaitMode, ::testing::Values(0, 2000), [](const auto& info) {
  return info.param ? std::string("Polling") : std::string("Sleeping");
});

}  // namespace
}  // namespace moeserve::runtime
