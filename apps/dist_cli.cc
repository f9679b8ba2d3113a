#include "apps/dist_cli.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"

namespace moeserve::apps {

void add_dist_flags(CLI::App* cmd, dist::LaunchArgs& args) {
  cmd->add_option("--nnodes", args.nnodes,
                  "Processes of this server (one per node, or one per GPU); default: WORLD_SIZE (torchrun), "
                  "SLURM_NTASKS, else 1");
  cmd->add_option("--node-rank", args.node_rank,
                  "This process's index (0: the leader, which serves HTTP); default: RANK or SLURM_PROCID");
  cmd->add_option("--dist-init-addr", args.dist_init_addr,
                  "HOST:PORT where the leader listens for the other nodes; default: MASTER_ADDR:MASTER_PORT");
  cmd->add_option("--dist-join-timeout", args.join_timeout_s, "Seconds to wait for every node to join")
      ->capture_default_str();
  cmd->add_option("--dist-heartbeat-timeout", args.heartbeat_timeout_s,
                  "Seconds of silence after which a node counts as lost")
      ->capture_default_str();
}

dist::Fingerprint engine_fingerprint(const ModelSource& model, const runtime::EngineOptions& o) {
  const ModelConfig& c = model.config;
  const parallel::ParallelPlan& p = o.plan;
  const std::string name = std::filesystem::path(model.spec).filename().string();
  return {
      {"version", dist::binary_version()},
      {"model",
       fmt::format("{} (hidden {}, layers {}, experts {}, vocab {}, seed {})", name.empty() ? model.spec : name,
                   c.hidden_size, c.num_hidden_layers, c.n_routed_experts, c.vocab_size, model.seed)},
      {"plan", fmt::format("{} (pp {}, attn_tp {}, attn_dp {}, moe_ep {}, moe_tp {})", p.name, p.pp, p.attn_tp,
                           p.attn_dp, p.moe_ep, p.moe_tp)},
      {"backend", o.backend},
      {"kv cache", fmt::format("{} pages of {}{}", o.num_pages, o.page_size, o.kv_cache_fp8 ? ", fp8" : "")},
      {"reduction plan", o.run.reduction_plan.name},
      {"batch invariant", o.batch_invariant ? "on" : "off"},
      {"pipeline micro-batches", fmt::format("{} deep {}", o.pp_max_micro_batch_size, o.pp_async_batch_depth)},
  };
}

std::unique_ptr<dist::Cluster> join_cluster(const dist::LaunchArgs& args, const ModelSource& model,
                                            const runtime::EngineOptions& options) {
  const dist::Launch launch = dist::resolve_launch(args);
  if (launch.nnodes == 1) return nullptr;
  dist::ClusterOptions o;
  o.nnodes = launch.nnodes;
  o.node_rank = launch.node_rank;
  o.host = launch.host;
  o.port = launch.port;
  o.world = options.plan.world();
  o.fingerprint = engine_fingerprint(model, options);
  o.join_timeout_s = args.join_timeout_s;
  o.heartbeat_timeout_s = args.heartbeat_timeout_s;
  o.heartbeat_interval_s = std::min(0.5, args.heartbeat_timeout_s / 4);
  std::fprintf(stderr, "moeserve: node %d of %d (%s), %s at %s:%d\n", o.node_rank, o.nnodes, launch.source.c_str(),
               o.node_rank == 0 ? "listening" : "joining the leader", o.host.c_str(), o.port);
  std::unique_ptr<dist::Cluster> cluster = dist::Cluster::join(o);
  std::fprintf(stderr, "moeserve: every node joined; this is %s\n", cluster->describe(o.node_rank).c_str());
  return cluster;
}

}  // namespace moeserve::apps
