// Device presets: a CPU rank (measured, or documented constants) and V100-, A100- and
// H100-class GPUs (documented constants). Every preset returns a validated Devices of `count`
// devices.
//
// The GPU constants are sustained figures, not datasheet peaks, because the planner compares
// stage times: what matters is a realistic ratio between compute, memory traffic, launch
// overhead and links. Each compute rate is half of the datasheet's dense peak (no sparsity), for
// float32 and for the 16-bit types a model computing under autocast runs at (Devices::flops_for;
// graph/precision.h).
//
//   preset        memory  FLOP/s fp32  bf16     fp16     mem BW     op ovh  intra-node link    inter-node link
//   v100 (4/node) 16 GiB  62.5e12 *    -        62.5e12  900e9 B/s  10 us   50e9 B/s, 5 us     12.5e9 B/s, 10 us
//   a100 (8/node) 80 GiB  9.75e12      156e12   156e12   2.039e12   5 us    300e9 B/s, 3 us    25e9 B/s, 8 us
//   h100 (8/node) 80 GiB  495e12 *     495e12   495e12   3.35e12    5 us    450e9 B/s, 3 us    50e9 B/s, 8 us
//
// * Not the float32 datasheet rate: v100 and h100 were made before precisions were priced, with
// one rate, the tensor-core one, for every model, and the planner tests and the paper-size
// results (docs/results.md) are tuned to it; their float32 rate stays so until those are redone
// at the datasheet's float32 figures (V100 15.7, H100 67 TFLOP/s: 7.85e12 and 33.5e12 here). So
// on them a 16-bit model gains its halved activation and transfer bytes but no faster compute;
// a100 prices all three precisions from the datasheet.
// v100: Summit's V100-SXM2 16 GB (the paper's machine): 125 TFLOP/s float16 tensor-core peak (no
// bfloat16 tensor cores: bfloat16 falls back to the float32 rate), HBM2 900 GB/s, NVLink 2.0
// (two bricks, 50 GB/s per direction) inside a node, dual-rail EDR InfiniBand (about 12.5 GB/s
// per GPU) across nodes. Summit has 6 GPUs per node; the default groups 4 so that device counts
// of 8 and 32 fill whole nodes.
// a100: A100-SXM4 80 GB: 19.5 TFLOP/s float32 (TF32's 156 is off by default in PyTorch's matrix
// products), 312 bfloat16 and float16, HBM2e 2.039 TB/s, NVLink 3 (300 GB/s per direction)
// inside an 8-GPU node, 200 Gb/s HDR InfiniBand per GPU across nodes.
// h100: H100-SXM 80 GB: 989 TFLOP/s dense bfloat16 and float16, HBM3 3.35 TB/s, NVLink 4 (450
// GB/s per direction) inside an 8-GPU node, 400 Gb/s NDR InfiniBand per GPU across nodes.
// cpu_rank: one process of a CPU training job talking over Gloo/TCP on one host. When measured,
// FLOP/s and memory bandwidth come from a few-millisecond calibration (a blocked matrix product
// and a large copy); otherwise 20e9 FLOP/s and 5e9 B/s. Memory is the physical memory divided
// by the ranks; no 16-bit rate (a CPU's bfloat16 speed is what a profile measures); links are
// loopback TCP (1e9 B/s, 50 us) inside a host and 10 GbE (1.25e9 B/s, 100 us) between hosts. Per-operator overhead 20
// us (eager PyTorch dispatch on a CPU).
//
// per_node groups the devices into nodes (cost/devices.h: Devices::node): the GPU presets
// default to 4 (v100) and 8 (a100, h100) per node, CPU ranks to one host for all.
#pragma once

#include <string>
#include <vector>

#include "cost/devices.h"

namespace graphpipe::cost {

Devices v100(int count, int per_node = 4);
Devices a100(int count, int per_node = 8);
Devices h100(int count, int per_node = 8);
// measure = false gives the documented constants (deterministic, for tests); per_node = 0: one
// host for every rank.
Devices cpu_rank(int count, bool measure = true, int per_node = 0);

// The presets' names: "cpu", "v100", "a100", "h100".
std::vector<std::string> preset_names();
// Looks a preset up by a name from preset_names(); throws PlanningError naming the presets.
// per_node = 0 keeps the preset's own grouping.
Devices preset(const std::string& name, int count, int per_node = 0);

}  // namespace graphpipe::cost
