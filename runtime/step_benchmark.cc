#include "runtime/step_benchmark.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <set>
#include <tuple>

#include "core/error.h"
#include "model/deepseek_v3_weights.h"

#ifdef MOESERVE_WITH_CUDA
#include "backend/cuda/op_timer.h"
#include "comm/nccl_communicator.h"
#endif

namespace moeserve::runtime {

namespace {

double busiest_rank_bytes(const std::vector<perf::StepCost>& cost_per_rank) {
  double m = 0;
  for (const auto& c : cost_per_rank) m = std::max(m, c.total_bytes());
  return m;
}

}  // namespace

StepPlan synthetic_decode_step(const DecodeStepShape& shape) {
  MS_CHECK(shape.tokens_per_seq >= 1, "decode step: tokens per sequence must be >= 1, got {}", shape.tokens_per_seq);
  const int64_t end = shape.context + shape.tokens_per_seq;
  const int64_t per_seq = (end + shape.page_size - 1) / shape.page_size;
  const int64_t per_micro_batch = step::micro_batch_size(shape.batch, shape.micro_batching);
  std::vector<int32_t> next_page(static_cast<size_t>(shape.attn_dp), 0);
  std::vector<int32_t> tokens(static_cast<size_t>(end), 0);
  const step::LogitRows logits = shape.tokens_per_seq > 1 ? step::LogitRows::kEvery : step::LogitRows::kLast;
  StepPlan plan;
  for (int64_t start = 0; start < shape.batch; start += per_micro_batch) {
    step::MicroBatch mb;
    mb.replicas.resize(static_cast<size_t>(shape.attn_dp));
    for (auto& rb : mb.replicas) rb.batch.max_pages_per_seq = per_seq;
    for (int64_t i = start; i < std::min(shape.batch, start + per_micro_batch); ++i) {
      const int replica = static_cast<int>(i % shape.attn_dp);
      std::vector<int32_t> pages;
      for (int64_t p = 0; p < per_seq; ++p) pages.push_back(next_page[replica]++);
      MS_CHECK(next_page[replica] <= shape.num_pages, "out of KV cache pages (raise --kv-pages)");
      for (int64_t pos = shape.context; pos < end; ++pos) tokens[static_cast<size_t>(pos)] = shape.token_of(i, pos);
      step::append_sequence(mb.replicas[replica], static_cast<size_t>(i), tokens, shape.context, end, pages,
                            shape.page_size, logits);
    }
    plan.micro_batches.push_back(std::move(mb));
  }
  return plan;
}

void run_pipelined(Engine& engine, const StepPlan& step, int rounds) {
  MS_CHECK(rounds > 0, "run_pipelined: rounds must be positive, got {}", rounds);
  std::vector<StepPlan> groups(step.micro_batches.size());  // micro-batch m alone
  for (size_t m = 0; m < groups.size(); ++m) groups[m].micro_batches.push_back(step.micro_batches[m]);
  std::deque<StepTicket> in_flight;  // one step per group, oldest first
  for (const StepPlan& group : groups) in_flight.push_back(engine.submit(group));
  for (int round = 1; round < rounds; ++round)
    for (const StepPlan& group : groups) {
      engine.wait(in_flight.front());
      in_flight.pop_front();
      in_flight.push_back(engine.submit(group));
    }
  for (; !in_flight.empty(); in_flight.pop_front()) engine.wait(in_flight.front());
}

double StepBenchResult::max_rank_bytes() const { return busiest_rank_bytes(cost_per_rank); }

double PipelinedResult::max_rank_bytes() const { return busiest_rank_bytes(group_cost_per_rank); }

double StepBenchResult::total_flops() const {
  double f = 0;
  for (const auto& c : cost_per_rank) f += c.flops;
  return f;
}

namespace {

// One step with the logits head, synchronously (what a step costs when every logit row comes
// to the host).
void run_logits_step(Engine& engine, const StepPlan& step) { engine.wait(engine.submit(step)); }

// A decode step of the engine's layout: every sequence has `context` cached tokens and decodes
// position `context` (and the tokens_per_seq - 1 after it: a verify step). micro_batch > 0:
// micro-batches of that many sequences (else the engine's setting).
StepPlan decode_step(const Engine& engine, int64_t batch, const StepBenchOptions& options, int64_t micro_batch = 0) {
  const EngineOptions& o = engine.options();
  const int64_t vocab = engine.config().vocab_size, context = options.context;
  return synthetic_decode_step(
      {.batch = batch,
       .context = context,
       .tokens_per_seq = options.tokens_per_seq,
       .page_size = o.page_size,
       .num_pages = o.num_pages,
       .attn_dp = o.plan.attn_dp,
       .micro_batching = {.pp = o.plan.pp,
                          .max_micro_batch_size = micro_batch > 0 ? micro_batch : o.pp_max_micro_batch_size},
       .token_of = [&](int64_t i, int64_t pos) { return static_cast<int32_t>((i * 7919 + pos * 104729) % vocab); }});
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

#ifdef MOESERVE_WITH_CUDA
comm::NcclCommunicator* nccl_of(comm::Communicator* c) { return dynamic_cast<comm::NcclCommunicator*>(c); }

// The communicators of a rank by role.
std::vector<std::pair<std::string, comm::Communicator*>> roles(RankComms& comms) {
  return {{"attn_tp", comms.attn_tp.get()}, {"moe", comms.moe.get()}, {"pipeline", comms.pipeline.get()}};
}

// Runs `calls` collectives of one kind and size alone on every rank's communicator of `role`
// (scratch buffers, back to back, then one synchronise); returns rank 0's wall-clock ms.
double time_alone(Engine& engine, const std::string& role, comm::Collective collective, double bytes_per_call,
                  int64_t calls) {
  double ms = 0;
  engine.for_each_rank([&](Engine::RankView& r) {
    comm::Communicator* c = nullptr;
    for (auto& [name, comm] : roles(r.comms))
      if (name == role) c = comm;
    if (c == nullptr || c->size() == 1) return;
    const int size = c->size();
    const size_t bytes = static_cast<size_t>(bytes_per_call);
    ops::BufferPtr a = r.backend.alloc(std::max<size_t>(bytes * size, 256)),
                   b = r.backend.alloc(std::max<size_t>(bytes * size, 256));
    const int stage = c->rank();
    auto one = [&] {
      switch (collective) {
        case comm::Collective::AllReduce:
          c->all_reduce_sum(a->data(), bytes, DType::U8);
          break;
        case comm::Collective::AllGather:
          c->all_gather(a->data(), b->data(), bytes, DType::U8);
          break;
        case comm::Collective::ReduceScatter:
          c->reduce_scatter_sum(a->data(), b->data(), bytes / size, DType::U8);
          break;
        case comm::Collective::AllToAllV: {
          const std::vector<size_t> counts(size, bytes / size);
          c->all_to_all_v(a->data(), counts, b->data(), counts, DType::U8);
          break;
        }
        case comm::Collective::Send:  // a pipeline hop: every stage sends on and receives, paired
        case comm::Collective::Recv:
          if (stage + 1 < size) c->send(a->data(), bytes, DType::U8, stage + 1);
          if (stage > 0) c->recv(b->data(), bytes, DType::U8, stage - 1);
          break;
        default:
          break;
      }
    };
    one();  // warm-up
    r.backend.synchronize();
    c->barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < calls; ++i) one();
    r.backend.synchronize();
    if (r.rank == 0) ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  });
  return ms;
}

// Time in each (group, collective) per step, inside the step (events on rank 0, graphs off so
// that every call is its own launch) and alone (time_alone with the same calls and sizes).
std::vector<CommTiming> time_communication(Engine& engine, const StepPlan& step, const StepBenchOptions& options) {
  std::map<std::pair<std::string, comm::Collective>, comm::CommStats::Entry> before;
  engine.for_each_rank([&](Engine::RankView& r) {
    r.model.set_graphs_enabled(false);
    if (r.rank != 0) return;
    for (auto& [name, c] : roles(r.comms)) {
      if (auto* n = nccl_of(c)) n->set_timing(true);
      if (c)
        for (const auto& [collective, entry] : c->stats().by_collective) before[{name, collective}] = entry;
    }
  });
  for (int i = 0; i < options.iterations; ++i) run_logits_step(engine, step);
  std::vector<CommTiming> out;
  engine.for_each_rank([&](Engine::RankView& r) {
    r.model.set_graphs_enabled(engine.options().graphs);
    if (r.rank != 0) return;
    for (auto& [name, c] : roles(r.comms)) {
      auto* n = nccl_of(c);
      if (!n) continue;
      const auto ms = n->collect_timing();
      n->set_timing(false);
      for (const auto& [collective, entry] : c->stats().by_collective) {
        const comm::CommStats::Entry old = before[{name, collective}];
        const int64_t calls = entry.calls - old.calls;
        if (calls == 0 || collective == comm::Collective::Barrier) continue;
        CommTiming t;
        t.group = name;
        t.collective = comm::collective_name(collective);
        t.calls_per_step = calls / options.iterations;
        t.bytes_per_call = static_cast<double>(entry.bytes - old.bytes) / static_cast<double>(calls);
        const auto it = ms.find(collective);
        t.ms_per_step = it == ms.end() ? 0 : it->second / options.iterations;
        out.push_back(t);
      }
    }
  });
  for (CommTiming& t : out) {
    comm::Collective collective = comm::Collective::AllReduce;
    for (comm::Collective c :
         {comm::Collective::AllReduce, comm::Collective::AllGather, comm::Collective::ReduceScatter,
          comm::Collective::AllToAllV, comm::Collective::Send, comm::Collective::Recv})
      if (t.collective == comm::collective_name(c)) collective = c;
    t.ms_alone_per_step =
        time_alone(engine, t.group, collective, t.bytes_per_call, t.calls_per_step * options.iterations) /
        options.iterations;
  }
  return out;
}
#endif

// What each rank must read and compute for `step` (`batch` sequences at `context` cached
// tokens): the step runs once with its routing recorded, and the experts it routed to count
// per stage (the union over the stage's ranks and the step's micro-batches).
void cost_of_step(Engine& engine, const StepPlan& step, int64_t batch, const StepBenchOptions& options,
                  std::vector<perf::StepCost>& cost_per_rank, std::vector<std::vector<int64_t>>& experts_hit_per_rank) {
  const ModelConfig& config = engine.config();
  const parallel::ParallelPlan& plan = engine.options().plan;
  const int world = plan.world();
  engine.for_each_rank([&](Engine::RankView& r) { r.model.set_record_routing(true); });
  run_logits_step(engine, step);
  std::vector<std::vector<std::vector<int32_t>>> routing(world);  // [rank][moe layer][pairs]
  engine.for_each_rank([&](Engine::RankView& r) {
    routing[r.rank] = r.model.last_routing();
    r.model.set_record_routing(false);
  });
  cost_per_rank.assign(world, {});
  experts_hit_per_rank.assign(world, {});
  const parallel::ShardDims dims = shard_dims(config);
  for (int rank = 0; rank < world; ++rank) {
    const parallel::RankShard shard = parallel::shard_of(plan, dims, rank);
    std::vector<std::set<int32_t>> hit(routing[rank].size());
    for (int other = 0; other < world; ++other) {
      if (parallel::rank_coord(plan, other).stage != shard.coord.stage) continue;
      for (size_t l = 0; l < std::min(hit.size(), routing[other].size()); ++l)
        for (int32_t e : routing[other][l])
          if (shard.experts.contains(e)) hit[l].insert(e);
    }
    perf::StepShape shape;
    // Tokens this rank runs: its replica's share of the batch (all micro-batches).
    shape.sequences = (batch + plan.attn_dp - 1 - shard.coord.dp_index) / plan.attn_dp;
    shape.tokens = shape.sequences * options.tokens_per_seq;
    shape.context = options.context;
    for (const auto& h : hit) shape.experts_hit.push_back(static_cast<int64_t>(h.size()));
    experts_hit_per_rank[rank] = shape.experts_hit;
    const double elem = engine.options().backend == "cuda" ? 2.0 : 4.0;
    const double kv_elem = engine.options().kv_cache_fp8 && engine.options().backend == "cuda" ? 1.0 : elem;
    cost_per_rank[rank] = perf::decode_step_cost(config, shard, shape, elem, kv_elem);
  }
}

// Pipeline plans: as many groups of `batch` sequences as stages, one step of each in flight
// (run_pipelined). The steady-state time of a round (every group one step) is the
// difference between runs of 2 + iterations and of 2 rounds over `iterations` (the fill and
// drain cancel out), median of three. The bytes are those of one group's step: the routing
// of the first group (the same sequences as decode_step(batch)) run as a step of its own.
PipelinedResult time_pipelined(Engine& engine, int64_t batch, const StepBenchOptions& options) {
  const parallel::ParallelPlan& plan = engine.options().plan;
  PipelinedResult out;
  out.groups = plan.pp;
  const StepPlan grouped = decode_step(engine, batch * plan.pp, options, batch);
  MS_CHECK(static_cast<int>(grouped.micro_batches.size()) == plan.pp, "bench-step: {} groups of {} expected, got {}",
           plan.pp, batch, grouped.micro_batches.size());
  run_pipelined(engine, grouped, 3);  // warm-up: captures the graphs
  auto timed = [&](int rounds) {
    const auto t0 = std::chrono::steady_clock::now();
    run_pipelined(engine, grouped, rounds);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> round_ms;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const double short_run = timed(2);
    const double long_run = timed(2 + options.iterations);
    round_ms.push_back((long_run - short_run) / options.iterations);
  }
  out.round_ms = median(round_ms);
  out.tokens_per_s = static_cast<double>(batch * plan.pp) / (out.round_ms * 1e-3);
  cost_of_step(engine, decode_step(engine, batch, options, batch), batch, options, out.group_cost_per_rank,
               out.experts_hit_per_rank);
  return out;
}

// Random latents in every cache slot of the rank: uniform [0, 1), or random e4m3 codes in
// [0, 1.875] for an fp8 cache of bytes (codes <= 0x3f: never the NaN code).
void fill_caches_randomly(Engine::RankView& r, const ModelConfig& config) {
  const int64_t width = config.kv_lora_rank + config.qk_rope_head_dim;
  const int64_t slots = r.model.cache_shape().num_pages * r.model.cache_shape().page_size;
  const bool fp8_bytes = r.model.cache_shape().fp8 && r.backend.activation_dtype() == DType::BF16;
  uint64_t seed = 1000 + static_cast<uint64_t>(r.rank) * 131;
  for (ops::Buffer* cache : r.model.kv_caches()) {
    if (fp8_bytes)
      r.backend.fill_random_words(
          {static_cast<uint32_t*>(cache->data()), slots * width / 4, 0, seed++, 1, 0, 0x3f3f3f3fu});
    else
      r.backend.fill_uniform({cache->data(), slots, width, width, 0, 0, seed++, 0.0f, 1.0f});
  }
  r.backend.synchronize();
}

}  // namespace

std::vector<StepBenchResult> benchmark_decode_steps(Engine& engine, const std::vector<int64_t>& batches,
                                                    const StepBenchOptions& options) {
  const ModelConfig& config = engine.config();
  const parallel::ParallelPlan& plan = engine.options().plan;
  // Random latents in every cache slot, once.
  engine.for_each_rank([&](Engine::RankView& r) {
    fill_caches_randomly(r, config);
    if (r.sampler != nullptr) r.sampler->set_return_logits(false);
  });

  std::vector<StepBenchResult> results;
  for (int64_t batch : batches) {
    MS_CHECK(batch > 0, "bench-step: batch sizes must be positive, got {}", batch);
    const StepPlan step = decode_step(engine, batch, options);
    StepBenchResult result;
    result.batch = batch;
    result.tokens_per_seq = options.tokens_per_seq;

    for (int i = 0; i < options.warmup; ++i) run_logits_step(engine, step);
    std::vector<double> times;
    for (int i = 0; i < options.iterations; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      run_logits_step(engine, step);
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    result.step_ms = median(times);
    result.tokens_per_s = static_cast<double>(batch * options.tokens_per_seq) / (result.step_ms * 1e-3);

    cost_of_step(engine, step, batch, options, result.cost_per_rank, result.experts_hit_per_rank);

    if (plan.pp > 1 && options.pipelined) result.pipelined = time_pipelined(engine, batch, options);

#ifdef MOESERVE_WITH_CUDA
    const bool on_gpus = engine.options().backend == "cuda";
    if (on_gpus && options.breakdown) {
      engine.for_each_rank([&](Engine::RankView& r) {
        r.model.set_graphs_enabled(false);
        if (r.rank == 0) static_cast<cuda::OpTimingBackend&>(r.backend).set_enabled(true);
      });
      for (int i = 0; i < options.iterations; ++i) run_logits_step(engine, step);
      engine.for_each_rank([&](Engine::RankView& r) {
        r.model.set_graphs_enabled(engine.options().graphs);
        if (r.rank != 0) return;
        auto& timer = static_cast<cuda::OpTimingBackend&>(r.backend);
        timer.collect();
        for (const auto& [op, t] : timer.totals())
          result.op_ms_per_step[op] = {t.calls / options.iterations, t.ms / options.iterations};
        timer.reset();
        timer.set_enabled(false);
      });
    }
    if (on_gpus && options.comm && plan.world() > 1) result.comm = time_communication(engine, step, options);
#endif
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace moeserve::runtime
