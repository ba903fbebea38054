#include "partition/partitioner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "cost/cost_model.h"
#include "partition/evaluate.h"
#include "partition/partitioner_interface.h"
#include "partition/placement.h"
#include "partition/plan_build.h"
#include "partition/problem.h"
#include "partition/registry.h"
#include "partition/size_pool.h"
#include "partition/step_bound.h"

namespace graphpipe::partition {

using plan::Plan;

namespace {

std::string gib(double bytes) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.3g GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buffer;
}

std::int64_t resolve_batch(const graph::OpGraph& g, const Options& o) {
  std::int64_t batch = o.batch_size ? o.batch_size : g.trace_batch_size;
  if (batch < 1) throw PlanningError("the mini-batch size must be at least 1, found " + std::to_string(batch));
  return batch;
}

std::int64_t resolve_micro_batch(std::int64_t batch, const Options& o) {
  if (o.micro_batch_size < 0 || o.num_micro_batches < 0) {
    throw PlanningError("micro_batch_size and num_micro_batches must not be negative");
  }
  std::int64_t fixed = o.micro_batch_size;
  if (o.num_micro_batches) {
    if (batch % o.num_micro_batches != 0) {
      throw PlanningError(std::to_string(o.num_micro_batches) + " micro-batches do not divide the mini-batch of " +
                          std::to_string(batch));
    }
    std::int64_t derived = batch / o.num_micro_batches;
    if (fixed && fixed != derived) {
      throw PlanningError("micro_batch_size " + std::to_string(fixed) + " and num_micro_batches " +
                          std::to_string(o.num_micro_batches) + " disagree for a mini-batch of " +
                          std::to_string(batch));
    }
    fixed = derived;
  }
  return fixed;
}

void check_graph_and_devices(const graph::OpGraph& g, const cost::Devices& devices, bool replicated) {
  if (g.num_nodes() == 0) throw PlanningError("cannot partition an empty graph");
  g.validate();  // GraphError naming a cycle
  if (devices.count < 1) {
    throw PlanningError("cannot partition onto " + std::to_string(devices.count) + " devices: at least 1 is needed");
  }
  // With replication the extra devices become replicas; without, each would need a stage.
  if (!replicated && static_cast<std::size_t>(devices.count) > g.num_nodes()) {
    throw PlanningError(std::to_string(devices.count) + " devices but the graph has only " +
                        std::to_string(g.num_nodes()) + " operators: every stage needs an operator; use at most " +
                        std::to_string(g.num_nodes()) + " devices, or replicate=True to give stages several devices");
  }
}

void check_search_options(const Options& o) {
  if (!o.stage_devices.empty() && !places_by_user(o.partitioner)) {
    throw PlanningError(
        "stage_devices is for a partitioner that places stages as the user says (the manual partitioner); " +
        o.partitioner + " chooses replica counts itself with replicate=True");
  }
  if (o.max_stages < 0) throw PlanningError("max_stages must not be negative");
  if (!(o.tolerance > 0.0)) throw PlanningError("the binary-search tolerance must be positive");
}

// A clear message when no arrangement can fit: one operator too large, or the sum of static
// memory larger than all devices together.
void check_memory_bounds(const cost::CostModel& model, double limit, int devices) {
  const graph::OpGraph& g = model.graph();
  double total = 0.0;
  for (graph::NodeId v = 0; v < static_cast<graph::NodeId>(g.num_nodes()); ++v) {
    double need = model.static_bytes(v);
    total += need;
    if (need > limit) {
      throw PlanningError("the model does not fit: operator " + graph::describe(g, v) + " alone needs " + gib(need) +
                          " for weights, gradients and optimizer state, more than the memory limit of " + gib(limit) +
                          " per device (over by " + gib(need - limit) + ")");
    }
  }
  if (total > limit * devices) {
    throw PlanningError("the model does not fit: weights, gradients and optimizer state need " + gib(total) + ", " +
                        std::to_string(devices) + " devices of " + gib(limit) + " hold " + gib(limit * devices) +
                        " (over by " + gib(total - limit * devices) + ")");
  }
}

// The fastest fitting candidate over micro-batch sizes, and the nearest miss for the message
// when none fits.
struct Choice {
  std::vector<int> assignment;  // empty until a candidate fits
  std::vector<int> replicas;
  std::vector<std::vector<int>> devices;
  std::int64_t micro_batch_size = 0;
  double step = std::numeric_limits<double>::infinity();
  double bottleneck = 0.0;
  std::string partitioner;

  double least_overflow = std::numeric_limits<double>::infinity();
  double overflow_need = 0.0;
  int overflow_stage = -1;
  std::int64_t overflow_micro_batch_size = 0;

  // Micro-batch sizes are offered in ascending order, so a full tie keeps the smaller one.
  void offer(const Problem& problem, CandidatePlan candidate, const Evaluation& ev) {
    if (!ev.fits()) {
      if (ev.max_overflow < least_overflow) {
        least_overflow = ev.max_overflow;
        overflow_stage = ev.worst_memory_stage;
        // What the device of the worst stage holds: that stage, or with several stages per
        // device all of them (evaluate.cpp's shared ranks).
        overflow_need = problem.memory_limit + ev.max_overflow;
        overflow_micro_batch_size = problem.micro_batch_size;
      }
      return;
    }
    const double candidate_step = ev.iteration_seconds(problem);
    if (assignment.empty() || predicted_faster(candidate_step, ev.bottleneck, step, bottleneck)) {
      assignment = std::move(candidate.assignment);
      replicas = std::move(candidate.replicas);
      devices = std::move(candidate.devices);
      micro_batch_size = problem.micro_batch_size;
      step = candidate_step;
      bottleneck = ev.bottleneck;
      partitioner = std::move(candidate.partitioner);
    }
  }
};

// Manual stage_devices: a stage of d devices splits each micro-batch into d shards, so only
// micro-batch sizes of at least d rows can run it.
std::vector<std::int64_t> sizes_for_stage_devices(const Options& o, std::vector<std::int64_t> sizes) {
  std::size_t most = 1;
  int widest = 0;
  for (const auto& [stage, ranks] : o.stage_devices) {
    if (ranks.size() > most) {
      most = ranks.size();
      widest = stage;
    }
  }
  std::vector<std::int64_t> kept;
  for (std::int64_t mb : sizes) {
    if (mb >= static_cast<std::int64_t>(most)) kept.push_back(mb);
  }
  if (kept.empty()) {
    throw PlanningError("stage " + std::to_string(widest) + " has " + std::to_string(most) +
                        " devices but a micro-batch has at most " + std::to_string(sizes.back()) +
                        " rows: every replica needs at least one row");
  }
  return kept;
}

// How many micro-batch sizes are planned at once where the partitioner allows it: the cores.
std::size_t concurrency() { return std::max(1u, std::thread::hardware_concurrency()); }

// partition()'s plans of the micro-batch sizes: the problem and step_lower_bound of each size,
// and its partitioner's candidate, evaluated, unless the bound ruled the size out.
struct SizePlans {
  std::vector<Problem> problems;
  std::vector<double> floors;
  std::vector<std::optional<std::pair<CandidatePlan, Evaluation>>> planned;
};

// The partitioner's candidate at one size, checked and evaluated.
std::pair<CandidatePlan, Evaluation> plan_at(Partitioner& partitioner, const PartitionRequest& request,
                                             const Problem& problem) {
  CandidatePlan candidate = partitioner.plan(request, problem);
  // No layout fits at this size (the sequential DP's answer): the single stage stands in, so
  // that the message can say by how much the nearest plan misses.
  if (candidate.assignment.empty()) {
    candidate.assignment.assign(request.graph.num_nodes(), 0);
    candidate.replicas.clear();
    candidate.devices.clear();
  }
  if (!evaluate(problem, candidate.assignment).acyclic) {
    build_plan(problem, candidate.assignment, candidate.partitioner);  // throws, naming the cycle
  }
  Evaluation ev = evaluate(problem, candidate.assignment, candidate.replicas, candidate.devices);
  return {std::move(candidate), std::move(ev)};
}

// The sizes are taken in ascending order of bound (ties: the smaller size) by as many workers as
// the machine has cores when the partitioner allows it (else one): each takes the next size and
// plans it, unless its bound is above the step of a fitting plan found so far, when it cannot win
// (step_bound.h) and is skipped. A worker takes a new size as soon as it is free, so a slow size
// does not hold the others back. Which sizes are skipped may depend on which plans were done
// first, but never the choice: a skipped size's every plan is slower than a plan partition()
// offers, and partition() offers the planned ones in ascending order of size, so the choice is
// what planning every size gives. An error stops the workers taking sizes and reaches the caller
// from the smallest size that threw. (Manual stage_devices may name any ranks: no bound is
// claimed for them, and every size is planned.)
SizePlans plan_sizes(Partitioner& partitioner, const PartitionRequest& request) {
  const std::vector<std::int64_t>& sizes = request.micro_batch_sizes;
  SizePlans out;
  out.problems.reserve(sizes.size());
  out.floors.reserve(sizes.size());
  for (std::int64_t mb : sizes) {
    out.problems.push_back(request.problem(mb));
    out.floors.push_back(step_lower_bound(out.problems.back()));
  }
  out.planned.resize(sizes.size());
  const bool prune = request.options.stage_devices.empty() && sizes.size() > 1;
  std::vector<std::size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (prune) {
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return out.floors[a] < out.floors[b]; });
  }
  std::size_t next = 0;
  double fitting_step = std::numeric_limits<double>::infinity();
  // The next size to plan in that order, past those the bound rules out; nullopt: none left.
  auto take = [&]() -> std::optional<std::size_t> {
    for (; next < order.size(); ++next) {
      const std::size_t i = order[next];
      if (prune && out.floors[i] > fitting_step * (1.0 + 1e-9)) {
        log::debug("partition: micro-batch size " + std::to_string(sizes[i]) + " skipped: no plan there beats " +
                   std::to_string(fitting_step) + " s (its step is at least " + std::to_string(out.floors[i]) + " s)");
        continue;
      }
      ++next;
      return i;
    }
    return std::nullopt;
  };
  on_workers(
      partitioner.plans_sizes_at_once() ? concurrency() : 1, sizes.size(), take,
      [&](std::size_t i) { return plan_at(partitioner, request, out.problems[i]); },
      [&](std::size_t i, std::pair<CandidatePlan, Evaluation> result) {
        if (result.second.fits())
          fitting_step = std::min(fitting_step, result.second.iteration_seconds(out.problems[i]));
        out.planned[i] = std::move(result);
      });
  return out;
}

// The driver's resolved inputs, after the checks partition() makes in this order.
struct Resolved {
  std::int64_t batch = 0;
  std::vector<std::int64_t> micro_batch_sizes;
  double limit = 0.0;
  int max_stages = 1;
};

Resolved resolve(const graph::OpGraph& g, const cost::Devices& devices, const Options& o,
                 const cost::CostModel& model) {
  Resolved r;
  r.batch = resolve_batch(g, o);
  r.micro_batch_sizes = micro_batch_candidates(r.batch, resolve_micro_batch(r.batch, o));
  r.micro_batch_sizes = sizes_for_stage_devices(o, std::move(r.micro_batch_sizes));
  if (o.memory_limit < 0.0) throw PlanningError("memory_limit must not be negative");
  r.limit = o.memory_limit > 0.0 ? o.memory_limit : devices.memory_bytes;
  r.max_stages = std::min(o.max_stages > 0 ? std::min(o.max_stages, devices.count) : devices.count,
                          static_cast<int>(g.num_nodes()));
  check_memory_bounds(model, r.limit, r.max_stages);
  return r;
}

// The request that partition(), CandidateSet and candidate_floor answer: `o` resolved against
// `model` (resolve()'s checks, in its order). `o` and `model` must outlive it.
PartitionRequest resolved_request(const graph::OpGraph& g, const cost::Devices& devices, const Options& o,
                                  const cost::CostModel& model, const Partitioner& partitioner) {
  Resolved r = resolve(g, devices, o, model);
  return PartitionRequest{.graph = g,
                          .devices = devices,
                          .options = o,
                          .model = model,
                          .batch_size = r.batch,
                          .micro_batch_sizes = std::move(r.micro_batch_sizes),
                          .memory_limit = r.limit,
                          .max_stages = r.max_stages,
                          .chain = partitioner.plans_chains()};
}

std::unique_ptr<Partitioner> checked_partitioner(const graph::OpGraph& g, const cost::Devices& devices,
                                                 const Options& o) {
  check_graph_and_devices(g, devices, o.replicate || !o.stage_devices.empty());
  std::unique_ptr<Partitioner> partitioner = make_partitioner(o.partitioner);  // unknown name: PlanningError
  check_search_options(o);
  o.sync.validate();
  return partitioner;
}

}  // namespace

plan::Plan partition(const graph::OpGraph& g, const cost::Devices& devices, const Options& o) {
  std::unique_ptr<Partitioner> partitioner = checked_partitioner(g, devices, o);
  cost::CostModel model(g, devices, o.optimizer);
  const PartitionRequest request = resolved_request(g, devices, o, model, *partitioner);
  const double limit = request.memory_limit;
  partitioner->prepare(request);

  SizePlans plans = plan_sizes(*partitioner, request);
  const std::vector<std::int64_t>& sizes = request.micro_batch_sizes;
  const std::vector<Problem>& problems = plans.problems;
  const std::vector<double>& floors = plans.floors;
  auto& planned = plans.planned;
  Choice best;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (!planned[i]) continue;
    auto& [candidate, ev] = *planned[i];
    log::debug("partition: micro-batch size " + std::to_string(sizes[i]) + ": step " +
               std::to_string(ev.iteration_seconds(problems[i])) + " s, at least " + std::to_string(floors[i]) + " s");
    best.offer(problems[i], std::move(candidate), ev);
  }
  if (best.assignment.empty()) {
    throw PlanningError(
        "the model does not fit in memory: the best " + o.partitioner + " plan (micro-batch size " +
        std::to_string(best.overflow_micro_batch_size) + ") needs " + gib(best.overflow_need) +
        " on the device of stage " + std::to_string(best.overflow_stage) + ", the limit is " + gib(limit) +
        " per device (over by " + gib(best.least_overflow) +
        "); use more devices, a larger memory limit, smaller micro-batches or an optimizer with less state");
  }
  const auto chosen = static_cast<std::size_t>(std::find(sizes.begin(), sizes.end(), best.micro_batch_size) -
                                               sizes.begin());  // its Problem is built
  Plan plan = build_plan(problems[chosen], best.assignment, best.partitioner, best.replicas, best.devices);
  plan.sync = o.sync;
  log::info(best.partitioner + ": " + std::to_string(plan.stages.size()) + " stages, depth " +
            std::to_string(plan.depth) + ", micro-batch " + std::to_string(plan.micro_batch_size));
  return plan;
}

namespace {

// (compute_bound, pipeline_bound) of an evaluated candidate (RankedCandidate says why they hold).
std::pair<double, double> bounds(const Problem& problem, const Evaluation& ev, const cost::Devices& devices) {
  const auto M = static_cast<double>(problem.num_micro_batches);
  const int k = ev.num_stages;
  std::vector<double> work(k), before(k, 0.0), after(k, 0.0);
  double slowest = 0.0;
  for (int s = 0; s < k; ++s) {
    const StageFigures& f = ev.stages[s];
    // Planned for the zero-bubble schedule, a split backward runs as its two halves (each
    // dispatched): the lesser of the two sums. Else every backward runs whole.
    const double backward =
        problem.zero_bubble ? std::min(f.backward, f.backward_input + f.backward_weight) : f.backward;
    work[s] = f.forward + backward + f.dispatch;
    slowest = std::max(slowest, work[s]);
  }
  // Stages are numbered topologically and stage_edges sorted by source: the longest forward
  // path into each stage, and (with a chain's hops, which its edges hold) the longest backward
  // path from each back to a source, which is the same path walked the other way.
  for (const auto& [a, b] : ev.stage_edges) before[b] = std::max(before[b], before[a] + ev.stages[a].forward);
  for (const auto& [a, b] : ev.stage_edges) after[b] = std::max(after[b], after[a] + ev.stages[a].backward);
  double pipeline = 0.0;
  for (int s = 0; s < k; ++s) pipeline = std::max(pipeline, before[s] + M * work[s] + after[s]);
  return {M * slowest + devices.step_overhead_seconds, pipeline + devices.step_overhead_seconds};
}

// The partitioner's candidates at one size, each once, evaluated, in its order; those that do
// not fit or whose stages feed each other in a cycle are left out.
std::vector<RankedCandidate> ranked(Partitioner& partitioner, const PartitionRequest& request, const Problem& problem) {
  std::vector<RankedCandidate> out;
  std::set<std::pair<std::vector<int>, std::vector<int>>> seen;
  for (CandidatePlan& c : partitioner.candidates(request, problem)) {
    if (c.assignment.empty()) continue;
    if (!seen.emplace(c.assignment, c.replicas).second) continue;
    Evaluation ev = evaluate(problem, c.assignment, c.replicas, c.devices);
    if (!ev.acyclic || !ev.fits()) continue;
    const auto [compute, pipeline] = bounds(problem, ev, request.devices);
    out.push_back(
        {problem.micro_batch_size, std::move(c), ev.iteration_seconds(problem), ev.bottleneck, compute, pipeline});
  }
  return out;
}

// A lower bound on the bound the planner orders each candidate at `problem`'s micro-batch size
// by (CandidateSet), and so on its simulated step under the schedule it was planned for:
// compute_lower_bound (step_bound.h) under a split backward (Options::zero_bubble), where
// compute_bound orders; else the greater of it and pipeline_lower_bound, both below
// pipeline_bound, which orders where every backward runs whole.
double size_floor(const Problem& problem) {
  return problem.zero_bubble ? compute_lower_bound(problem)
                             : std::max(compute_lower_bound(problem), pipeline_lower_bound(problem));
}

}  // namespace

double candidate_floor(const graph::OpGraph& g, const cost::Devices& devices, const Options& o) {
  std::unique_ptr<Partitioner> partitioner = checked_partitioner(g, devices, o);
  const cost::CostModel model(g, devices, o.optimizer);
  const PartitionRequest request = resolved_request(g, devices, o, model, *partitioner);
  double least = std::numeric_limits<double>::infinity();
  for (std::int64_t mb : request.micro_batch_sizes) least = std::min(least, size_floor(request.problem(mb)));
  return least;
}

CandidateSet::CandidateSet(const graph::OpGraph& g, const cost::Devices& devices, const Options& o, double listed_below,
                           std::size_t first_sizes)
    : graph_(g), devices_(devices), options_(o) {
  partitioner_ = checked_partitioner(g, devices, options_);
  model_ = std::make_unique<cost::CostModel>(g, devices, options_.optimizer);
  request_ = std::make_unique<PartitionRequest>(resolved_request(g, devices, options_, *model_, *partitioner_));
  partitioner_->prepare(*request_);
  for (std::int64_t mb : request_->micro_batch_sizes) {
    Problem problem = request_->problem(mb);
    const double floor = size_floor(problem);
    if (std::isfinite(listed_below) && floor > listed_below * (1.0 + 1e-9)) {
      log::debug("candidates: micro-batch size " + std::to_string(mb) + " not listed: its floor " +
                 std::to_string(floor) + " s is above " + std::to_string(listed_below) + " s");
      continue;
    }
    pending_.emplace_back(floor, mb);
    problems_.emplace(mb, std::move(problem));
  }
  // Least floor first; among equal floors the larger size (the order partition()'s pool plans them
  // in does not matter here: every size below the step is listed in the end).
  std::stable_sort(pending_.begin(), pending_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const std::size_t now = first_sizes == 0 ? pending_.size() : std::min(first_sizes, pending_.size());
  std::vector<std::int64_t> sizes;
  for (std::size_t i = 0; i < now; ++i) sizes.push_back(pending_[i].second);
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(now));
  list(sizes);
}

bool CandidateSet::pending_below(double step) const {
  return !pending_.empty() && pending_.front().first <= step * (1.0 + 1e-9);
}

void CandidateSet::list_below(double step) {
  std::vector<std::int64_t> sizes;
  for (const auto& [floor, mb] : pending_) {
    if (floor <= step * (1.0 + 1e-9)) {
      sizes.push_back(mb);
    } else {
      log::debug("candidates: micro-batch size " + std::to_string(mb) + " not listed: its floor " +
                 std::to_string(floor) + " s is above " + std::to_string(step) + " s");
    }
  }
  pending_.clear();
  list(sizes);
}

void CandidateSet::list(const std::vector<std::int64_t>& sizes) {
  // As partition() does: as many workers as the machine has cores, where the partitioner allows
  // it, each listing and evaluating the next size's candidates; the lists are joined in
  // ascending order of size all the same.
  std::vector<std::vector<RankedCandidate>> lists(sizes.size());
  std::size_t next = 0;
  on_workers(
      partitioner_->plans_sizes_at_once() ? concurrency() : 1, sizes.size(),
      [&]() -> std::optional<std::size_t> {
        if (next == sizes.size()) return std::nullopt;
        return next++;
      },
      [&](std::size_t i) { return ranked(*partitioner_, *request_, problems_.at(sizes[i])); },
      [&](std::size_t i, std::vector<RankedCandidate> list) { lists[i] = std::move(list); });
  for (std::size_t i = 0; i < sizes.size(); ++i) by_size_[sizes[i]] = std::move(lists[i]);
  candidates_.clear();
  for (const auto& [mb, list] : by_size_) {  // ascending size
    for (std::size_t c = 0; c < list.size(); ++c) {
      candidates_.push_back(list[c]);
      candidates_.back().listed = c;
    }
  }
  // partition()'s preference: predicted step, then slowest stage (predicted_faster), then the
  // earlier micro-batch size and candidate, which the stable sort keeps.
  std::stable_sort(candidates_.begin(), candidates_.end(), [](const RankedCandidate& a, const RankedCandidate& b) {
    return predicted_faster(a.predicted_step, a.bottleneck, b.predicted_step, b.bottleneck);
  });
}

CandidateSet::~CandidateSet() = default;

plan::Plan CandidateSet::build(std::size_t i) const {
  const RankedCandidate& c = candidates_.at(i);
  Plan plan = build_plan(problems_.at(c.micro_batch_size), c.layout.assignment, c.layout.partitioner, c.layout.replicas,
                         c.layout.devices);
  plan.sync = options_.sync;
  return plan;
}

plan::Plan CandidateSet::build(std::size_t i, const std::vector<std::vector<int>>& label_ranks) const {
  const RankedCandidate& c = candidates_.at(i);
  std::vector<int> replicas(label_ranks.size());
  for (std::size_t label = 0; label < label_ranks.size(); ++label) {
    replicas[label] = static_cast<int>(label_ranks[label].size());
  }
  Plan plan =
      build_plan(problems_.at(c.micro_batch_size), c.layout.assignment, c.layout.partitioner, replicas, label_ranks);
  plan.sync = options_.sync;
  return plan;
}

std::vector<std::vector<std::vector<int>>> CandidateSet::replica_growths(std::size_t i, const plan::Plan& plan) const {
  const RankedCandidate& c = candidates_.at(i);
  const Problem& problem = problems_.at(c.micro_batch_size);
  std::vector<std::vector<std::vector<int>>> growths;
  if (!problem.replicated() || !options_.stage_devices.empty()) return growths;
  const ReplicaTable& table = *problem.replicas;
  // Stage s of the plan (numbered topologically by plan building) is the label of its operators.
  std::vector<std::vector<int>> ranks(plan.stages.size());
  std::vector<int> label(plan.stages.size());
  int used = 0;
  for (const plan::Stage& stage : plan.stages) {
    ranks[stage.id] = stage.devices;
    label[stage.id] = c.layout.assignment[stage.nodes.front()];
    used += static_cast<int>(stage.devices.size());
  }
  for (std::size_t s = 0; s < ranks.size(); ++s) {
    const int now = static_cast<int>(ranks[s].size());
    const int level = table.level_of(now);
    if (level + 1 >= table.num_levels()) continue;
    const int next = table.replicas(level + 1);
    if (used - now + next > problem.device_budget) continue;
    std::vector<int> grown = grow_stage(devices_, ranks, static_cast<int>(s), next - now, problem.placement_ranks);
    if (grown.empty()) continue;
    std::vector<std::vector<int>> by_label(ranks.size());
    for (std::size_t t = 0; t < ranks.size(); ++t) by_label[label[t]] = t == s ? grown : ranks[t];
    growths.push_back(std::move(by_label));
  }
  return growths;
}

}  // namespace graphpipe::partition
