#include "dist/launch.h"

#include <cstdlib>

#include "core/error.h"

namespace moeserve::dist {

namespace {

int int_value(const std::string& text, const std::string& what) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MS_CHECK(used == text.size() && !text.empty(), "{}: '{}' is not an integer", what, text);
  return value;
}

std::optional<int> env_int_of(const EnvLookup& env, const std::string& name) {
  const auto value = env(name);
  if (!value) return std::nullopt;
  return int_value(*value, name);
}

// MASTER_ADDR:MASTER_PORT when both are set.
std::string master_address(const EnvLookup& env) {
  const auto addr = env("MASTER_ADDR"), port = env("MASTER_PORT");
  if (!addr || !port) return "";
  return *addr + ":" + *port;
}

}  // namespace

std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (!value) return std::nullopt;
  return std::string(value);
}

void split_host_port(const std::string& text, const std::string& what, std::string& host, int& port) {
  const size_t colon = text.rfind(':');
  MS_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < text.size(), "{}: expected HOST:PORT, got '{}'", what,
           text);
  host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  port = int_value(text.substr(colon + 1), what + " port");
  MS_CHECK(port > 0 && port < 65536, "{}: port {} outside [1, 65535]", what, port);
}

Launch resolve_launch(const LaunchArgs& args, const EnvLookup& env) {
  Launch out;
  std::string address = args.dist_init_addr;
  if (args.nnodes > 0) {
    out.nnodes = args.nnodes;
    out.node_rank = args.node_rank < 0 ? 0 : args.node_rank;
    out.source = "flags";
  } else if (const auto world = env_int_of(env, "WORLD_SIZE")) {
    out.nnodes = *world;
    out.node_rank = env_int_of(env, "RANK").value_or(0);
    out.source = "torchrun";
  } else if (const auto tasks = env_int_of(env, "SLURM_NTASKS")) {
    out.nnodes = *tasks;
    out.node_rank = env_int_of(env, "SLURM_PROCID").value_or(0);
    out.source = "SLURM";
  } else {
    MS_CHECK(args.node_rank <= 0, "--node-rank {} without --nnodes", args.node_rank);
    return out;
  }
  if (args.node_rank >= 0) out.node_rank = args.node_rank;
  MS_CHECK(out.nnodes >= 1, "{}: the number of nodes must be at least 1, got {}", out.source, out.nnodes);
  MS_CHECK(out.node_rank >= 0 && out.node_rank < out.nnodes, "{}: node rank {} outside [0, {})", out.source,
           out.node_rank, out.nnodes);
  if (out.nnodes == 1) return out;
  if (address.empty()) address = master_address(env);
  MS_CHECK(!address.empty(), "{} nodes ({}) need --dist-init-addr HOST:PORT (or MASTER_ADDR and MASTER_PORT)",
           out.nnodes, out.source);
  split_host_port(address, "--dist-init-addr", out.host, out.port);
  return out;
}

}  // namespace moeserve::dist
