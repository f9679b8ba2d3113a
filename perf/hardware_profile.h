// A hardware profile: what the plan advisor (perf/advisor.h) knows about a machine. Read from
// a JSON file (perf/profiles/*.json, or what `moeserve plan calibrate` writes) in which every
// field is {"value": ..., "source": "..."}: a public specification (URL or document) or
// "measured here with <command>". A field without a source is an error naming the file and
// the field, so that no number enters a prediction without its provenance.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace moeserve::perf {

// y(x) by linear interpolation in log2(x) between measured points, clamped at both ends
// (efficiencies by tokens per rank, latencies by group size).
struct Curve {
  std::vector<std::pair<double, double>> points;  // (x, y), x > 0, ascending
  double at(double x) const;
};

// How a group of ranks communicates. topology: nvlink_switch (every GPU a full link into a
// non-blocking switch), pcie_switch / pcie_host (GPUs behind a PCIe switch or the host's root
// complex: every rank's traffic shares `fabric_gbs`; through the host it crosses PCIe twice),
// infiniband (one NIC per GPU), in_process (CPU ranks: threads of one process, copies in memory).
struct LinkProfile {
  std::string topology = "in_process";
  Curve alpha_us;         // latency of one collective call by ranks in the group
  double link_gbs = 0;    // per rank and direction, GB/s
  double fabric_gbs = 0;  // all ranks' traffic together (0: no shared limit)
};

struct HardwareProfile {
  std::string name, file;
  int devices = 1;                    // ranks the machine runs (GPUs; CPU rank threads)
  double memory_bytes = 0;            // per rank
  double memory_gbs = 0;              // per rank, peak read bandwidth
  double matmul_tflops = 0;           // per rank, dense peak at the backend's dtype
  double element_bytes = 2;           // activations, KV cache and unquantized weights as stored
  bool ranks_share_executor = false;  // CPU ranks: every rank's ops run on one thread pool, one at a time
  // With ranks_share_executor (required exactly then): a layer's fixed time on a rank is
  // shared_rank_layer_us (what every rank pays: its thread's hand-offs, op calls) plus the rest
  // of layer_overhead_us times the rank's share of the layer's heads (small per-head ops);
  // n ranks with layers at once take n times that over shared_executor_speedup(n) (how far
  // the cores run them side by side).
  double shared_rank_layer_us = 0;
  Curve shared_executor_speedup;
  Curve weight_efficiency;       // share of memory_gbs a weight-streaming op reaches, by tokens
  Curve kv_efficiency;           // the same for attention reading the KV cache
  Curve matmul_efficiency;       // share of matmul_tflops, by tokens
  Curve prefill_efficiency;      // a prompt's forward: share of the roofline above, by prompt tokens
  double layer_overhead_us = 0;  // per layer and rank beyond bytes and FLOPs (launches, small ops)
  double step_overhead_us = 0;   // host time per engine step (scheduling, sampling, outputs)
  double token_overhead_us = 0;  // host time per output token (detokenize, stream)
  LinkProfile link;
  std::map<std::string, std::string> sources;  // field -> where its value comes from
};

HardwareProfile profile_from_json(const nlohmann::ordered_json& json, const std::string& file);
HardwareProfile load_profile(const std::string& path);
nlohmann::ordered_json profile_to_json(const HardwareProfile& profile);

// The profile a `--hardware` argument names: a path, or the name of a file in perf/profiles
// (looked up under `profiles_dir`), e.g. "h200-sxm-x8".
std::string resolve_profile_path(const std::string& name_or_path, const std::string& profiles_dir);

}  // namespace moeserve::perf
