// Hardware profiles: every field needs its source; the repository's profiles load.
#include "perf/hardware_profile.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"

namespace moeserve::perf {
namespace {

TEST(HardwareProfile, CurveInterpolatesInLog2AndClamps) {
  const Curve c{{{1, 0.5}, {4, 0.9}}};
  EXPECT_DOUBLE_EQ(c.at(0.5), 0.5);
  EXPECT_DOUBLE_EQ(c.at(2), 0.7);  // log2(2) is halfway between log2(1) and log2(4)
  EXPECT_DOUBLE_EQ(c.at(100), 0.9);
}

TEST(HardwareProfile, RepositoryProfilesLoadWithEverySource) {
  int loaded = 0;
  for (const auto& e : std::filesystem::directory_iterator("perf/profiles")) {
    const HardwareProfile p = load_profile(e.path().string());
    EXPECT_EQ(p.devices % 8, 0) << e.path();       // one 8-GPU node, or several (h200-sxm-2x8-ib)
    EXPECT_EQ(p.sources.size(), 17u) << e.path();  // every field of the format (GPUs: no shared executor)
    for (const auto& [field, source] : p.sources) EXPECT_FALSE(source.empty()) << e.path() << " " << field;
    ++loaded;
  }
  EXPECT_GE(loaded, 5);  // b200, h100, h200, rtx-pro-6000, and the two-node InfiniBand one
}

TEST(HardwareProfile, RoundTripsThroughJson) {
  const HardwareProfile p = load_profile("perf/profiles/h200-sxm-x8.json");
  const HardwareProfile q = profile_from_json(profile_to_json(p), "again");
  EXPECT_EQ(q.memory_gbs, p.memory_gbs);
  EXPECT_EQ(q.link.topology, "nvlink_switch");
  EXPECT_EQ(q.weight_efficiency.points, p.weight_efficiency.points);
  EXPECT_EQ(q.sources, p.sources);
}

TEST(HardwareProfile, AFieldWithoutSourceIsAnErrorNamingIt) {
  nlohmann::ordered_json j = profile_to_json(load_profile("perf/profiles/h200-sxm-x8.json"));
  j["fields"]["memory_gbs"]["source"] = "";
  try {
    profile_from_json(j, "x.json");
    FAIL() << "accepted a field without a source";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.json: field 'memory_gbs' has no source"), std::string::npos) << e.what();
  }
  j["fields"].erase("memory_gbs");
  EXPECT_THROW(profile_from_json(j, "x.json"), Error);
}

TEST(HardwareProfile, UnknownTopologyIsAnError) {
  nlohmann::ordered_json j = profile_to_json(load_profile("perf/profiles/h200-sxm-x8.json"));
  j["fields"]["link_topology"]["value"] = "carrier_pigeon";
  EXPECT_THROW(profile_from_json(j, "x.json"), Error);
}

}  // namespace
}  // namespace moeserve::perf
