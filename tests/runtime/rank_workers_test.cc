// Rank workers: jobs run on every rank; a failing rank aborts the world so that peers
// blocked in collectives return, and run() reports the failing rank's error, not the abort.
#include <gtest/gtest.h>

#include <atomic>

#include "core/error.h"
#include "runtime/rank_workers.h"

namespace moeserve::runtime {
namespace {

TEST(RankWorkers, RunsEveryRankEachTime) {
  comm::InProcessWorld world(4);
  RankWorkers workers(4, world);
  std::atomic<int> sum{0};
  for (int i = 0; i < 3; ++i) workers.run([&](int rank) { sum += rank + 1; });
  EXPECT_EQ(sum.load(), 30);
}

TEST(RankWorkers, FailureOfOneRankReleasesItsPeers) {
  comm::InProcessWorld world(3);
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  for (int r = 0; r < 3; ++r) comms.push_back(world.communicator(r, "all", {0, 1, 2}));
  RankWorkers workers(3, world);
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

}  // namespace
}  // namespace moeserve::runtime
