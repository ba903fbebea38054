// SyncMethod: how the replicas of a replicated stage keep in agreement, as the cost model, the
// planner and the simulator price it (docs/design.md, "Pricing the sync methods"). The runtime
// that executes these methods is graphpipe/sync.py and csrc/runtime; each of its methods
// describes itself as one of these (graphpipe.sync.*.cost_method()).
//
//   all_reduce  every step, each gradient bucket is summed by an all-reduce (the default, exact).
//   local_sgd   no gradient exchange; every `period` steps (the mean period for QSR, whose
//               period varies) the replicas' parameters are averaged by one all-reduce of the
//               parameter bytes after the optimizer step (torch's model averaging).
//   top_k       every step, per bucket of n gradient entries, k = ceil(ratio x n) values and
//               their positions are all-gathered, packed (error feedback keeps the rest locally).
//   power_sgd   every step, torch's PowerSGD hook of rank `rank`: per bucket, the tensors worth
//               compressing (min_compression_rate) send rank-r factors P and Q, the others are
//               all-reduced as they are. Priced in its steady state, after start_powerSGD_iter.
//
// `hierarchical` forces the hierarchical algorithm (cost/all_reduce.h, cost/all_gather.h) for
// every collective the method issues, where best_all_reduce would otherwise choose.
//
// validate() throws PlanningError naming the bad field. JSON: {"kind", "period", "ratio",
// "rank", "min_compression_rate", "hierarchical"}; a plan carries the method it was made for.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace graphpipe::cost {

// Each kind is described once, by its SyncKindModel (cost/sync_kind.h, cost/sync_kinds.cpp).
// `end` is not a kind: it marks the end of the list for all_sync_kinds().
enum class SyncKind { all_reduce, local_sgd, top_k, power_sgd, end };

// The kind's name ("all_reduce", "local_sgd", "top_k", "power_sgd"); parse_sync_kind is the
// inverse (it also reads each kind's aliases: "allreduce", "localsgd", "topk", "powersgd") and
// throws PlanningError naming the choices.
std::string to_string(SyncKind kind);
SyncKind parse_sync_kind(const std::string& name);
std::vector<std::string> sync_kind_names();

struct SyncMethod {
  SyncKind kind = SyncKind::all_reduce;
  double period = 1.0;                // local_sgd: mean steps between averagings, >= 1
  double ratio = 0.01;                // top_k: share of each bucket's entries sent, in (0, 1]
  int rank = 1;                       // power_sgd: rank of the factors, >= 1
  double min_compression_rate = 2.0;  // power_sgd: torch's PowerSGDState default, > 0
  bool hierarchical = false;          // force the hierarchical collective algorithms

  // Throws PlanningError naming the field (only the fields of `kind` are checked).
  void validate() const;
  // "all_reduce", "local_sgd(period=4)", "top_k(ratio=0.01)", "power_sgd(rank=2)", with
  // ", hierarchical" inside the parentheses when forced.
  std::string describe() const;
  // Replicas average parameters instead of summing gradients (local_sgd): the kind's trait.
  bool local_updates() const;
  bool operator==(const SyncMethod&) const = default;
};

nlohmann::json to_json(const SyncMethod& method);
// Validates; FormatError names a malformed field, PlanningError a bad value.
SyncMethod sync_method_from_json(const nlohmann::json& value, const std::string& where);

}  // namespace graphpipe::cost
