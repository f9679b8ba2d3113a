// The processes' side of a multi-node server, with "nodes" as threads of this test on
// loopback: collectives over the data plane give the same bits as the in-process world; the
// rendezvous refuses a joiner whose fingerprint differs, saying what; a node that goes away
// aborts the others' collectives naming it; the launch flags and environments; the step
// layout on the wire.
#include "dist/cluster.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "comm/in_process.h"
#include "core/error.h"
#include "dist/launch.h"
#include "dist/step_codec.h"

namespace moeserve::dist {
namespace {

int free_port() {
  Listener probe("127.0.0.1", 0);
  return probe.port();
}

ClusterOptions options_for(int nnodes, int node, int port, int world) {
  ClusterOptions o;
  o.nnodes = nnodes;
  o.node_rank = node;
  o.port = port;
  o.world = world;
  o.fingerprint = {{"version", binary_version()}, {"plan", "tp4"}};
  o.join_timeout_s = 20;
  return o;
}

// Joins `nnodes` clusters at once (one thread each, as processes would).
std::vector<std::unique_ptr<Cluster>> join_all(int nnodes, int world) {
  const int port = free_port();
  std::vector<std::unique_ptr<Cluster>> nodes(nnodes);
  std::vector<std::thread> threads;
  for (int n = 0; n < nnodes; ++n)
    threads.emplace_back([&, n] { nodes[n] = Cluster::join(options_for(nnodes, n, port, world)); });
  for (auto& t : threads) t.join();
  return nodes;
}

// What each rank computes: one result buffer per collective, concatenated.
using Scenario = std::function<std::vector<std::byte>(int rank, int world, comm::World&)>;

std::vector<std::byte> bytes_of(const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  return {b, b + n};
}

void append(std::vector<std::byte>& out, const std::vector<std::byte>& more) {
  out.insert(out.end(), more.begin(), more.end());
}

float value(int rank, size_t i) { return static_cast<float>(rank + 1) * 0.1f + i * 1e-3f + 1e7f * (i % 3 == 0); }

std::vector<std::byte> every_collective(int rank, int world, comm::World& w) {
  std::vector<int> all(world);
  for (int r = 0; r < world; ++r) all[r] = r;
  std::unique_ptr<comm::Communicator> c = w.communicator(rank, "all", all);
  std::vector<int> evens;  // a second group on the same connections
  for (int r = 0; r < world; r += 2) evens.push_back(r);
  std::vector<std::byte> out;
  std::vector<float> data(37);
  for (size_t i = 0; i < data.size(); ++i) data[i] = value(rank, i);
  c->all_reduce_sum(data.data(), data.size(), DType::F32);
  append(out, bytes_of(data.data(), data.size() * 4));
  std::vector<uint16_t> half(9);
  for (size_t i = 0; i < half.size(); ++i) half[i] = f32_to_bf16(value(rank, i));
  c->all_reduce_sum(half.data(), half.size(), DType::BF16);
  append(out, bytes_of(half.data(), half.size() * 2));
  std::vector<float> gathered(5 * world);
  c->all_gather(data.data(), gathered.data(), 5, DType::F32);
  append(out, bytes_of(gathered.data(), gathered.size() * 4));
  std::vector<float> scattered(3);
  std::vector<float> full(3 * world);
  for (size_t i = 0; i < full.size(); ++i) full[i] = value(rank, i);
  c->reduce_scatter_sum(full.data(), scattered.data(), 3, DType::F32);
  append(out, bytes_of(scattered.data(), 12));
  std::vector<size_t> send_counts(world), recv_counts(world);
  for (int r = 0; r < world; ++r) send_counts[r] = (rank + r) % 3, recv_counts[r] = (r + rank) % 3;
  std::vector<int32_t> send(world * 3), recv(world * 3, -1);
  for (size_t i = 0; i < send.size(); ++i) send[i] = rank * 100 + static_cast<int32_t>(i);
  c->all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::I32);
  append(out, bytes_of(recv.data(), recv.size() * 4));
  int32_t token = rank * 7;
  c->broadcast(&token, 1, DType::I32, world - 1);
  append(out, bytes_of(&token, 4));
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  c->send(&token, 1, DType::I32, next);
  int32_t from_prev = -1;
  c->recv(&from_prev, 1, DType::I32, prev);
  append(out, bytes_of(&from_prev, 4));
  if (rank % 2 == 0) {
    std::unique_ptr<comm::Communicator> even = w.communicator(rank, "evens", evens);
    float x = value(rank, 1);
    even->all_reduce_sum(&x, 1, DType::F32);
    append(out, bytes_of(&x, 4));
  }
  c->barrier();
  return out;
}

// Runs the scenario on `world` ranks split over `nnodes` nodes, one thread per rank.
std::vector<std::vector<std::byte>> run_on_cluster(int nnodes, int world, const Scenario& scenario) {
  auto nodes = join_all(nnodes, world);
  std::vector<std::vector<std::byte>> results(world);
  std::vector<std::thread> threads;
  for (auto& node : nodes)
    for (int rank : node->local_ranks())
      threads.emplace_back([&, rank, n = node.get()] { results[rank] = scenario(rank, world, n->world()); });
  for (auto& t : threads) t.join();
  for (int n = nnodes - 1; n >= 0; --n) nodes[n].reset();  // followers first, then the leader
  return results;
}

std::vector<std::vector<std::byte>> run_in_process(int world, const Scenario& scenario) {
  comm::InProcessWorld w(world);
  std::vector<std::vector<std::byte>> results(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] { results[rank] = scenario(rank, world, w); });
  for (auto& t : threads) t.join();
  return results;
}

TEST(MeshWorld, CollectivesMatchTheInProcessWorldBitwise) {
  const auto reference = run_in_process(4, every_collective);
  for (int nnodes : {2, 4}) {
    const auto got = run_on_cluster(nnodes, 4, every_collective);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(got[r], reference[r]) << nnodes << " nodes, rank " << r;
  }
}

TEST(Cluster, DescribesNodesAndPlacesRanksContiguously) {
  auto nodes = join_all(2, 4);
  EXPECT_EQ(nodes[1]->local_ranks(), (std::vector<int>{2, 3}));
  EXPECT_EQ(nodes[0]->describe(1), "node 1 (ranks 2-3)");
  EXPECT_EQ(nodes[0]->node_of_rank(3), 1);
  EXPECT_TRUE(nodes[0]->leader());
  EXPECT_EQ(nodes[0]->lost(), "");
}

TEST(Cluster, ControlFramesReachFollowersAndBack) {
  auto nodes = join_all(3, 3);
  const std::vector<std::byte> payload = bytes_of("step", 4);
  nodes[0]->broadcast(kUserFrame, payload);
  for (int n = 1; n < 3; ++n) {
    const Frame got = nodes[n]->next_command();
    EXPECT_EQ(got.type, kUserFrame);
    EXPECT_EQ(got.payload, payload);
    nodes[n]->reply(kUserFrame + 1, bytes_of(&n, sizeof n));
  }
  for (int n = 1; n < 3; ++n) EXPECT_EQ(nodes[0]->receive_from(n).payload, bytes_of(&n, sizeof n));
  nodes[0].reset();  // the leader closes the cluster: followers get a goodbye
  for (int n = 1; n < 3; ++n) EXPECT_EQ(nodes[n]->next_command().type, kGoodbyeFrame);
}

TEST(Cluster, RefusesAJoinerWhoseFingerprintDiffers) {
  const int port = free_port();
  ClusterOptions leader = options_for(2, 0, port, 2);
  leader.join_timeout_s = 3;
  ClusterOptions joiner = options_for(2, 1, port, 2);
  joiner.fingerprint[1].second = "ep2";
  std::string leader_error;
  std::thread t([&] {
    try {
      Cluster::join(leader);
    } catch (const Error& e) {
      leader_error = e.what();
    }
  });
  try {
    Cluster::join(joiner);
    ADD_FAILURE() << "the joiner was admitted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("plan: 'tp4' on the leader, 'ep2' on node 1"), std::string::npos) << e.what();
  }
  t.join();
  EXPECT_NE(leader_error.find("only 1 of 2 nodes joined"), std::string::npos) << leader_error;
}

TEST(Cluster, FingerprintDifferenceNamesEveryField) {
  const Fingerprint a{{"version", "1"}, {"model", "m"}, {"plan", "tp4"}};
  const Fingerprint b{{"version", "2"}, {"model", "m"}, {"plan", "ep4"}};
  EXPECT_EQ(fingerprint_difference(a, a, 1), "");
  EXPECT_EQ(fingerprint_difference(a, b, 3),
            "version: '1' on the leader, '2' on node 3; plan: 'tp4' on the leader, 'ep4' on node 3");
}

TEST(Cluster, ALostNodeAbortsThePeersCollectivesNamingIt) {
  auto nodes = join_all(2, 2);
  std::string error;
  std::thread leader_rank([&] {
    auto c = nodes[0]->world().communicator(0, "all", {0, 1});
    float x = 1;
    try {
      c->all_reduce_sum(&x, 1, DType::F32);  // rank 1 never comes
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  nodes[1].reset();  // as if the process died: its connections close without a goodbye
  leader_rank.join();
  EXPECT_NE(error.find("communication aborted: node 1 (rank 1) lost"), std::string::npos) << error;
  EXPECT_NE(nodes[0]->lost().find("node 1 (rank 1) lost"), std::string::npos) << nodes[0]->lost();
  EXPECT_THROW(nodes[0]->receive_from(1), Error);
}

TEST(Launch, FlagsThenTorchrunThenSlurm) {
  std::map<std::string, std::string> env;
  const EnvLookup lookup = [&](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  Launch one = resolve_launch({}, lookup);
  EXPECT_EQ(one.nnodes, 1);
  LaunchArgs flags;
  flags.nnodes = 2;
  flags.node_rank = 1;
  flags.dist_init_addr = "10.0.0.1:5000";
  Launch l = resolve_launch(flags, lookup);
  EXPECT_EQ(l.source, "flags");
  EXPECT_EQ(l.host, "10.0.0.1");
  EXPECT_EQ(l.port, 5000);
  env = {{"WORLD_SIZE", "4"}, {"RANK", "3"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  l = resolve_launch({}, lookup);
  EXPECT_EQ(l.source, "torchrun");
  EXPECT_EQ(l.nnodes, 4);
  EXPECT_EQ(l.node_rank, 3);
  EXPECT_EQ(l.host, "h");
  env = {{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"}};
  flags = {};
  flags.dist_init_addr = "[::1]:7000";
  l = resolve_launch(flags, lookup);
  EXPECT_EQ(l.source, "SLURM");
  EXPECT_EQ(l.node_rank, 1);
  EXPECT_EQ(l.host, "::1");
  env = {{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"}};
  try {
    resolve_launch({}, lookup);
    ADD_FAILURE() << "no address was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dist-init-addr"), std::string::npos) << e.what();
  }
  env = {{"WORLD_SIZE", "two"}};
  EXPECT_THROW(resolve_launch({}, lookup), Error);
}

step::StepPlan decode_step_plan(int batch) {
  step::StepPlan step;
  step.micro_batches.resize(1);
  step.micro_batches[0].replicas.resize(2);
  for (auto& rb : step.micro_batches[0].replicas) {
    ForwardBatch& b = rb.batch;
    b.max_pages_per_seq = 4;
    for (int s = 0; s < batch; ++s) {
      b.tokens.push_back(100 + s);
      b.positions.push_back(300 + s);
      b.seq_of_token.push_back(s);
      b.slots.push_back(64 * s + 11);
      for (int p = 0; p < 4; ++p) b.block_tables.push_back(s * 4 + p);
      b.logit_rows.push_back(s);
      b.sampling.push_back({0.7f, 5, 0.9f, 0.0f, 42, static_cast<uint64_t>(s)});
      rb.sequences.push_back(s);
      rb.first_row.push_back(s);
      rb.num_rows.push_back(1);
    }
    b.draw = DrawKind::kSampled;
    b.logit_adjust.push_back({0, 7, -1.5f, 1.2f, 0.25f});
    b.mtp_tokens = b.tokens;  // a NEXTN draft step's fields
    b.mtp_draft = true;
    for (int s = 0; s < batch; ++s) b.mtp_hidden_rows.push_back(2 * s + 1);
  }
  return step;
}

bool same_batch(const ForwardBatch& a, const ForwardBatch& b) {
  auto same_sampling = [](const auto& x, const auto& y) {
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
  };
  return a.tokens == b.tokens && a.positions == b.positions && a.seq_of_token == b.seq_of_token && a.slots == b.slots &&
         a.block_tables == b.block_tables && a.max_pages_per_seq == b.max_pages_per_seq &&
         a.logit_rows == b.logit_rows && a.draw == b.draw && a.temperatures == b.temperatures &&
         same_sampling(a.sampling, b.sampling) && a.mtp_tokens == b.mtp_tokens && a.mtp_draft == b.mtp_draft &&
         a.mtp_hidden_rows == b.mtp_hidden_rows && a.token_bitmask == b.token_bitmask &&
         same_sampling(a.logit_adjust, b.logit_adjust);
}

TEST(StepCodec, RoundTripsEveryField) {
  const step::StepPlan step = decode_step_plan(3);
  ByteWriter w;
  encode_step(step, w);
  ByteReader r(w.bytes(), "test step");
  const step::StepPlan back = decode_step(r);
  r.expect_end();
  ASSERT_EQ(back.micro_batches.size(), 1u);
  for (int dp = 0; dp < 2; ++dp) {
    const auto& a = step.micro_batches[0].replicas[dp];
    const auto& b = back.micro_batches[0].replicas[dp];
    EXPECT_TRUE(same_batch(a.batch, b.batch));
    EXPECT_EQ(a.sequences, b.sequences);
    EXPECT_EQ(a.first_row, b.first_row);
    EXPECT_EQ(a.num_rows, b.num_rows);
  }
  std::vector<std::byte> cut(w.bytes().begin(), w.bytes().end() - 3);
  ByteReader short_reader(cut, "a cut step");
  EXPECT_THROW(decode_step(short_reader), Error);
}

// The control plane's cost per step (docs/benchmarks.md): the leader encodes a decode step's
// layout and sends it, the follower decodes it and answers with its outputs (a greedy draw's
// ids and maxima per row), the leader decodes the answer: one round trip on loopback.
TEST(ControlPlane, RoundTripPerStep) {
  auto nodes = join_all(2, 2);
  for (int batch : {1, 64}) {
    const step::StepPlan step = decode_step_plan(batch);
    const int steps = 300;
    std::thread follower([&] {
      for (int i = 0; i < steps; ++i) {
        const Frame f = nodes[1]->next_command();
        ByteReader r(f.payload, "step");
        const step::StepPlan got = decode_step(r);
        ByteWriter answer;
        answer.put_vector(got.micro_batches[0].replicas[0].batch.tokens);         // ids [B]
        answer.put_vector(std::vector<float>(static_cast<size_t>(batch), 1.0f));  // maxima [B]
        nodes[1]->reply(kUserFrame + 1, answer.bytes());
      }
    });
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) {
      ByteWriter w;
      encode_step(step, w);
      nodes[0]->broadcast(kUserFrame, w.bytes());
      const Frame answer = nodes[0]->receive_from(1);
      ByteReader r(answer.payload, "answer");
      ASSERT_EQ(r.get_vector<int32_t>("ids"), step.micro_batches[0].replicas[0].batch.tokens);
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    follower.join();
    std::printf("control plane: batch %d: %.1f us per step (round trip, %d steps)\n", batch, us / steps, steps);
  }
}

}  // namespace
}  // namespace moeserve::dist
