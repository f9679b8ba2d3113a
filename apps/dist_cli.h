// The multi-process launch options of `generate` and `serve` (dist/launch.h): SGLang's
// --nnodes, --node-rank, --dist-init-addr (vLLM's --data-parallel-address is not the same
// contract: no alias), the timeouts, and the cluster they join.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

#include "dist/cluster.h"
#include "dist/launch.h"
#include "model/model_source.h"
#include "runtime/engine.h"

namespace moeserve::apps {

void add_dist_flags(CLI::App* cmd, dist::LaunchArgs& args);

// What every node must agree on: the binary, the model, the plan and the engine options.
dist::Fingerprint engine_fingerprint(const ModelSource& model, const runtime::EngineOptions& options);

// The cluster the flags and environment describe, joined (null for one process). Prints the
// node's place to stderr.
std::unique_ptr<dist::Cluster> join_cluster(const dist::LaunchArgs& args, const ModelSource& model,
                                            const runtime::EngineOptions& options);

}  // namespace moeserve::apps
