// Device presets: a CPU rank (measured, or documented constants) and V100- and H100-class GPUs
// (documented constants). Every preset returns a validated Devices of `count` devices.
//
// The GPU constants are sustained figures, not datasheet peaks, because the planner compares
// stage times: what matters is a realistic ratio between compute, memory traffic, launch
// overhead and links.
//
//   preset       memory   FLOP/s    mem BW     op overhead  intra-node link     inter-node link
//   v100 (4/node) 16 GiB  62.5e12   900e9 B/s  10 us        50e9 B/s, 5 us      12.5e9 B/s, 10 us
//   h100 (8/node) 80 GiB  495e12    3.35e12    5 us         450e9 B/s, 3 us     50e9 B/s, 8 us
//
// v100: Summit's V100-SXM2 16 GB (the paper's machine): half of the 125 TFLOP/s tensor-core
// peak, HBM2 900 GB/s, NVLink 2.0 (two bricks, 50 GB/s per direction) inside a node, dual-rail
// EDR InfiniBand (about 12.5 GB/s per GPU) across nodes. Summit has 6 GPUs per node; the
// default groups 4 so that device counts of 8 and 32 fill whole nodes.
// h100: H100-SXM 80 GB: half of the 989 TFLOP/s dense BF16 peak, HBM3 3.35 TB/s, NVLink 4
// (450 GB/s per direction) inside an 8-GPU node, 400 Gb/s NDR InfiniBand per GPU across nodes.
// cpu_rank: one process of a CPU training job talking over Gloo/TCP on one host. When measured,
// FLOP/s and memory bandwidth come from a few-millisecond calibration (a blocked matrix product
// and a large copy); otherwise 20e9 FLOP/s and 5e9 B/s. Memory is the physical memory divided
// by the ranks; links are loopback TCP (1e9 B/s, 50 us) inside a host and 10 GbE (1.25e9 B/s,
// 100 us) between hosts. Per-operator overhead 20 us (eager PyTorch dispatch on a CPU).
//
// per_node groups the devices into nodes (cost/devices.h: Devices::node): the GPU presets
// default to 4 (v100) and 8 (h100) per node, CPU ranks to one host for all.
#pragma once

#include <string>
#include <vector>

#include "cost/devices.h"

namespace graphpipe::cost {

Devices v100(int count, int per_node = 4);
Devices h100(int count, int per_node = 8);
// measure = false gives the documented constants (deterministic, for tests); per_node = 0: one
// host for every rank.
Devices cpu_rank(int count, bool measure = true, int per_node = 0);

// The presets' names: "cpu", "v100", "h100".
std::vector<std::string> preset_names();
// Looks a preset up by a name from preset_names(); throws PlanningError naming the presets.
// per_node = 0 keeps the preset's own grouping.
Devices preset(const std::string& name, int count, int per_node = 0);

}  // namespace graphpipe::cost
