// How a process learns its place in a multi-process server: SGLang's flags (--nnodes,
// --node-rank, --dist-init-addr HOST:PORT), else torchrun's contract (WORLD_SIZE, RANK,
// MASTER_ADDR, MASTER_PORT), else SLURM's (SLURM_NTASKS, SLURM_PROCID, with MASTER_ADDR and
// MASTER_PORT or the flag for the address). A "node" here is one moeserve process: one per
// machine (its threads drive the machine's GPUs) or one per GPU.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace moeserve::dist {

struct LaunchArgs {
  int nnodes = 0;  // 0: not given (the environment, else 1)
  int node_rank = -1;
  std::string dist_init_addr;  // HOST:PORT
  double join_timeout_s = 120.0;
  double heartbeat_timeout_s = 5.0;
};

struct Launch {
  int nnodes = 1;
  int node_rank = 0;
  std::string host;
  int port = 0;
  std::string source;  // "flags", "torchrun" or "SLURM": where the values came from
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
// The process environment.
std::optional<std::string> process_env(const std::string& name);

// The launch the flags and the environment describe (flags first); an Error names the flag or
// variable that is missing or malformed.
Launch resolve_launch(const LaunchArgs& args, const EnvLookup& env = process_env);

// "host:port" (IPv6 as "[::1]:port"): the parts, or an Error naming `what`.
void split_host_port(const std::string& text, const std::string& what, std::string& host, int& port);

}  // namespace moeserve::dist
