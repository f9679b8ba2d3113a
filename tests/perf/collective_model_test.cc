// The alpha-beta collective model against hand-computed times.
#include "perf/collective_model.h"

#include <gtest/gtest.h>

namespace moeserve::perf {
namespace {

LinkProfile link(const std::string& topology, double link_gbs, double fabric_gbs) {
  LinkProfile l;
  l.topology = topology;
  l.alpha_us.points = {{2, 10}, {8, 40}};
  l.link_gbs = link_gbs;
  l.fabric_gbs = fabric_gbs;
  return l;
}

TEST(CollectiveModel, RingAllReduceOnNvlink) {
  // 8 ranks, 1 MB: 2 * 7/8 MB on the wire at 100 GB/s = 17.5 us, plus 40 us.
  EXPECT_NEAR(collective_us(link("nvlink_switch", 100, 0), CollectiveKind::AllReduce, 8, 1e6), 57.5, 1e-9);
}

TEST(CollectiveModel, AlphaInterpolatesInLog2OfRanks) {
  // 4 ranks sit halfway (in log2) between 2 and 8: 25 us; 1 byte adds next to nothing.
  EXPECT_NEAR(collective_us(link("nvlink_switch", 100, 0), CollectiveKind::AllToAll, 4, 0), 25.0, 1e-9);
}

TEST(CollectiveModel, PcieHostSharesTheFabricAndCrossesTwice) {
  // 8 ranks share 200 GB/s: 25 GB/s each, halved through the host: 12.5 GB/s.
  const LinkProfile l = link("pcie_host", 63, 200);
  EXPECT_NEAR(rank_bandwidth_gbs(l, 8), 12.5, 1e-12);
  // all-gather of 1 MB blocks: 7 MB at 12.5 GB/s = 560 us + 40 us.
  EXPECT_NEAR(collective_us(l, CollectiveKind::AllGather, 8, 1e6), 600.0, 1e-9);
  // A switch shares the fabric but is crossed once.
  EXPECT_NEAR(rank_bandwidth_gbs(link("pcie_switch", 63, 200), 8), 25.0, 1e-12);
  // NVSwitch ignores a fabric limit (non-blocking).
  EXPECT_NEAR(rank_bandwidth_gbs(link("nvlink_switch", 63, 200), 8), 63.0, 1e-12);
}

TEST(CollectiveModel, SendMovesOnePairAndOneRankIsFree) {
  // One pair active gets min(link 100, fabric 50 / 1) = 50 GB/s: 10 us + 1e6 / 50e3 = 30 us.
  EXPECT_NEAR(collective_us(link("pcie_switch", 100, 50), CollectiveKind::SendRecv, 2, 1e6), 10 + 1e6 / 50e3, 1e-9);
  EXPECT_EQ(collective_us(link("nvlink_switch", 100, 0), CollectiveKind::AllReduce, 1, 1e9), 0.0);
}

TEST(CollectiveModel, BytesOnTheWire) {
  EXPECT_DOUBLE_EQ(bytes_on_wire(CollectiveKind::AllReduce, 4, 400), 600);
  EXPECT_DOUBLE_EQ(bytes_on_wire(CollectiveKind::AllGather, 4, 100), 300);
  EXPECT_DOUBLE_EQ(bytes_on_wire(CollectiveKind::AllToAll, 4, 400), 300);
  EXPECT_DOUBLE_EQ(bytes_on_wire(CollectiveKind::SendRecv, 4, 400), 400);
}

}  // namespace
}  // namespace moeserve::perf
