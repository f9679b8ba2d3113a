#include "runtime/multinode.h"

#include "core/error.h"
#include "dist/step_codec.h"
#include "dist/wire.h"
#include "runtime/rank_devices.h"

namespace moeserve::runtime {

namespace {

enum Frame : uint32_t {
  kStep = dist::kUserFrame,  // ticket, step layout
  kStepDone,                 // ticket, the outputs the follower's ranks hold
  kSampleRows,               // replica, rows, options
  kSampled,                  // tokens (empty when the follower holds no vocab slice 0 of the replica)
  kNcclId,                   // the NCCL unique id of a GPU world across processes
};

void encode_tensor(const Tensor& t, dist::ByteWriter& w) {
  w.put<uint8_t>(t.empty() ? 0 : 1);
  if (t.empty()) return;
  w.put<int32_t>(static_cast<int32_t>(t.dtype()));
  w.put_vector(t.shape());
  w.append(t.raw(), t.nbytes());
}

Tensor decode_tensor(dist::ByteReader& r) {
  if (r.get<uint8_t>("tensor present") == 0) return {};
  const auto dtype = static_cast<DType>(r.get<int32_t>("tensor dtype"));
  const auto shape = r.get_vector<int64_t>("tensor shape");
  Tensor t(dtype, Shape(shape.begin(), shape.end()));
  r.take(t.raw(), t.nbytes(), "tensor data");
  return t;
}

void encode_candidates(const sample::SampleCandidates& c, dist::ByteWriter& w) {
  w.put<int64_t>(c.rows);
  w.put<int64_t>(c.count);
  w.put_vector(c.values);
  w.put_vector(c.ids);
  w.put_vector(c.normaliser);
}

sample::SampleCandidates decode_candidates(dist::ByteReader& r) {
  sample::SampleCandidates c;
  c.rows = r.get<int64_t>("candidate rows");
  c.count = r.get<int64_t>("candidate count");
  c.values = r.get_vector<float>("candidate values");
  c.ids = r.get_vector<int32_t>("candidate ids");
  c.normaliser = r.get_vector<double>("candidate normaliser");
  return c;
}

dist::Frame expect_frame(dist::Cluster& cluster, int node, uint32_t type) {
  dist::Frame frame = cluster.receive_from(node);
  MS_CHECK(frame.type == type, "{}: expected control frame {}, got {}", cluster.describe(node), type, frame.type);
  return frame;
}

}  // namespace

int output_node(const dist::Cluster& cluster, const parallel::ParallelPlan& plan, int replica) {
  return cluster.node_of_rank(parallel::rank_of(plan, plan.pp - 1, replica, 0));
}

std::vector<std::byte> share_nccl_id(dist::Cluster& cluster) {
  if (cluster.leader()) {
    std::vector<std::byte> id = NcclWorld::unique_id();
    cluster.broadcast(kNcclId, id);
    return id;
  }
  return expect_frame(cluster, 0, kNcclId).payload;
}

void LeaderRelay::submit(StepTicket ticket, const StepPlan& step) {
  dist::ByteWriter w;
  w.put<uint64_t>(ticket);
  dist::encode_step(step, w);
  cluster_.broadcast(kStep, w.bytes());
}

void LeaderRelay::collect(StepTicket ticket, const StepPlan& step, StepOutputs& outputs) {
  for (int node = 1; node < cluster_.nnodes(); ++node) {
    const dist::Frame frame = expect_frame(cluster_, node, kStepDone);
    dist::ByteReader r(frame.payload, "step outputs from " + cluster_.describe(node));
    const auto got = r.get<uint64_t>("ticket");
    MS_CHECK(got == ticket, "{} answered step {} while step {} was awaited", cluster_.describe(node), got, ticket);
    const auto entries = r.get<uint64_t>("entries");
    for (uint64_t e = 0; e < entries; ++e) {
      const auto m = r.get<uint64_t>("micro-batch");
      const auto dp = r.get<uint64_t>("replica");
      MS_CHECK(m < step.micro_batches.size() && dp < static_cast<uint64_t>(plan_.attn_dp),
               "{}: outputs for micro-batch {} replica {} outside the step", cluster_.describe(node), m, dp);
      outputs.rows[m][dp] = decode_tensor(r);
      outputs.candidates[m][dp] = decode_candidates(r);
      outputs.maxima[m][dp] = r.get_vector<float>("maxima");
    }
    r.expect_end();
  }
}

void LeaderRelay::send_sample_rows(int replica, const std::vector<int64_t>& rows,
                                   const std::vector<ops::SamplingOptions>& options) {
  dist::ByteWriter w;
  w.put<int32_t>(replica);
  w.put_vector(rows);
  w.put_vector(options);
  cluster_.broadcast(kSampleRows, w.bytes());
}

void LeaderRelay::collect_sample_rows(int replica, std::vector<int32_t>& tokens) {
  const int holder = output_node(cluster_, plan_, replica);
  for (int node = 1; node < cluster_.nnodes(); ++node) {
    const dist::Frame frame = expect_frame(cluster_, node, kSampled);
    dist::ByteReader r(frame.payload, "sampled tokens from " + cluster_.describe(node));
    std::vector<int32_t> drawn = r.get_vector<int32_t>("tokens");
    if (node == holder) tokens = std::move(drawn);
  }
}

namespace {

void follow_step(Engine& engine, dist::Cluster& cluster, const dist::Frame& frame) {
  dist::ByteReader r(frame.payload, "a step from the leader");
  const auto ticket = r.get<uint64_t>("ticket");
  StepPlan step = dist::decode_step(r);
  r.expect_end();
  const size_t micro_batches = step.micro_batches.size();
  StepOutputs out = engine.wait(engine.submit(std::move(step)));
  const parallel::ParallelPlan& plan = engine.options().plan;
  std::vector<int> held;  // the replicas whose outputs this node's ranks hold
  for (int dp = 0; dp < plan.attn_dp; ++dp)
    if (output_node(cluster, plan, dp) == cluster.node_rank()) held.push_back(dp);
  dist::ByteWriter w;
  w.put<uint64_t>(ticket);
  w.put<uint64_t>(held.size() * micro_batches);
  for (size_t m = 0; m < micro_batches; ++m)
    for (int dp : held) {
      w.put<uint64_t>(m);
      w.put<uint64_t>(static_cast<uint64_t>(dp));
      encode_tensor(out.rows[m][dp], w);
      encode_candidates(out.candidates[m][dp], w);
      w.put_vector(out.maxima[m][dp]);
    }
  cluster.reply(kStepDone, w.bytes());
}

void follow_sample_rows(Engine& engine, dist::Cluster& cluster, const dist::Frame& frame) {
  dist::ByteReader r(frame.payload, "a sample-rows call from the leader");
  const int replica = r.get<int32_t>("replica");
  const auto rows = r.get_vector<int64_t>("rows");
  const auto options = r.get_vector<ops::SamplingOptions>("options");
  r.expect_end();
  std::vector<int32_t> tokens = engine.sample_logits_rows(replica, rows, options);
  const bool holds = output_node(cluster, engine.options().plan, replica) == cluster.node_rank();
  dist::ByteWriter w;
  w.put_vector(holds ? tokens : std::vector<int32_t>{});
  cluster.reply(kSampled, w.bytes());
}

}  // namespace

void run_follower(Engine& engine, dist::Cluster& cluster) {
  MS_CHECK(!cluster.leader(), "run_follower: node 0 is the leader");
  for (;;) {
    const dist::Frame frame = cluster.next_command();
    switch (frame.type) {
      case dist::kGoodbyeFrame:
        return;
      case kStep:
        follow_step(engine, cluster, frame);
        break;
      case kSampleRows:
        follow_sample_rows(engine, cluster, frame);
        break;
      default:
        fail("node {}: unknown control frame {} from the leader", cluster.node_rank(), frame.type);
    }
  }
}

}  // namespace moeserve::runtime
