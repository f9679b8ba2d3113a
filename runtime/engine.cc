#include "runtime/engine.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "backend/cpu/cpu_backend.h"
#include "comm/in_process.h"
#include "core/env.h"
#include "core/error.h"
#include "model/deepseek_v3_weights.h"
#include "parallel/plan_parse.h"
#include "runtime/multinode.h"
#include "runtime/rank_comms.h"
#include "runtime/rank_devices.h"
#include "runtime/rank_workers.h"

namespace moeserve::runtime {

namespace {

// Everything one rank owns. Touched only by its own thread while a job runs.
struct Rank {
  parallel::RankCoord coord;  // coord.rank: the world rank
  std::unique_ptr<ops::Backend> backend;
  std::unique_ptr<WeightMover> mover;  // a re-plan's copies onto this rank (declared before weights, which use it)
  std::unique_ptr<WeightSource> weights;
  RankComms comms;
  std::unique_ptr<DeepseekV3> model;
  std::unique_ptr<sample::Sampler> sampler;  // last stage: draws from the model's logits
  int64_t forward_passes = 0;
};

// One stage's part of a micro-batch on `rank`: the [T, hidden] states from the previous stage
// straight into the residual stream (every stage but the first), the forward, and the states
// on to the next stage (every stage but the last). Returns what the last stage's sampler drew.
sample::Drawn run_stage(Rank& rank, const ForwardBatch& batch, int64_t hidden) {
  const parallel::RankShard& shard = rank.model->shard();
  const int stage = rank.coord.stage;
  comm::Communicator& pipeline = *rank.comms.pipeline;
  pipeline.set_site("pipeline");
  const DType act = rank.backend->activation_dtype();
  const int64_t T = batch.num_tokens();
  // An MTP draft step runs on the last stage alone (the MTP layer's place): nothing passes.
  if (batch.mtp_draft && !shard.last_stage) return {};
  if (!shard.first_stage && !batch.mtp_draft)
    pipeline.recv(rank.model->hidden_states(T).data(), static_cast<size_t>(T * hidden), act, stage - 1);
  const sample::SamplerBuffers logits = rank.model->forward(batch, rank.sampler.get());
  ++rank.forward_passes;
  sample::Drawn out;
  if (shard.last_stage) out = rank.sampler->finish(logits, batch);
  if (!shard.last_stage)
    pipeline.send(rank.model->hidden_states(T).data(), static_cast<size_t>(T * hidden), act, stage + 1);
  return out;
}

// Outputs sized for `step`: one entry per (micro-batch, replica).
StepOutputs sized_outputs(const StepPlan& step, int attn_dp) {
  StepOutputs out;
  out.rows.assign(step.micro_batches.size(), std::vector<Tensor>(static_cast<size_t>(attn_dp)));
  out.candidates.assign(step.micro_batches.size(), std::vector<sample::SampleCandidates>(static_cast<size_t>(attn_dp)));
  out.maxima.assign(step.micro_batches.size(), std::vector<std::vector<float>>(static_cast<size_t>(attn_dp)));
  return out;
}

// One rank's part of a step: every micro-batch through its stage, the outputs kept by the
// ranks that hold them (the last stage's attention-TP rank 0 of each replica; the logits are
// gathered over the vocab split).
void run_step_on_rank(Rank& rank, const StepPlan& step, int64_t hidden, StepOutputs& outputs) {
  for (size_t m = 0; m < step.micro_batches.size(); ++m) {
    sample::Drawn out = run_stage(rank, step.micro_batches[m].replicas[rank.coord.dp_index].batch, hidden);
    if (!rank.model->shard().last_stage || rank.coord.tp_index != 0) continue;
    outputs.rows[m][rank.coord.dp_index] = std::move(out.rows);
    outputs.candidates[m][rank.coord.dp_index] = std::move(out.candidates);
    outputs.maxima[m][rank.coord.dp_index] = std::move(out.maxima);
  }
}

// A step queued by Engine::submit: its plan, and its outputs once every rank has run it.
struct AsyncStep {
  StepPlan plan;
  StepOutputs outputs;
  int ranks_done = 0;  // under AsyncQueue::mutex
};

// The submitted steps the rank threads work through, in ticket order. While it is open the
// ranks run one RankWorkers job that takes the next ticket as soon as it exists.
struct AsyncQueue {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<StepTicket, std::shared_ptr<AsyncStep>> steps;  // submitted, not yet waited for
  std::atomic<StepTicket> submitted = 0;                   // tickets [0, submitted) exist
  std::atomic<bool> closing = false;
  bool failed = false;  // a rank threw: the world is aborted, waiters give up
};

std::vector<int> all_ranks(int world) {
  std::vector<int> ranks(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) ranks[r] = r;
  return ranks;
}

}  // namespace

struct Engine::Impl {
  std::unique_ptr<comm::InProcessWorld> in_process;  // one process's CPU ranks' communicators
  comm::World* world = nullptr;                      // in_process, or the cluster's data plane; aborts a failed step
  std::unique_ptr<NcclWorld> nccl;                   // GPU ranks' communicators
  std::vector<Rank> ranks;                           // this process's ranks (all of them without a cluster)
  std::unique_ptr<LeaderRelay> relay;                // the leader of a cluster: the followers' part of each call
  AsyncQueue queue;
  int spin_us = 0;
  std::unique_ptr<RankWorkers> workers;  // declared last: its threads stop first
  std::string failure;                   // set when a step failed: the world is aborted

  // The ranks' job while steps are submitted asynchronously: run each ticket from `first` on
  // as it appears, until the queue closes and nothing is left.
  void start_async(int64_t hidden);
  // Closes the queue and waits for the ranks to leave it (rethrows a rank's failure).
  void end_async();
  // Before a synchronous call: every submitted step waited for, the ranks out of the queue.
  void quiesce(const char* what);
  // Runs a relay call; when it fails (a node lost) the engine stops: the world is aborted (the
  // local ranks leave their collectives) and later calls throw.
  void relay_or_stop(const std::function<void()>& call) {
    try {
      call();
    } catch (const Error& e) {
      failure = e.what();
      world->abort(failure);
      throw;
    }
  }
};

void Engine::Impl::start_async(int64_t hidden) {
  queue.closing = false;
  queue.failed = false;
  const StepTicket first = queue.submitted.load();
  workers->start([this, hidden, first](int r) {
    Rank& rank = ranks[r];
    for (StepTicket next = first;; ++next) {
      spin_until(spin_us, [&] { return queue.submitted.load() > next || queue.closing.load(); });
      std::shared_ptr<AsyncStep> step;
      {
        std::unique_lock<std::mutex> lock(queue.mutex);
        queue.changed.wait(lock, [&] { return queue.submitted.load() > next || queue.closing.load(); });
        if (queue.submitted.load() <= next) return;  // closed, and every step run
        step = queue.steps.at(next);
      }
      try {
        run_step_on_rank(rank, step->plan, hidden, step->outputs);
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(queue.mutex);
          queue.failed = true;
        }
        queue.changed.notify_all();
        throw;  // RankWorkers aborts the world: the peers' collectives fail too
      }
      {
        std::lock_guard<std::mutex> lock(queue.mutex);
        ++step->ranks_done;
      }
      queue.changed.notify_all();
    }
  });
}

void Engine::Impl::end_async() {
  if (!workers->running()) return;
  {
    std::lock_guard<std::mutex> lock(queue.mutex);
    queue.closing = true;
  }
  queue.changed.notify_all();
  try {
    workers->finish();
  } catch (const Error& e) {
    failure = e.what();
    queue.steps.clear();
    throw;
  }
}

void Engine::Impl::quiesce(const char* what) {
  MS_CHECK(failure.empty(), "the engine stopped after a failed step: {}", failure);
  MS_CHECK(queue.steps.empty(), "{}: {} submitted steps were not waited for", what, queue.steps.size());
  end_async();
}

Engine::Engine(const ModelSource& model, EngineOptions options)
    : config_(model.config), model_name_(model.spec), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  build(model, nullptr, false);
}

Engine::Engine(const ModelSource& model, EngineOptions options, Engine& reshard_from, bool take_caches)
    : config_(model.config), model_name_(model.spec), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  MS_CHECK(reshard_from.model_name_ == model_name_,
           "re-plan from resident weights: the engine holds model '{}', not '{}'", reshard_from.model_name_,
           model_name_);
  MS_CHECK(reshard_from.options_.backend == options_.backend,
           "re-plan from resident weights: the engine runs on backend '{}', the new plan on '{}'",
           reshard_from.options_.backend, options_.backend);
  build(model, &reshard_from, take_caches);
}

ResidentWeights Engine::resident_weights(bool give_caches) {
  impl_->quiesce("re-plan from resident weights");
  // GPU ranks: a view of another GPU's memory is no shard (its bytes are copied), and nothing
  // of the old engine may still run while the new one copies and takes over its caches.
  const bool on_gpus = options_.backend == "cuda";
  ResidentWeights out{.ranks = {},
                      .mover = nullptr,  // each new rank's own (Engine::build)
                      .describe = fmt::format("model '{}' under plan '{}'", model_name_, options_.plan.name),
                      .one_address_space = !on_gpus,
                      .spare = nullptr};
  for (Rank& rank : impl_->ranks) {
    rank.backend->synchronize();
    out.ranks.push_back(&rank.model->weight_index());
  }
  if (give_caches) {
    out.spare = std::make_shared<SpareBuffers>();
    for (Rank& rank : impl_->ranks)
      for (ops::BufferPtr& b : rank.model->release_kv_caches()) out.spare->give(std::move(b));
    impl_->failure = "its KV caches were handed to a re-plan's engine";
  }
  return out;
}

void Engine::build(const ModelSource& model, Engine* reshard_from, bool take_caches) {
  const parallel::ParallelPlan& plan = options_.plan;
  MS_CHECK(options_.page_size > 0 && options_.num_pages > 0, "page size and page count must be positive");
  MS_CHECK(options_.pp_max_micro_batch_size >= 0 && options_.pp_async_batch_depth >= 0,
           "--pp-max-micro-batch-size and --pp-async-batch-depth must be >= 0");
  parallel::validate_plan(plan, shard_dims(config_));
  check_reduction_plan(config_, plan, options_.run);
  dist::Cluster* cluster = options_.cluster;
  MS_CHECK(!cluster || !reshard_from, "a re-plan from resident weights across processes is not implemented");
  const std::vector<int> local = cluster ? cluster->local_ranks() : all_ranks(plan.world());
  std::optional<ResidentWeights> resident;
  if (reshard_from) resident = reshard_from->resident_weights(take_caches);
  impl_->ranks.resize(local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    Rank& rank = impl_->ranks[i];
    rank.coord = parallel::rank_coord(plan, local[i]);
    rank.backend = make_rank_backend(options_.backend, static_cast<int>(i), options_.batch_invariant);
    if (resident) {
      rank.mover = std::make_unique<BackendMover>(*rank.backend);
      ResidentWeights mine = *resident;
      mine.mover = rank.mover.get();
      rank.weights = std::make_unique<ResidentWeightSource>(std::move(mine));
    } else {
      rank.weights = model.weights();
    }
  }
  const bool on_gpus = options_.backend == "cuda";
  build_comms(on_gpus);
  if (cluster && cluster->leader()) impl_->relay = std::make_unique<LeaderRelay>(*cluster, plan);
  // Every rank loads its own shard on its own thread.
  const KvCacheShape cache{options_.num_pages, options_.page_size, options_.kv_cache_fp8};
  impl_->workers->run([&](int r) {
    Rank& rank = impl_->ranks[r];
    rank.model = std::make_unique<DeepseekV3>(config_, plan, rank.coord.rank, *rank.backend, *rank.weights,
                                              rank.comms.groups(), cache, options_.run);
    rank.model->set_graphs_enabled(options_.graphs);
    if (rank.model->shard().last_stage) rank.sampler = std::make_unique<sample::Sampler>(rank.model->sampler_params());
  });
}

bool Engine::replays_graphs() const { return impl_->ranks.front().model->replays_graphs(); }
int64_t Engine::graphs_captured() const { return impl_->ranks.front().model->graphs_captured(); }

void Engine::build_comms(bool on_gpus) {
  const parallel::ParallelPlan& plan = options_.plan;
  const int local = static_cast<int>(impl_->ranks.size());
  if (options_.cluster) {
    impl_->world = &options_.cluster->world();
  } else {
    comm::InProcessOptions comm_options;
    comm_options.send_capacity = static_cast<size_t>(options_.pp_async_batch_depth + 1);
    impl_->in_process = std::make_unique<comm::InProcessWorld>(plan.world(), comm_options);
    impl_->world = impl_->in_process.get();
  }
  if (on_gpus && (local > 1 || options_.cluster)) {
    std::vector<ops::Backend*> backends;
    for (Rank& rank : impl_->ranks) backends.push_back(rank.backend.get());
    std::optional<NcclSpan> span;  // across processes: the leader's NCCL id over the control plane
    if (options_.cluster)
      span = NcclSpan{share_nccl_id(*options_.cluster), plan.world(), options_.cluster->local_ranks()};
    impl_->nccl = std::make_unique<NcclWorld>(backends, span ? &*span : nullptr);
  }
  // GPU ranks' threads mostly wait for their GPU: they poll for the next job for up to 2 ms
  // (MOESERVE_WORKER_SPIN_US overrides; 0 sleeps at once).
  impl_->spin_us = env_int("MOESERVE_WORKER_SPIN_US", on_gpus ? 2000 : 0);
  impl_->workers = std::make_unique<RankWorkers>(local, *impl_->world, impl_->spin_us);
  if (impl_->nccl) {
    impl_->workers->run([&](int r) {
      Rank& rank = impl_->ranks[r];
      rank.comms = impl_->nccl->split_for(plan, rank.coord.rank);
    });
  } else {
    for (Rank& rank : impl_->ranks) rank.comms = make_rank_comms(*impl_->world, plan, rank.coord.rank);
  }
}

Engine::~Engine() {
  try {  // the ranks leave the step queue before their threads stop; steps not waited for are dropped
    impl_->end_async();
  } catch (const std::exception&) {  // the failure was reported to whoever waited
  }
}

void Engine::for_each_rank(const std::function<void(RankView&)>& fn) {
  MS_CHECK(!options_.cluster, "for_each_rank: the ranks of other processes cannot run a local function");
  impl_->quiesce("for_each_rank");
  impl_->workers->run([&](int r) {
    Rank& rank = impl_->ranks[r];
    RankView view{rank.coord.rank, *rank.model, rank.sampler.get(), *rank.backend, rank.comms};
    fn(view);
  });
}

EngineStats Engine::stats() const {
  EngineStats out;
  for (const Rank& r : impl_->ranks) {
    out.comm.push_back(r.comms.stats());
    out.weight_bytes.push_back(r.model->weight_bytes());
    out.forward_passes.push_back(r.forward_passes);
    out.shards.push_back(r.model->shard());
    const ResidentWeightSource* resident = r.weights->resident();
    out.reshard.push_back(resident ? resident->stats() : ReshardStats{});
  }
  return out;
}

StepTicket Engine::submit(StepPlan step) {
  MS_CHECK(impl_->failure.empty(), "the engine stopped after a failed step: {}", impl_->failure);
  auto queued = std::make_shared<AsyncStep>();
  queued->outputs = sized_outputs(step, options_.plan.attn_dp);
  queued->plan = std::move(step);
  if (!impl_->workers->running()) impl_->start_async(config_.hidden_size);
  AsyncQueue& queue = impl_->queue;
  if (impl_->relay) impl_->relay_or_stop([&] { impl_->relay->submit(queue.submitted.load(), queued->plan); });
  StepTicket ticket;
  {
    std::lock_guard<std::mutex> lock(queue.mutex);
    ticket = queue.submitted.load();
    queue.steps.emplace(ticket, std::move(queued));
    queue.submitted = ticket + 1;
  }
  queue.changed.notify_all();
  return ticket;
}

StepOutputs Engine::wait(StepTicket ticket) {
  MS_CHECK(impl_->failure.empty(), "the engine stopped after a failed step: {}", impl_->failure);
  AsyncQueue& queue = impl_->queue;
  std::shared_ptr<AsyncStep> step;
  {
    std::lock_guard<std::mutex> lock(queue.mutex);
    auto it = queue.steps.find(ticket);
    MS_CHECK(it != queue.steps.end(), "wait: step {} was not submitted or was already waited for", ticket);
    step = it->second;
  }
  const int world = static_cast<int>(impl_->ranks.size());
  spin_until(impl_->spin_us, [&] {
    std::lock_guard<std::mutex> lock(queue.mutex);
    return step->ranks_done == world || queue.failed;
  });
  {
    std::unique_lock<std::mutex> lock(queue.mutex);
    queue.changed.wait(lock, [&] { return step->ranks_done == world || queue.failed; });
    if (step->ranks_done == world) {
      queue.steps.erase(ticket);
      lock.unlock();
      if (impl_->relay) impl_->relay_or_stop([&] { impl_->relay->collect(ticket, step->plan, step->outputs); });
      return std::move(step->outputs);
    }
  }
  impl_->end_async();  // a rank failed: rethrows its error and stops the engine
  fail("wait: step {} failed", ticket);
}

std::vector<int32_t> Engine::sample_logits_rows(int replica, const std::vector<int64_t>& rows,
                                                const std::vector<ops::SamplingOptions>& options) {
  MS_CHECK(replica >= 0 && replica < options_.plan.attn_dp, "sample_logits_rows: replica {} of {}", replica,
           options_.plan.attn_dp);
  MS_CHECK(rows.size() == options.size(), "sample_logits_rows: {} rows but {} sampling options", rows.size(),
           options.size());
  impl_->quiesce("sample_logits_rows");
  std::vector<int32_t> tokens(rows.size());
  if (rows.empty()) return tokens;
  if (impl_->relay) impl_->relay_or_stop([&] { impl_->relay->send_sample_rows(replica, rows, options); });
  impl_->workers->run([&](int r) {  // every vocab slice's rank takes part (a vocab split gathers the rows)
    Rank& rank = impl_->ranks[r];
    const parallel::RankShard& shard = rank.model->shard();
    if (!shard.last_stage || rank.coord.dp_index != replica) return;
    std::vector<int32_t> drawn = rank.sampler->draw_rows(rows, options);
    if (shard.vocab.begin == 0) tokens = std::move(drawn);  // the same on every slice's rank
  });
  if (impl_->relay) impl_->relay_or_stop([&] { impl_->relay->collect_sample_rows(replica, tokens); });
  return tokens;
}

}  // namespace moeserve::runtime
