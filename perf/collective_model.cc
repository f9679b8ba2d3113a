#include "perf/collective_model.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve::perf {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce:
      return "all_reduce";
    case CollectiveKind::AllGather:
      return "all_gather";
    case CollectiveKind::AllToAll:
      return "all_to_all";
    case CollectiveKind::SendRecv:
      return "send_recv";
  }
  return "?";
}

double bytes_on_wire(CollectiveKind kind, int ranks, double bytes) {
  const double n = ranks;
  switch (kind) {
    case CollectiveKind::AllReduce:
      return 2 * (n - 1) / n * bytes;
    case CollectiveKind::AllGather:
      return (n - 1) * bytes;
    case CollectiveKind::AllToAll:
      return (n - 1) / n * bytes;
    case CollectiveKind::SendRecv:
      return bytes;
  }
  return 0;
}

double rank_bandwidth_gbs(const LinkProfile& link, int ranks) {
  double gbs = link.link_gbs;
  // A shared fabric: each of the ranks moving data at once gets its share.
  if (link.fabric_gbs > 0 && link.topology != "nvlink_switch")
    gbs = std::min(gbs, link.fabric_gbs / std::max(1, ranks));
  // Through the host's memory, every byte goes up one PCIe link and down another.
  if (link.topology == "pcie_host") gbs /= 2;
  return gbs;
}

double collective_us(const LinkProfile& link, CollectiveKind kind, int ranks, double bytes) {
  MS_CHECK(ranks >= 1 && bytes >= 0, "collective_us: ranks must be >= 1 and bytes >= 0 (got {}, {})", ranks, bytes);
  if (ranks == 1) return 0;
  const int active = kind == CollectiveKind::SendRecv ? 1 : ranks;  // a send moves one pair's bytes
  return link.alpha_us.at(ranks) + bytes_on_wire(kind, ranks, bytes) / (rank_bandwidth_gbs(link, active) * 1e3);
}

}  // namespace moeserve::perf
