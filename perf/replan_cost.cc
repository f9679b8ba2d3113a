#include "perf/replan_cost.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "model/deepseek_v3_weights.h"

namespace moeserve::perf {
namespace {

// Bytes of each tensor a rank holds under `plan`, as stored.
std::map<std::string, double> held_by_tensor(const ModelConfig& config, const parallel::ParallelPlan& plan, int rank,
                                             int64_t element_bytes) {
  std::map<std::string, double> out;
  if (rank >= plan.world()) return out;
  for (const WeightSlice& s : weight_slices_of_rank(config, plan, rank, element_bytes))
    out[s.name] += static_cast<double>(s.bytes());
  return out;
}

}  // namespace

ReplanPrediction predict_replan(const ModelConfig& config, const parallel::ParallelPlan& from,
                                const parallel::ParallelPlan& to, const HardwareProfile& profile) {
  MS_CHECK(profile.link.link_gbs > 0 && profile.memory_gbs > 0,
           "hardware profile '{}': link_gbs and memory_gbs must be positive to predict a re-plan", profile.name);
  ReplanPrediction p;
  p.from = from.name;
  p.to = to.name;
  p.hardware = profile.name;
  const int64_t element_bytes = static_cast<int64_t>(profile.element_bytes);
  double total_peer = 0, worst = -1;
  for (int r = 0; r < to.world(); ++r) {
    const std::map<std::string, double> old_held = held_by_tensor(config, from, r, element_bytes);
    double local = 0, peer = 0;
    for (const auto& [name, bytes] : held_by_tensor(config, to, r, element_bytes)) {
      auto it = old_held.find(name);
      const double here = it == old_held.end() ? 0 : std::min(bytes, it->second);
      local += here;
      peer += bytes - here;
    }
    p.local_bytes.push_back(local);
    p.peer_bytes.push_back(peer);
    total_peer += peer;
    // Local copies read and write device memory; receives arrive over the rank's link.
    const double seconds = 2 * local / (profile.memory_gbs * 1e9) + peer / (profile.link.link_gbs * 1e9);
    if (seconds > worst) {
      worst = seconds;
      p.busiest_rank = r;
    }
  }
  p.move_s = std::max(worst, 0.0);
  if (profile.link.fabric_gbs > 0) p.move_s = std::max(p.move_s, total_peer / (profile.link.fabric_gbs * 1e9));
  return p;
}

std::string replan_markdown(const ReplanPrediction& p, const HardwareProfile& profile) {
  double local = 0, peer = 0;
  for (double b : p.local_bytes) local += b;
  for (double b : p.peer_bytes) peer += b;
  const size_t r = static_cast<size_t>(p.busiest_rank);
  std::string out = fmt::format("### Re-plan {} -> {} from resident weights on {}\n\n", p.from, p.to, p.hardware);
  out += fmt::format(
      "- bytes moved: {:.2f} GB copied in place, {:.2f} GB received from peers (all ranks); the busiest rank, {}, "
      "copies {:.2f} GB and receives {:.2f} GB\n",
      local / 1e9, peer / 1e9, p.busiest_rank, p.local_bytes.at(r) / 1e9, p.peer_bytes.at(r) / 1e9);
  out += fmt::format(
      "- links: {:.0f} GB/s per rank and direction ({}), device memory {:.0f} GB/s{}\n", profile.link.link_gbs,
      profile.link.topology, profile.memory_gbs,
      profile.link.fabric_gbs > 0 ? fmt::format(", fabric {:.0f} GB/s", profile.link.fabric_gbs) : std::string());
  out += fmt::format(
      "- predicted move: {:.2f} s (the pause of one step, graph capture and the carried requests' recompute "
      "come on top)\n\n",
      p.move_s);
  return out;
}

}  // namespace moeserve::perf
