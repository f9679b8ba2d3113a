#include "perf/advisor.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/deepseek_v3_weights.h"
#include "parallel/memory_fit.h"
#include "parallel/plan_parse.h"
#include "perf/collective_model.h"
#include "perf/step_cost.h"

namespace moeserve::perf {

double StepSplit::total_us() const {
  double t = weights_us + kv_us + flops_us + overhead_us + bubble_us + host_us;
  for (const auto& [site, us] : collectives_us) t += us;
  return t;
}

std::string StepSplit::dominant() const {
  std::vector<std::pair<double, std::string>> terms = {{weights_us, "weights"},  {kv_us, "kv"},
                                                       {flops_us, "flops"},      {overhead_us, "layer_overhead"},
                                                       {bubble_us, "pp_bubble"}, {host_us, "host"}};
  for (const auto& [site, us] : collectives_us) terms.emplace_back(us, site);
  return std::max_element(terms.begin(), terms.end())->second;
}

void StepSplit::add(const StepSplit& o, double times) {
  weights_us += times * o.weights_us;
  kv_us += times * o.kv_us;
  flops_us += times * o.flops_us;
  overhead_us += times * o.overhead_us;
  bubble_us += times * o.bubble_us;
  host_us += times * o.host_us;
  for (const auto& [site, us] : o.collectives_us) collectives_us[site] += times * us;
}

double expected_normal_max(int n) {
  // E[max of n standard normals] (H. L. Harter, "Expected values of normal order statistics",
  // Biometrika 48, 1961); n = 2 is 1/sqrt(pi).
  static const Curve table{{{1, 0.0},
                            {2, 0.5642},
                            {4, 1.0294},
                            {8, 1.4236},
                            {16, 1.7660},
                            {32, 2.0697},
                            {64, 2.3352},
                            {128, 2.5684},
                            {256, 2.7783}}};
  return n <= 1 ? 0.0 : table.at(n);
}

RoutedWork routed_work(const ModelConfig& c, int groups, double tokens, const std::vector<double>& expert_load,
                       bool busiest) {
  const int64_t experts = c.n_routed_experts;
  MS_CHECK(expert_load.empty() || static_cast<int64_t>(expert_load.size()) == experts,
           "expert loads: {} values for {} routed experts", expert_load.size(), experts);
  double load_sum = 0;
  for (double l : expert_load) load_sum += l;
  const double k = static_cast<double>(c.num_experts_per_tok);
  RoutedWork best;
  const double z = busiest ? expected_normal_max(groups) : 0.0;
  for (int g = 0; g < groups; ++g) {
    const parallel::Range r = parallel::split_range(experts, groups, g);
    double hit = 0, hit_var = 0, rows = 0, rows_var = 0;
    for (int64_t e = r.begin; e < r.end; ++e) {
      // p: chance one token routes to expert e (each token picks k distinct experts).
      const double p = std::min(1.0, expert_load.empty() ? k / experts : k * expert_load[e] / load_sum);
      const double q = 1 - std::pow(1 - p, tokens);  // hit by at least one token
      hit += q;
      hit_var += q * (1 - q);
      rows += tokens * p;
      rows_var += tokens * p * (1 - p);
    }
    const RoutedWork w{std::min<double>(r.size(), hit + z * std::sqrt(hit_var)),
                       std::min(tokens * std::min<double>(k, r.size()), rows + z * std::sqrt(rows_var))};
    if (!busiest) {
      best.experts_hit += w.experts_hit / groups;
      best.rows += w.rows / groups;
    } else if (w.rows > best.rows) {
      best = w;
    }
  }
  return best;
}

namespace {

// decode_step_cost is linear in the experts hit: a fractional expected count interpolates
// between the integer counts below and above it.
StepCost cost_at(const ModelConfig& c, const parallel::RankShard& s, double tokens, double context, double hits,
                 double element_bytes, double kv_element_bytes) {
  const int64_t moe_layers = [&] {
    int64_t n = 0;
    for (int64_t l = s.layers.begin; l < s.layers.end; ++l) n += c.is_moe_layer(l) ? 1 : 0;
    return n;
  }();
  auto at = [&](int64_t h) {
    StepShape shape;
    shape.tokens = std::max<int64_t>(1, std::llround(tokens));
    shape.context = std::llround(context);
    shape.experts_hit.assign(moe_layers, h);
    return decode_step_cost(c, s, shape, element_bytes, kv_element_bytes);
  };
  const double lo = std::floor(hits), t = hits - lo;
  StepCost a = at(static_cast<int64_t>(lo));
  if (t == 0) return a;
  const StepCost b = at(static_cast<int64_t>(lo) + 1);
  a.weight_bytes += t * (b.weight_bytes - a.weight_bytes);
  a.expert_bytes += t * (b.expert_bytes - a.expert_bytes);
  return a;
}

// One rank's compute: the roofline of its projections/experts (weights) and of its attention (KV).
StepSplit rank_compute(const ModelConfig& c, const parallel::RankShard& s, const HardwareProfile& p,
                       const ForwardShape& shape, const RoutedWork& routed) {
  const double T = shape.replica_tokens;
  const double kv_elem = shape.kv_element_bytes > 0 ? shape.kv_element_bytes : p.element_bytes;
  const StepCost with_kv = cost_at(c, s, T, shape.context, routed.experts_hit, p.element_bytes, kv_elem);
  const StepCost no_kv = cost_at(c, s, T, 0, routed.experts_hit, p.element_bytes, kv_elem);
  int64_t moe_layers = 0;
  for (int64_t l = s.layers.begin; l < s.layers.end; ++l) moe_layers += c.is_moe_layer(l) ? 1 : 0;
  // decode_step_cost gives each rank T x top_k x its share of the experts' rows; the routing
  // model knows the busiest group's rows (and, with attention DP, every replica's tokens).
  const double expert_params = 3.0 * static_cast<double>(c.hidden_size) * s.expert_intermediate.size();
  const double default_rows =
      T * c.num_experts_per_tok * static_cast<double>(s.experts.size()) / static_cast<double>(c.n_routed_experts);
  const double linear_flops = no_kv.flops + 2 * expert_params * (routed.rows - default_rows) * moe_layers;
  const double attention_flops = with_kv.flops - no_kv.flops;
  const double bw = p.memory_gbs * 1e3;  // bytes per us
  const double flops_per_us = p.matmul_tflops * 1e6 * p.matmul_efficiency.at(T);
  StepSplit split;
  split.weights_us = (no_kv.weight_bytes + no_kv.activation_bytes) / (bw * p.weight_efficiency.at(T));
  split.kv_us = with_kv.kv_bytes / (bw * p.kv_efficiency.at(T));
  split.flops_us = std::max(0.0, linear_flops / flops_per_us - split.weights_us) +
                   std::max(0.0, attention_flops / flops_per_us - split.kv_us);
  split.overhead_us = p.layer_overhead_us * static_cast<double>(s.layers.size());
  return split;
}

// A stage on a shared executor. One thread pool runs every rank's ops one after another: the
// stage costs all its ranks' bytes and FLOPs, but an attention-DP replica without sequences skips
// its attention, dense and shared-expert work (its routed experts still compute the rows sent to
// them). The fixed time per layer (op calls, the rank threads' hand-offs, small per-head ops) is
// CPU work too: every rank running layers at once adds its own, as far as the cores run them
// side by side (hardware_profile.h).
StepSplit shared_stage_compute(const ModelConfig& c, const parallel::ParallelPlan& plan, const HardwareProfile& p,
                               const parallel::RankShard& s, const ForwardShape& shape,
                               const std::vector<double>& expert_load) {
  const RoutedWork mean = routed_work(c, plan.moe_ep, shape.stage_tokens, expert_load, false);
  const StepSplit rank = rank_compute(c, s, p, shape, mean);
  const double ranks = plan.ranks_per_stage();
  const double busy = (shape.busy_replicas > 0 ? std::min<double>(shape.busy_replicas, plan.attn_dp) : plan.attn_dp) /
                      static_cast<double>(plan.attn_dp);
  const StepCost bytes = cost_at(c, s, shape.replica_tokens, 0, mean.experts_hit, p.element_bytes, p.element_bytes);
  const double experts = bytes.weight_bytes > 0 ? bytes.expert_bytes / bytes.weight_bytes : 0.0;
  const double work = ranks * (busy * (1 - experts) + experts);
  StepSplit split;
  split.weights_us = rank.weights_us * work;
  split.flops_us = rank.flops_us * work;
  split.kv_us = rank.kv_us * ranks * busy;
  const double active = shape.active_ranks > 0 ? shape.active_ranks : ranks;
  const double share = 1.0 / plan.attn_tp;  // of the layer's heads
  const double per_rank = p.shared_rank_layer_us + (p.layer_overhead_us - p.shared_rank_layer_us) * share;
  split.overhead_us = active * per_rank / p.shared_executor_speedup.at(active) * static_cast<double>(s.layers.size());
  return split;
}

void add_collective(StepSplit& split, const HardwareProfile& p, const std::string& site, CollectiveKind kind, int ranks,
                    double bytes, double calls) {
  if (ranks <= 1 || calls <= 0) return;
  split.collectives_us[site] += calls * collective_us(p.link, kind, ranks, bytes);
}

// The calls of one stage's forward of one micro-batch (docs/plans.md, "Communication per layer").
void stage_collectives(const ModelConfig& c, const parallel::ParallelPlan& plan, const HardwareProfile& p,
                       const parallel::RankShard& s, const ForwardShape& shape, StepSplit& split) {
  const double h = static_cast<double>(c.hidden_size), T = shape.replica_tokens;
  double dense = 0, moe = 0;
  for (int64_t l = s.layers.begin; l < s.layers.end; ++l) (c.is_moe_layer(l) ? moe : dense) += 1;
  const double layers = dense + moe;
  // Branch all-reduces move fp32 partial sums on every backend.
  add_collective(split, p, "attn_all_reduce", CollectiveKind::AllReduce, plan.attn_tp, T * h * 4, layers + dense);
  if (plan.attn_dp == 1) {
    add_collective(split, p, "moe_all_reduce", CollectiveKind::AllReduce, plan.ranks_per_stage(), T * h * 4, moe);
  } else {
    const double rows_sent = T / plan.attn_tp * c.num_experts_per_tok * plan.moe_tp;
    const int stage = plan.ranks_per_stage();
    add_collective(split, p, "moe_all_to_all", CollectiveKind::AllToAll, stage, c.n_routed_experts * plan.moe_tp * 4.0,
                   moe);
    add_collective(split, p, "moe_all_to_all", CollectiveKind::AllToAll, stage, rows_sent * h * p.element_bytes,
                   2 * moe);
    add_collective(split, p, "moe_all_reduce", CollectiveKind::AllReduce, plan.attn_tp, T * h * 4, moe);
  }
  if (s.first_stage)
    add_collective(split, p, "embed_all_reduce", CollectiveKind::AllReduce, plan.attn_tp, T * h * p.element_bytes, 1);
  if (s.last_stage)
    add_collective(split, p, "lm_head_all_gather", CollectiveKind::AllGather, plan.attn_tp,
                   T * static_cast<double>(s.vocab.size()) * 4, 1);
  else
    add_collective(split, p, "pp_send", CollectiveKind::SendRecv, 2, T * h * p.element_bytes, 1);
}

}  // namespace

StepSplit stage_time(const ModelConfig& c, const parallel::ParallelPlan& plan, const HardwareProfile& p, int stage,
                     const ForwardShape& shape, const std::vector<double>& expert_load) {
  const parallel::RankShard s = parallel::shard_of(plan, shard_dims(c), parallel::rank_of(plan, stage, 0, 0));
  StepSplit split;
  if (p.ranks_share_executor) {
    split = shared_stage_compute(c, plan, p, s, shape, expert_load);
  } else {
    const RoutedWork busiest = routed_work(c, plan.moe_ep, shape.stage_tokens, expert_load, true);
    split = rank_compute(c, s, p, shape, busiest);
  }
  stage_collectives(c, plan, p, s, shape, split);
  return split;
}

namespace {

// What of a stage's time is waiting rather than executor work: its fixed per-layer time and its collectives.
double latency_us(const StepSplit& s) {
  double t = s.overhead_us;
  for (const auto& [site, us] : s.collectives_us) t += us;
  return t;
}

// Micro-batches the scheduler cuts `batch` sequences into (ceil(live / pp) sequences each).
int64_t micro_batches(const parallel::ParallelPlan& plan, int64_t batch) {
  if (plan.pp == 1) return 1;
  const int64_t per = (batch + plan.pp - 1) / plan.pp;
  return (batch + per - 1) / per;
}

// Ranks of a shared executor running layers at once: the stages the groups in flight keep busy,
// and in each the ranks whose replica has sequences (an attention-DP replica without any skips
// its layers' work; its MoE layers still compute the rows sent to its experts, counted in bytes).
double active_ranks(const parallel::ParallelPlan& plan, int64_t groups, double per_group) {
  const double busy_replicas = std::min<double>(plan.attn_dp, per_group);
  const double per_stage = busy_replicas * plan.attn_tp;
  return static_cast<double>(std::min<int64_t>(groups, plan.pp)) * per_stage;
}

}  // namespace

StepSplit decode_round(const ModelConfig& c, const parallel::ParallelPlan& plan, const HardwareProfile& p,
                       int64_t batch, double context, const AdviseWorkload& w) {
  const int64_t groups = micro_batches(plan, batch);
  const double per_group = std::ceil(static_cast<double>(batch) / groups);
  ForwardShape shape;
  shape.replica_tokens = std::ceil(per_group / plan.attn_dp) * w.verify_tokens;
  shape.stage_tokens = per_group * w.verify_tokens;
  shape.context = context;
  shape.kv_element_bytes = w.kv_cache_fp8 ? 1.0 : 0.0;
  shape.active_ranks = active_ranks(plan, groups, per_group);
  shape.busy_replicas = per_group;
  StepSplit traversal;  // one group through every stage
  double slowest = 0, slowest_latency = 0;
  for (int s = 0; s < plan.pp; ++s) {
    const StepSplit st = stage_time(c, plan, p, s, shape, w.expert_load);
    slowest = std::max(slowest, st.total_us());
    slowest_latency = std::max(slowest_latency, latency_us(st));
    traversal.add(st);
  }
  StepSplit round;
  if (plan.pp == 1) {
    round.add(traversal, static_cast<double>(groups));
  } else if (p.ranks_share_executor) {
    // The executor runs every group's bytes and FLOPs one after another; the stages' latency
    // (fixed per-layer time, collectives) overlaps across the groups in flight, as on GPUs.
    round.add(traversal, static_cast<double>(groups));
    const double latency = std::max(static_cast<double>(groups) * slowest_latency, latency_us(traversal));
    round.bubble_us = latency - static_cast<double>(groups) * latency_us(traversal);
  } else {
    // Groups in flight: the slowest stage runs every group; one group still needs the whole
    // traversal before its next step, and the stages idle for the difference.
    round.add(traversal, static_cast<double>(groups) / plan.pp);
    const double busy = static_cast<double>(groups) * slowest;
    round.bubble_us = std::max(busy, traversal.total_us()) - round.total_us();
  }
  round.host_us = static_cast<double>(groups) * p.step_overhead_us +
                  static_cast<double>(batch) * w.accept_length * p.token_overhead_us;
  return round;
}

namespace {

// One request's prefill: its input on one replica, through every stage.
double prefill_us(const ModelConfig& c, const parallel::ParallelPlan& plan, const HardwareProfile& p,
                  const AdviseWorkload& w) {
  ForwardShape shape;
  shape.replica_tokens = static_cast<double>(w.input_len);
  shape.stage_tokens = static_cast<double>(w.input_len);
  shape.context = static_cast<double>(w.input_len) / 2;
  shape.kv_element_bytes = w.kv_cache_fp8 ? 1.0 : 0.0;
  shape.active_ranks = active_ranks(plan, 1, 1);
  shape.busy_replicas = 1;
  // A prompt's forward runs other kernels than decode (prefill attention, grouped experts over
  // many rows): its bytes and FLOPs at the share of the decode roofline the profile measured.
  const double efficiency = p.prefill_efficiency.at(static_cast<double>(w.input_len));
  double t = p.step_overhead_us;
  for (int s = 0; s < plan.pp; ++s) {
    StepSplit st = stage_time(c, plan, p, s, shape, w.expert_load);
    st.weights_us /= efficiency;
    st.kv_us /= efficiency;
    st.flops_us /= efficiency;
    t += st.total_us();
  }
  return t;
}

}  // namespace

PointPrediction predict_point(const ModelConfig& c, const parallel::ParallelPlan& plan, const HardwareProfile& p,
                              const AdviseWorkload& w, int64_t concurrency) {
  PointPrediction point;
  point.concurrency = concurrency;
  const double context = static_cast<double>(w.input_len) + static_cast<double>(w.output_len) / 2;
  point.round = decode_round(c, plan, p, concurrency, context, w);
  if (!w.speculative_algorithm.empty() && w.verify_tokens > 1) {
    // Drafting: verify_tokens - 1 passes of a one-layer draft (EAGLE / MTP), each about one
    // layer of the target's round at one token per sequence.
    AdviseWorkload plain = w;
    plain.verify_tokens = 1;
    const double one_layer =
        decode_round(c, plan, p, concurrency, context, plain).total_us() / static_cast<double>(c.num_hidden_layers);
    point.round.collectives_us["draft"] += static_cast<double>(w.verify_tokens - 1) * one_layer;
  }
  point.prefill_us = prefill_us(c, plan, p, w);
  // Steady state: each round every sequence emits accept_length tokens, and concurrency x
  // accept_length / output_len requests finish and are replaced by a prefill.
  const double emitted = static_cast<double>(concurrency) * w.accept_length;
  const double round_us =
      point.round.total_us() + emitted / static_cast<double>(std::max<int64_t>(1, w.output_len)) * point.prefill_us;
  point.tpot_ms = round_us / w.accept_length / 1e3;
  point.per_request_tok_s = 1e3 / point.tpot_ms;
  point.aggregate_tok_s = emitted / (round_us * 1e-6);
  point.ttft_ms = (point.prefill_us + round_us) / 1e3;
  return point;
}

namespace {

// Weights as stored and the KV cache, at the profile's element bytes, against its memory.
std::string check_fit(const ModelConfig& c, const parallel::ParallelPlan& plan, const HardwareProfile& p,
                      const AdviseWorkload& w, bool& fits) {
  parallel::MemoryBudget budget;
  budget.bytes_per_rank = static_cast<int64_t>(p.memory_bytes);
  budget.context_tokens = w.context_length > 0 ? w.context_length : w.input_len + w.output_len;
  budget.max_running_requests = w.max_running_requests > 0
                                    ? w.max_running_requests
                                    : *std::max_element(w.concurrency.begin(), w.concurrency.end());
  const auto bytes = static_cast<int64_t>(p.element_bytes);
  std::vector<parallel::RankMemory> ranks;
  for (int r = 0; r < plan.world(); ++r)
    ranks.push_back(
        {rank_weights(c, plan, r, bytes).held_bytes, kv_bytes_per_token(c, plan, r, w.kv_cache_fp8 ? 1 : bytes)});
  try {
    const parallel::MemoryFit fit = parallel::check_memory_fit(plan, ranks, budget);
    fits = true;
    return fmt::format("rank {} needs {} (weights {}); KV room {} tokens per rank", fit.tightest_rank,
                       parallel::format_bytes(static_cast<double>(fit.needed_bytes)),
                       parallel::format_bytes(static_cast<double>(fit.weight_bytes)), fit.kv_token_room);
  } catch (const Error& e) {
    fits = false;
    return e.what();
  }
}

}  // namespace

PlanPrediction predict_plan(const ModelConfig& c, const parallel::ParallelPlan& plan, const HardwareProfile& p,
                            const AdviseWorkload& w) {
  PlanPrediction out;
  out.plan = plan;
  out.fit_note = check_fit(c, plan, p, w, out.fits);
  for (int64_t conc : w.concurrency) out.points.push_back(predict_point(c, plan, p, w, conc));
  return out;
}

Advice advise(const ModelConfig& c, const std::string& model_name, const HardwareProfile& p, int gpus,
              const std::vector<std::string>& plans, const AdviseWorkload& w) {
  MS_CHECK(gpus >= 1, "--gpus must be >= 1 (got {})", gpus);
  Advice advice;
  advice.model = model_name;
  advice.hardware = p.name;
  advice.gpus = gpus;
  advice.workload = w;
  std::vector<std::string> names = plans;
  if (names.empty())
    for (const std::string& n : parallel::preset_names(gpus))
      if (parallel::parse_plan(n).world() == gpus) names.push_back(n);
  for (const std::string& name : names) {
    try {
      const parallel::ParallelPlan plan = parallel::parse_plan(name);
      MS_CHECK(plan.world() <= p.devices, "plan '{}' needs {} ranks; {} has {}", name, plan.world(), p.name, p.devices);
      parallel::validate_plan(plan, shard_dims(c));
      advice.plans.push_back(predict_plan(c, plan, p, w));
    } catch (const Error& e) {
      advice.skipped.emplace_back(name, e.what());
    }
  }
  for (size_t i = 0; i < w.concurrency.size(); ++i) {
    std::vector<std::pair<double, std::string>> order;
    for (const PlanPrediction& plan : advice.plans)
      if (plan.fits) order.emplace_back(-plan.points[i].aggregate_tok_s, plan.plan.name);
    std::sort(order.begin(), order.end());
    advice.ranking[w.concurrency[i]];  // present (empty) when no plan fits
    for (const auto& [speed, name] : order) advice.ranking[w.concurrency[i]].push_back(name);
  }
  return advice;
}

}  // namespace moeserve::perf
