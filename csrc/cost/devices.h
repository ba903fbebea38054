// Devices: what the cost model knows about the machines a plan runs on.
//
// A Devices value describes `count` devices (ranks) of one kind: memory capacity, compute
// throughput, memory bandwidth, a fixed per-operator overhead (why small micro-batches cost more
// per sample), and, for every ordered pair of devices, link latency and bandwidth. The pairwise
// matrices let a description say "fast links inside a node, slower ones across nodes"; `node`
// names each device's node, which a hierarchical all-reduce (cost/all_reduce.h) needs.
//
// Invariants (checked by validate()): count >= 1; every matrix is count x count; capacities,
// throughputs and off-diagonal bandwidths > 0 (the 16-bit rates >= 0, 0: not given); latencies and the overhead >= 0;
// relative_speed > 0; the collective figures >= 0, a latency only with a bandwidth;
// extra_tensor_seconds, where set, collective_overlap_loss, every optimizer_tensor_seconds and
// rank_skew_fraction finite numbers >= 0, optimizer_tensor_seconds keyed by canonical optimizer names; `node` is
// empty (all devices on one node) or has one non-negative entry per device. transfer_seconds is
// O(1).
//
// Presets (documented constants, or a cheap measurement for the CPU rank) are in
// cost/presets.h; the JSON form is in cost/devices_json.h.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/precision.h"

namespace graphpipe::cost {

struct Devices {
  std::string name;  // preset or file name, for reports
  int count = 1;
  double memory_bytes = 0.0;      // capacity of each device
  double flops_per_second = 0.0;  // sustained dense float32 throughput of one device
  // Sustained dense throughput in bfloat16 and in float16 (a GPU's tensor cores), what a model
  // computing in that precision (graph::Precision, the traced autocast dtype) is priced at. 0:
  // no rate of its own, the float32 rate applies (a CPU rank, whose bfloat16 speed only a
  // profile measures; a V100's bfloat16, which has no tensor cores). flops_for picks the rate.
  double bfloat16_flops_per_second = 0.0;
  double float16_flops_per_second = 0.0;
  double memory_bandwidth = 0.0;     // bytes per second of one device's memory
  double op_overhead_seconds = 0.0;  // fixed cost of launching one operator
  // The runtime's own costs, measured by a calibration (benchmarks/compare.py; 0 when not
  // measured): dispatching one forward or backward instruction (its bookkeeping around the
  // stage's operators), and the fixed cost of a training step (the step's setup and ending).
  // The planner (partition/evaluate.h) and the simulator (sim/simulate.h) both charge them.
  double instruction_overhead_seconds = 0.0;
  double step_overhead_seconds = 0.0;
  // How much faster these devices are than the machine that measured the profiles: a measured
  // time is divided by it (2.0 halves every profiled time). Analytic times ignore it.
  double relative_speed = 1.0;
  // The link as a collective sees it (0: not given): every ring step of every collective
  // (cost/rings.h ring_step_seconds: all-reduce, all-gather, the gradient buckets' and the
  // replicas' sync, in the planner and the simulator alike) then costs
  // collective_latency_seconds + chunk / collective_bandwidth_bytes_per_second instead of its
  // slowest point-to-point link's transfer. Why a figure of its own: one link figure cannot
  // price both a pipeline's transfers and a collective. On CPU ranks over Gloo every rank of a
  // ring sends and receives at once, sharing the host's cores, and a 1 MiB all-reduce over 4
  // ranks took 4.5 ms where the point-to-point links priced it at 1.5 ms (8 ranks: 18 vs 3.5
  // ms), so every replicated plan simulated too fast; on GPUs NCCL's all-reduce bus bandwidth
  // differs from its point-to-point bandwidth too. graphpipe/calibration.py measures them by
  // timing real all-reduces at two sizes. They describe one ring of the calibrated ranks and
  // apply to every ring alike (intra- and inter-node), so leave them 0 for a multi-node
  // description whose hierarchy should be priced from its links.
  double collective_latency_seconds = 0.0;
  double collective_bandwidth_bytes_per_second = 0.0;
  // What each tensor of one transfer after the first adds (cost/reshard.h). The runtime posts a
  // transfer's tensors together and then waits for them (runtime/transport.h), so they share the
  // link's latency and each extra one costs only the backend's work for one more message: on 8
  // Gloo ranks on 2 cores, 126-160 us against a 250-306 us one-way latency. Measured by
  // graphpipe/calibration.py; unset, each extra tensor is charged one link latency, the
  // conservative rule for a description that was not measured (the presets).
  std::optional<double> extra_tensor_seconds;
  // The compute a rank loses per second of a collective that runs beside it (0: none, the
  // collective has an engine of its own). On Gloo CPU ranks the collectives' threads share the
  // cores with the backward they are meant to hide behind: with as many ranks as cores, gradient
  // sums posted through a compute lengthened it by about their own priced time or more
  // (docs/results.md), so the overlap that a gradient bucket's sum is priced with does not
  // happen. The simulator charges it (cost::overlap_loss_seconds, cost/gradient_buckets.h),
  // and so does the planner's closed form; graphpipe/calibration.py measures it.
  double collective_overlap_loss = 0.0;
  // What the optimizer step costs per parameter tensor on top of its memory traffic, per
  // optimizer ("sgd", "momentum", "adam"; cost::optimizer_names' canonical names, "adamw" being
  // priced as "adam"). An optimizer without an entry is priced by its bytes alone (not measured;
  // cost::optimizer_step_seconds). torch's optimizers on CPU loop over the tensors one by one
  // (their fused and foreach paths are for accelerators): with the zero_grad after it, each tensor
  // cost SGD 1.4-1.6 us, SGD with momentum 5.4 us and Adam 19 us on this project's 2-core machine
  // (Adam over a 130-tensor model: 2.5 ms that its bytes do not show). Why one price per
  // optimizer: a plan prices the optimizer it is made for (Plan::optimizer, Adam by default),
  // and a single figure measured with SGD priced Adam's step 13 times too cheap.
  // graphpipe/calibration.py measures every optimizer.
  std::map<std::string, double> optimizer_tensor_seconds;
  // How long a step's synchronisation of its ranks waits, per second of the busiest rank's
  // compute, for the slowest of them (0: not measured; rank_skew_seconds). A rank's compute
  // varies from step to step (by 4-7% here, on CPU ranks that share a machine), and a step that
  // ends in collectives (the gradient sums, the closing loss sum) lasts as long as its slowest
  // rank, where a simulator of mean durations sees each rank's mean: the expected maximum over
  // the ranks less their mean. graphpipe/calibration.py measures it as just that, over ranks
  // that compute between barriers (medians over rounds): 0.006-0.024 on 2 Gloo ranks on 2 cores.
  double rank_skew_fraction = 0.0;
  std::vector<std::vector<double>> link_bandwidth;  // bytes per second, [src][dst]
  std::vector<std::vector<double>> link_latency;    // seconds, [src][dst]
  std::vector<int> node;                            // node of each device; empty: one node

  // The node device `d` sits on (0 when `node` is empty).
  int node_of(int d) const { return node.empty() ? 0 : node[d]; }

  // Latency plus bytes over bandwidth; zero for a device talking to itself.
  double transfer_seconds(int src, int dst, double bytes) const {
    if (src == dst || bytes <= 0.0) return 0.0;
    return link_latency[src][dst] + bytes / link_bandwidth[src][dst];
  }

  // What each tensor after the first of one transfer from `src` to `dst` adds:
  // extra_tensor_seconds where measured, else that link's latency.
  double extra_tensor_cost(int src, int dst) const {
    return extra_tensor_seconds ? *extra_tensor_seconds : link_latency[src][dst];
  }

  // What a step over `ranks` ranks waits for its slowest one, given its busiest rank's compute:
  // rank_skew_fraction x compute_seconds, 0 for one rank (nobody to wait for). The one rule; the
  // simulator (sim/simulate.h) and the planner's estimate (partition/evaluate.h) both charge it.
  double rank_skew_seconds(double compute_seconds, int ranks) const {
    return ranks > 1 ? rank_skew_fraction * compute_seconds : 0.0;
  }

  // The analytic compute rate of a model computing in `precision`: its 16-bit rate where given,
  // else flops_per_second (float64 too: no preset gives a float64 rate).
  double flops_for(graph::Precision precision) const;

  // Whether the collective figures are given (a positive bandwidth).
  bool has_collective_link() const { return collective_bandwidth_bytes_per_second > 0.0; }

  // The slowest link between two distinct devices (smallest bandwidth; largest latency), the
  // one a placement-independent estimate assumes. A single device has no link: both are 0.
  double slowest_link_bandwidth() const;
  double slowest_link_latency() const;

  // Checks every invariant above; throws PlanningError naming the field and the value.
  void validate() const;
};

// Fills both matrices for `count` devices grouped `per_node` to a node: pairs inside a node get
// the intra-node link, pairs across nodes the inter-node one, the diagonal gets 0 latency and the
// intra-node bandwidth (never used: a device does not talk to itself). Sets `node` to d / per_node.
// The description of the first `count` ranks (1 <= count <= devices.count): their links and
// nodes, every other figure as it is. What the same machine with fewer devices looks like; a
// planner given it plans as for that smaller cluster. PlanningError for a count out of range.
Devices first_ranks(const Devices& devices, int count);

void set_node_links(Devices& devices, int per_node, double intra_bandwidth, double intra_latency,
                    double inter_bandwidth, double inter_latency);

}  // namespace graphpipe::cost
