// Devices: what the cost model knows about the machines a plan runs on.
//
// A Devices value describes `count` devices (ranks) of one kind: memory capacity, compute
// throughput, memory bandwidth, a fixed per-operator overhead (why small micro-batches cost more
// per sample), and, for every ordered pair of devices, link latency and bandwidth. The pairwise
// matrices let a description say "fast links inside a node, slower ones across nodes".
//
// Invariants: count >= 1; every matrix is count x count; bandwidths > 0; latencies >= 0.
// transfer_seconds is O(1).
#pragma once

#include <string>
#include <vector>

namespace graphpipe::cost {

struct Devices {
  std::string name;                  // preset or file name, for reports
  int count = 1;
  double memory_bytes = 0.0;         // capacity of each device
  double flops_per_second = 0.0;     // sustained dense throughput of one device
  double memory_bandwidth = 0.0;     // bytes per second of one device's memory
  double op_overhead_seconds = 0.0;  // fixed cost of launching one operator
  double relative_speed = 1.0;       // multiplier applied to measured profiles
  std::vector<std::vector<double>> link_bandwidth;  // bytes per second, [src][dst]
  std::vector<std::vector<double>> link_latency;    // seconds, [src][dst]

  // Latency plus bytes over bandwidth; zero for a device talking to itself.
  double transfer_seconds(int src, int dst, double bytes) const {
    if (src == dst || bytes <= 0.0) return 0.0;
    return link_latency[src][dst] + bytes / link_bandwidth[src][dst];
  }
};

}  // namespace graphpipe::cost
