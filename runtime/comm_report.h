// A text report of what each rank of an engine communicated: per (site, collective) the
// calls and bytes, per forward pass, and per layer of the kind the site belongs to
// (attention: every layer; dense_mlp: dense layers; moe*: MoE layers of the rank's stage).
#pragma once

#include <string>

#include "runtime/engine.h"

namespace moeserve::runtime {

// Layers of the rank's stage that a site runs once per forward pass; 0 for per-pass sites
// (embedding, lm_head, pipeline).
int64_t layers_of_site(const std::string& site, const ModelConfig& config, const parallel::RankShard& shard);

std::string comm_report(const Engine& engine);

}  // namespace moeserve::runtime
