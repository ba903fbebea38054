// The series-parallel DP's search over targets and its public functions (graphpipe_dp.h); the
// solver's other parts are listed in dp_solver.h.
#include "partition/series_parallel_dp/graphpipe_dp.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "partition/evaluate.h"
#include "partition/series_parallel_dp/dp_solver.h"
#include "partition/step_bound.h"

namespace graphpipe::partition {

namespace series_parallel_dp {

namespace {

// Whether every stage made of some of `nodes` fits the memory limit unrecomputed with as many
// micro-batches in flight as any stage holds (M; dp_solver.h, memory_free_): a stage's static
// bytes are its operators', and its activations its operators' and the tensors they receive, so
// all of nodes' bytes, with every tensor they receive, bound every such stage's.
bool memory_never_binds(const Problem& p, const std::vector<graph::NodeId>& nodes) {
  if (p.memory_limit <= 0.0) return false;  // no claim about a limit nothing fits
  const graph::OpGraph& g = *p.graph;
  double fixed = 0.0, per_micro_batch = 0.0;
  for (graph::NodeId v : nodes) {
    fixed += p.static_bytes[v];
    per_micro_batch += p.act_bytes[v];
    for (graph::EdgeId e : g.in_edges(v)) per_micro_batch += p.edge_bytes[e];
  }
  const auto in_flight_most = static_cast<double>(std::max<std::int64_t>(1, p.num_micro_batches));
  // The margin keeps a stage's bytes, summed in another order, from crossing the limit by rounding.
  return fixed + per_micro_batch * in_flight_most <= p.memory_limit * (1.0 - 1e-9);
}

}  // namespace

Solver::Solver(const Problem& p, const graph::SPTree& tree, SearchShortcuts shortcuts)
    : p_(p),
      tree_(tree),
      stamps_(p.num_nodes(), -1),
      device_floor_(shortcuts.device_floor),
      pinned_rebuild_(shortcuts.pinned_rebuild),
      path_floor_(shortcuts.path_floor) {
  const std::size_t count = tree.nodes.size();
  leaves_.resize(count);
  whole_.resize(count);
  parent_.assign(count, -1);
  slot_.assign(count, -1);
  for (std::size_t t = 0; t < count; ++t) {
    leaves_[t] = tree.leaves(static_cast<int>(t));
    whole_[t] = group(leaves_[t]);
    const auto& children = tree.nodes[t].children;
    for (std::size_t c = 0; c < children.size(); ++c) {
      parent_[children[c]] = static_cast<int>(t);
      slot_[children[c]] = static_cast<int>(c);
    }
  }
  sorted_.resize(count);
  items_.resize(count);
  for (std::size_t t = 0; t < count; ++t) {
    const graph::SPNode& node = tree.nodes[t];
    if (node.kind != graph::SPNode::Kind::parallel) continue;
    sorted_[t] = node.children;
    std::stable_sort(sorted_[t].begin(), sorted_[t].end(),
                     [&](int x, int y) { return whole_[x].compute > whole_[y].compute; });
    // The two largest branches, which may share the fork or the join stage, as sequences of
    // series items: a branch's children when it is a series node, else the branch itself.
    for (std::size_t lead = 0; lead < 2 && lead < sorted_[t].size(); ++lead) {
      const int b = sorted_[t][lead];
      const graph::SPNode& branch = tree.nodes[b];
      items_[b] = branch.kind == graph::SPNode::Kind::series ? branch.children : std::vector<int>{b};
    }
  }
  devices_ = std::max(1, std::min({p.max_stages, 255, static_cast<int>(p.num_nodes())}));
  if (p.replicated()) {
    // Replicas, not stages, spend the devices: the budget is the device count (docs/design.md,
    // "Replicated stages in the planner").
    rep_ = p.replicas.get();
    devices_ = std::max(1, std::min(p.device_budget, 255));
    num_levels_ = 0;
    while (num_levels_ < rep_->num_levels() && rep_->replicas(num_levels_) <= devices_) ++num_levels_;
    for (std::size_t t = 0; t < count; ++t) whole_[t] = group(leaves_[t]);  // with their levels
  }
  memory_free_.assign(count, 0);
  if (shortcuts.memory_free) {
    for (std::size_t t = 0; t < count; ++t) memory_free_[t] = memory_never_binds(p, leaves_[t]);
  }
  std::vector<double> op_work(p.num_nodes());
  for (std::size_t v = 0; v < p.num_nodes(); ++v) op_work[v] = operator_work(p, static_cast<int>(v), devices_, false);
  work_.assign(count, 0.0);
  for (std::size_t t = 0; t < count; ++t) {
    for (graph::NodeId v : leaves_[t]) work_[t] += op_work[v];
  }
  suffix_work_.resize(count);
  for (std::size_t t = 0; t < count; ++t) {
    const graph::SPNode& node = tree.nodes[t];
    const std::vector<int>& parts = node.kind == graph::SPNode::Kind::parallel ? sorted_[t] : node.children;
    suffix_work_[t].assign(parts.size() + 1, 0.0);
    for (std::size_t c = parts.size(); c-- > 0;) suffix_work_[t][c] = suffix_work_[t][c + 1] + work_[parts[c]];
  }
  item_work_.resize(count);
  for (std::size_t b = 0; b < count; ++b) {
    const std::vector<int>& items = items_[b];
    item_work_[b].assign(items.size() + 1, 0.0);
    for (std::size_t c = items.size(); c-- > 0;) item_work_[b][c] = item_work_[b][c + 1] + work_[items[c]];
  }
  paths();
}

void Solver::paths() {
  const std::size_t count = tree_.nodes.size();
  path_.assign(count, 0.0);
  std::vector<int> preorder{tree_.root};  // reversed, every child comes before its parent
  for (std::size_t next = 0; next < preorder.size(); ++next) {
    for (int c : tree_.nodes[preorder[next]].children) preorder.push_back(c);
  }
  for (auto it = preorder.rbegin(); it != preorder.rend(); ++it) {
    const int t = *it;
    const graph::SPNode& node = tree_.nodes[t];
    if (node.kind == graph::SPNode::Kind::leaf) path_[t] = operator_least_time(p_, node.op, devices_, false);
    for (int c : node.children) {
      path_[t] = node.kind == graph::SPNode::Kind::series ? path_[t] + path_[c] : std::max(path_[t], path_[c]);
    }
  }
  auto suffixes = [&](const std::vector<int>& parts) {
    std::vector<double> sums(parts.size() + 1, 0.0);
    for (std::size_t c = parts.size(); c-- > 0;) sums[c] = sums[c + 1] + path_[parts[c]];
    return sums;
  };
  suffix_path_.assign(count, {});
  item_path_.assign(count, {});
  for (std::size_t t = 0; t < count; ++t) {
    if (tree_.nodes[t].kind == graph::SPNode::Kind::series) suffix_path_[t] = suffixes(tree_.nodes[t].children);
    item_path_[t] = suffixes(items_[t]);
  }
}

std::vector<ReplicatedAssignment> Solver::run(double tolerance, int root_devices) {
  // The root's devices: the budget of this search. Every fragment's least depth with n devices at
  // a target is the same whatever the root's budget, so the depths kept from a search on another
  // budget bound this one's probes as its own do (graphpipe_ladder_plans).
  root_devices_ = std::clamp(root_devices, 1, devices_);
  root_levels_ = 1;
  if (rep_) {
    root_levels_ = 0;
    while (root_levels_ < num_levels_ && rep_->replicas(root_levels_) <= root_devices_) ++root_levels_;
  }
  seen_.clear();
  plan_at_.clear();
  replicas_at_.clear();
  probes_ = 0;
  std::optional<double> least;
  std::vector<double> picks;
  int main_probes = 0;
  for (;;) {
    least = least_target(tolerance);
    if (!least) return {};
    main_probes = probes_;
    picks = shallower_targets(*least, tolerance);
    // The bounded probes kept no moves. With pinned_rebuild_, each pick is solved again with its
    // own probe's depths as bounds, which pin every fragment that probe solved, and the rebuild
    // searches only the fragments on the plan's path for their moves (a whole exact solve was
    // a sixth of the planning time: MMT at paper size on 64 V100s, replicated). Otherwise the
    // picks are solved again exactly; should an exact solve ever find another depth than the
    // bounded probe did, the bounds were wrong somewhere, and the whole search runs again
    // without them. The tests check that both give the same plans.
    bool agree = true;
    for (double target : picks) {
      if (plan_at_.count(target) != 0) continue;
      if (pinned_rebuild_ && bounded_) {
        plan_at_.emplace(target, rebuild_pinned(target));
        replicas_at_.emplace(target, rebuilt_replicas_);
        continue;
      }
      const int depth = feasible(target, Bounds::none) ? solve(tree_.root, root_devices_, 0).depth : kInf;
      if (depth != seen_.at(target)) {
        agree = false;
        break;
      }
      plan_at_.emplace(target, rebuild());
      replicas_at_.emplace(target, rebuilt_replicas_);
    }
    if (agree) break;
    log::warn("graphpipe: a bounded probe disagreed with the exact solve at its target; searching again exactly");
    bounded_ = false;
    seen_.clear();
    plan_at_.clear();
    replicas_at_.clear();
    depths_.clear();
    probes_ = 0;
  }
  log::debug("graphpipe: target " + std::to_string(*least) + " s per micro-batch after " + std::to_string(main_probes) +
             " probes; " + std::to_string(picks.size() - 1) + " shallower plans after " +
             std::to_string(probes_ - main_probes) + " more");
  std::vector<ReplicatedAssignment> plans;
  plans.reserve(picks.size());
  for (double target : picks) {
    plans.push_back({plan_at_.at(target), rep_ ? replicas_at_.at(target) : std::vector<int>{}});
  }
  return plans;
}

int Solver::probe(double target) {
  auto [it, fresh] = seen_.try_emplace(target, 0);
  if (fresh) {
    ++probes_;
    it->second = feasible(target, bounded_ ? Bounds::neighbours : Bounds::none)
                     ? solve(tree_.root, root_devices_, 0).depth
                     : kInf;
    // A bounded probe's memo has no moves to rebuild from: run() solves its picks again.
    if (!bounded_ && it->second < kInf) {
      plan_at_.emplace(target, rebuild());
      replicas_at_.emplace(target, rebuilt_replicas_);
    }
  }
  return it->second;
}

std::optional<double> Solver::least_target(double tolerance) {
  double lo = 0.0;
  // With replicas an operator's time can shrink to its time on the smallest shard.
  for (std::size_t v = 0; v < p_.num_nodes(); ++v) {
    lo = std::max(lo, rep_ ? rep_->compute(root_levels_ - 1, static_cast<int>(v)) : p_.compute[v]);
  }
  lo = std::max(lo, p_.total_compute() / root_devices_);
  double hi = whole_[tree_.root].time;
  // At the whole graph's time every grouping meets the target (on one device a stage: with
  // replicas, at level 0): only memory can fail. A stage that fits only recomputed runs its
  // forward once more (recompute.h), so a layout may need up to the whole forward more; that
  // target is probed only when the first fails, so that the search (and every plan that fits
  // without recomputation) stays as it was.
  if (probe(hi) >= kInf) {
    hi += whole_[tree_.root].forward;
    if (probe(hi) >= kInf) return std::nullopt;
  }
  if (probe(lo) < kInf) return lo;
  // The least target is usually within a small factor of the lower bound: gallop up to it
  // before bisecting.
  for (double up = 2.0 * lo; up < hi; up *= 2.0) {
    if (probe(up) < kInf) {
      hi = up;
      break;
    }
    lo = up;
  }
  while (hi > lo * (1.0 + tolerance)) {
    double mid = 0.5 * (lo + hi);
    if (probe(mid) < kInf)
      hi = mid;
    else
      lo = mid;
  }
  return hi;
}

std::vector<double> Solver::shallower_targets(double least, double tolerance) {
  // The step is (M + depth - 1) x slowest stage, so a plan one stage shallower pays for a
  // slightly slower stage. For each depth h below the least target's, the least target reaching
  // h is found by bisection (bracketed by the targets probed so far), but only below the target
  // at which h would stop paying off; a depth that cannot pay off costs at most one probe (none
  // where the longest path needs more than h stages there). Extra probes are capped at
  // max(16, probes so far).
  std::vector<double> picks{least};
  double best = pipeline_step(p_.num_micro_batches, probe(least), least);
  const int limit = probes_ + std::max(16, probes_);
  for (int h = probe(least) - 1; h >= 1 && probes_ < limit;) {
    const double upper = best / pipeline_step(p_.num_micro_batches, h, 1.0);
    // a: the largest probe known too deep for h; b: the smallest known to reach h. A probe
    // above `upper` still too deep for h says, without probing, that h is not reached below it.
    double a = picks.back(), b = upper;
    bool reached = false, too_deep_above = false;
    for (auto [target, depth] : seen_) {
      if (target > upper) {
        too_deep_above = depth > h;
        break;
      }
      if (depth > h)
        a = std::max(a, target);
      else if (!reached)
        b = target, reached = true;
    }
    // Nor is it where the longest path alone needs more than h stages at `upper` (path_depth()):
    // the depth there is above h without a probe, and probes this far above the least target are
    // among the search's dearest (MMT at paper size onto 64 V100s: the shallower searches' probes
    // cost a quarter less).
    if (!reached && (too_deep_above || upper <= a * (1.0 + tolerance) || path_depth_at(path_[tree_.root], upper) > h ||
                     probe(upper) > h)) {
      --h;
      continue;
    }
    while (b > a * (1.0 + tolerance) && probes_ < limit) {
      double mid = 0.5 * (a + b);
      if (probe(mid) <= h)
        b = mid;
      else
        a = mid;
    }
    picks.push_back(b);
    best = std::min(best, pipeline_step(p_.num_micro_batches, probe(b), b));
    h = probe(b) - 1;
  }
  return picks;
}

Solver::BoundsInForce::BoundsInForce(Solver& solver, double target, Bounds bounds) : solver_(solver) {
  // The nearest of all: its depths are the depths at the target. A probe (Bounds::neighbours) finds
  // them where a search on another budget probed the same target (run()).
  const auto at = solver_.depths_.find(target);
  if (bounds == Bounds::own || (bounds == Bounds::neighbours && at != solver_.depths_.end())) {
    const Depths& own = bounds == Bounds::own ? solver_.depths_.at(target) : at->second;
    solver_.lower_.push_back(&own);
    solver_.upper_.push_back(&own);
  }
  if (bounds != Bounds::none) {
    const auto above = solver_.depths_.upper_bound(target);
    for (auto it = above; it != solver_.depths_.end(); ++it) solver_.lower_.push_back(&it->second);
    for (auto it = std::make_reverse_iterator(above); it != solver_.depths_.rend(); ++it)
      if (it->first < target) solver_.upper_.push_back(&it->second);
  }
}

Solver::BoundsInForce::~BoundsInForce() {
  solver_.lower_.clear();
  solver_.upper_.clear();
}

bool Solver::solve_fresh(double target) {
  target_ = target;
  ++probe_id_;  // every Stats' cached meets() mask is stale now
  memo_.clear();
  join_memo_.clear();
  return solve(tree_.root, root_devices_, 0).depth < kInf;
}

bool Solver::feasible(double target, Bounds bounds) {
  const BoundsInForce in_force(*this, target, bounds);
  const bool ok = solve_fresh(target);
  if (bounds == Bounds::neighbours) {
    Depths& depths = depths_[target];
    depths.main.reserve(memo_.size());
    depths.join.reserve(join_memo_.size());
    memo_.for_each([&](std::uint64_t k, const Entry& e) { depths.main.insert(k, e.depth); });
    join_memo_.for_each(
        [&](const std::pair<std::uint64_t, std::uint64_t>& k, const Entry& e) { depths.join.insert(k, e.depth); });
  }
  return ok;
}

std::vector<int> Solver::rebuild_pinned(double target) {
  const BoundsInForce in_force(*this, target, Bounds::own);  // for the rebuild's searches too
  solve_fresh(target);
  return rebuild();
}

}  // namespace series_parallel_dp

std::vector<ReplicatedAssignment> graphpipe_plans(const Problem& problem, const graph::SPTree& tree, double tolerance,
                                                  SearchShortcuts shortcuts) {
  if (tree.root < 0) return {};
  series_parallel_dp::Solver solver(problem, tree, shortcuts);
  return solver.run(tolerance, solver.devices());
}

std::vector<std::vector<ReplicatedAssignment>> graphpipe_ladder_plans(const Problem& problem, const graph::SPTree& tree,
                                                                      double tolerance, const std::vector<int>& budgets,
                                                                      SearchShortcuts shortcuts) {
  std::vector<std::vector<ReplicatedAssignment>> plans(budgets.size());
  if (tree.root < 0) return plans;
  series_parallel_dp::Solver solver(problem, tree, shortcuts);
  for (std::size_t i = 0; i < budgets.size(); ++i) {
    // A budget past the solver's 255 devices searches on 255, as a solver of its own would.
    const int most = problem.replicated() ? problem.device_budget : problem.max_stages;
    if (budgets[i] < 1 || budgets[i] > most) {
      throw PlanningError("graphpipe: a search budget of " + std::to_string(budgets[i]) + " devices is outside 1.." +
                          std::to_string(most));
    }
    plans[i] = solver.run(tolerance, std::min(budgets[i], solver.devices()));
  }
  return plans;
}

std::vector<std::vector<int>> graphpipe_assignments(const Problem& problem, const graph::SPTree& tree,
                                                    double tolerance) {
  std::vector<std::vector<int>> plans;
  for (ReplicatedAssignment& plan : graphpipe_plans(problem, tree, tolerance))
    plans.push_back(std::move(plan.assignment));
  return plans;
}

std::optional<std::vector<int>> graphpipe_assignment(const Problem& problem, const graph::SPTree& tree,
                                                     double tolerance) {
  auto plans = graphpipe_assignments(problem, tree, tolerance);
  if (plans.empty()) return std::nullopt;
  return std::move(plans.front());
}

}  // namespace graphpipe::partition
