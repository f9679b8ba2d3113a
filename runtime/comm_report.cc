#include "runtime/comm_report.h"

#include <fmt/format.h>

namespace moeserve::runtime {

int64_t layers_of_site(const std::string& site, const ModelConfig& config, const parallel::RankShard& shard) {
  int64_t dense = 0, moe = 0;
  for (int64_t l = shard.layers.begin; l < shard.layers.end; ++l) (config.is_moe_layer(l) ? moe : dense)++;
  if (site == "attention") return dense + moe;
  if (site == "dense_mlp") return dense;
  if (site.rfind("moe", 0) == 0) return moe;
  return 0;
}

std::string comm_report(const Engine& engine) {
  const EngineStats engine_stats = engine.stats();
  const auto& stats = engine_stats.comm;
  const auto& passes = engine_stats.forward_passes;
  const auto& shards = engine_stats.shards;
  const parallel::ParallelPlan& plan = engine.options().plan;
  std::string out =
      fmt::format("communication of plan {} ({} ranks): per rank, site and collective\n", plan.name, plan.world());
  out += fmt::format("{:<4} {:<5} {:<3} {:<3} {:<7} {:<6} {:<13} {:<15} {:>7} {:>12} {:>9} {:>9}\n", "rank", "stage",
                     "dp", "tp", "layers", "passes", "site", "collective", "calls", "bytes", "per-pass", "per-layer");
  for (size_t r = 0; r < stats.size(); ++r) {
    const parallel::RankShard& s = shards[r];
    if (stats[r].by_site.empty())
      out += fmt::format("{:<4} {:<5} {:<3} {:<3} {:<7} {:<6} (no communication)\n", r, s.coord.stage, s.coord.dp_index,
                         s.coord.tp_index, s.layers.size(), passes[r]);
    for (const auto& [key, entry] : stats[r].by_site) {
      const auto& [site, collective] = key;
      const double per_pass = passes[r] ? static_cast<double>(entry.calls) / static_cast<double>(passes[r]) : 0.0;
      const int64_t layers = layers_of_site(site, engine.config(), s);
      const std::string per_layer = layers ? fmt::format("{:.2f}", per_pass / static_cast<double>(layers)) : "-";
      out += fmt::format("{:<4} {:<5} {:<3} {:<3} {:<7} {:<6} {:<13} {:<15} {:>7} {:>12} {:>9.2f} {:>9}\n", r,
                         s.coord.stage, s.coord.dp_index, s.coord.tp_index, s.layers.size(), passes[r], site,
                         comm::collective_name(collective), entry.calls, entry.bytes, per_pass, per_layer);
    }
  }
  return out;
}

}  // namespace moeserve::runtime
