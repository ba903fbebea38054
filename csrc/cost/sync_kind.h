// SyncKindModel: everything the cost model knows about one kind of sync method, in one place: its
// name, its fields' checks and text, what one gradient tensor loads it with, and one bucket's
// price. cost/sync_kinds.cpp holds one class per kind and the registry, sync_kind_model(), a
// switch over SyncKind that must name every kind (the core builds with -Werror=switch); the rest
// of the cost model, the planner and the bindings ask the model and never compare kinds.
//
// Adding a kind (docs/extending.md, "A sync method"): its enum value in cost/sync_method.h, its
// class and its case in cost/sync_kinds.cpp; a kind with a parameter of its own also adds the
// field to SyncMethod, its JSON (cost/sync_method.cpp) and the binding's constructor.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cost/devices.h"
#include "cost/sync_cost.h"
#include "cost/sync_load.h"
#include "cost/sync_method.h"
#include "graph/op_graph.h"

namespace graphpipe::cost {

// One field of a method as text: "period", "4". `in_summary` false keeps it out of
// SyncMethod::describe() (a default worth showing only in the repr).
struct SyncArgument {
  std::string name;
  std::string value;
  bool in_summary = true;
};

class SyncKindModel {
 public:
  virtual ~SyncKindModel() = default;
  // The name SyncMethod's JSON, describe() and the bindings use, and the other spellings the
  // parser accepts ("topk" for "top_k").
  virtual std::string_view name() const = 0;
  virtual std::vector<std::string_view> aliases() const { return {}; }
  // Replicas average parameters every period instead of summing gradients every step.
  virtual bool local_updates() const { return false; }
  // Priced by the parameters' shapes: a stage whose parameter bytes come without shapes cannot be
  // priced (callers raise PlanningError).
  virtual bool needs_shapes() const { return false; }
  // One all-reduce of every gradient byte: the planner's O(1) estimate prices it as it always has
  // (partition/replica_allocation.cpp).
  virtual bool plain_all_reduce() const { return false; }
  // Throws PlanningError naming the bad field; `what` prefixes the message.
  virtual void validate(const SyncMethod& method, const std::string& what) const;
  // The kind's fields, in the order describe() and the repr print them.
  virtual std::vector<SyncArgument> arguments(const SyncMethod& method) const;
  // What one gradient tensor adds beyond its elements, bytes and count (which tensor_load fills).
  virtual void add_tensor_load(const SyncMethod& method, const graph::ParamShape& tensor, const Devices& devices,
                               SyncLoad& load) const;
  // One bucket's work on one replica (local_sgd: one averaging of the load, not amortised).
  virtual BucketCost price_bucket(const SyncMethod& method, const SyncLoad& load,
                                  const CollectivePricer& pricer) const = 0;
};

// The model of `kind`.
const SyncKindModel& sync_kind_model(SyncKind kind);
// Every kind, in the enum's order.
std::vector<SyncKind> all_sync_kinds();

}  // namespace graphpipe::cost
