// An engine spread over processes (dist/cluster.h). Every process builds an Engine over its
// own ranks; the leader's engine relays each call to the followers over the control plane:
//   submit(step)           the step's layout to every follower (dist/step_codec.h), which
//                          runs it on its ranks (run_follower);
//   wait(ticket)           every follower's answer: the outputs its ranks hold (the last
//                          stage's attention-TP rank 0 of a replica), merged into the leader's;
//   sample_logits_rows()   the rows and options to every follower (a vocab split's ranks may
//                          live on several nodes), the tokens from the node that holds them.
// The collectives themselves run between the ranks over the data plane.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/cluster.h"
#include "runtime/engine.h"

namespace moeserve::runtime {

class LeaderRelay {
 public:
  LeaderRelay(dist::Cluster& cluster, const parallel::ParallelPlan& plan) : cluster_(cluster), plan_(plan) {}
  void submit(StepTicket ticket, const StepPlan& step);
  // Fills the entries of `outputs` that followers' ranks hold.
  void collect(StepTicket ticket, const StepPlan& step, StepOutputs& outputs);
  void send_sample_rows(int replica, const std::vector<int64_t>& rows,
                        const std::vector<ops::SamplingOptions>& options);
  // `tokens` from the follower holding replica's vocab slice 0, when no local rank does.
  void collect_sample_rows(int replica, std::vector<int32_t>& tokens);

 private:
  dist::Cluster& cluster_;
  parallel::ParallelPlan plan_;
};

// A follower's life: runs every command the leader sends on `engine` (built with
// EngineOptions::cluster = &cluster) until the leader closes the cluster. Throws when the
// leader is lost or a step fails.
void run_follower(Engine& engine, dist::Cluster& cluster);

// GPU ranks across processes: the NCCL unique id the leader makes (NcclWorld::unique_id) and
// sends every follower, which receives it while it builds its engine, before any step.
std::vector<std::byte> share_nccl_id(dist::Cluster& cluster);

// The node whose ranks hold replica `replica`'s outputs (the last stage's attention-TP rank 0).
int output_node(const dist::Cluster& cluster, const parallel::ParallelPlan& plan, int replica);

}  // namespace moeserve::runtime
