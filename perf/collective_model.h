// The alpha-beta model of a collective: time = alpha(group size) + bytes on the wire / bandwidth.
// What crosses the wire per rank follows the algorithms NCCL and the in-process communicator
// use for each call (ring all-reduce: 2 (n-1)/n of the buffer; all-gather: the other n-1 blocks;
// all-to-all: the (n-1)/n of its rows that leave the rank; send: the message). The topology
// decides the bandwidth a rank gets: its own link, or its share of a fabric every rank's traffic
// crosses (PCIe through a switch or the host), and through the host every byte crosses PCIe twice.
#pragma once

#include <string>

#include "perf/hardware_profile.h"

namespace moeserve::perf {

enum class CollectiveKind { AllReduce, AllGather, AllToAll, SendRecv };

const char* collective_name(CollectiveKind kind);

// bytes: all-reduce: the buffer; all-gather: one rank's block; all-to-all: what one rank sends
// in all (its own rows included); send/recv: the message.
double bytes_on_wire(CollectiveKind kind, int ranks, double bytes);

// GB/s one rank's transfer gets while all `ranks` ranks of the group move data at once.
double rank_bandwidth_gbs(const LinkProfile& link, int ranks);

// Microseconds one call takes on `ranks` ranks (0 for one rank: no communication).
double collective_us(const LinkProfile& link, CollectiveKind kind, int ranks, double bytes);

}  // namespace moeserve::perf
