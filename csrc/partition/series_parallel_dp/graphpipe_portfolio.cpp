#include "partition/series_parallel_dp/graphpipe_portfolio.h"

#include <algorithm>
#include <future>
#include <string>
#include <utility>

#include "common/log.h"
#include "partition/downset/downset.h"
#include "partition/evaluate.h"
#include "partition/metis/metis.h"
#include "partition/metis/refine.h"
#include "partition/replica_allocation.h"
#include "partition/sequential/pipedream.h"
#include "partition/sequential/sequential.h"
#include "partition/series_parallel_dp/graphpipe_dp.h"

namespace graphpipe::partition {

namespace {

const std::string kDp(GraphpipePortfolio::kName);
const std::string kChain = kDp + "(chain)";
const std::string kDownset = kDp + "(downset)";
const std::string kFallback = kDp + "(fallback)";
const std::string kPipeDream = kDp + "(pipedream)";

// The operators in the series-parallel tree's order: series children in turn, and each parallel
// node's branches one after another, largest compute first (or smallest first), so that every
// branch is a contiguous run and a cut of the order can give a branch's tail and the next
// branch's head one stage. A topological order.
std::vector<graph::NodeId> branch_order(const Problem& p, const graph::SPTree& tree, bool smallest_first) {
  std::vector<double> weight(tree.nodes.size(), 0.0);
  for (std::size_t t = 0; t < tree.nodes.size(); ++t) {
    const graph::SPNode& node = tree.nodes[t];
    if (node.kind == graph::SPNode::Kind::leaf) weight[t] = p.compute[node.op];
    for (int c : node.children) weight[t] += weight[c];  // children come before their parent
  }
  std::vector<graph::NodeId> order;
  order.reserve(p.num_nodes());
  std::vector<int> todo{tree.root};
  while (!todo.empty()) {
    const graph::SPNode& node = tree.nodes[todo.back()];
    todo.pop_back();
    if (node.kind == graph::SPNode::Kind::leaf) {
      order.push_back(node.op);
      continue;
    }
    std::vector<int> children = node.children;
    if (node.kind == graph::SPNode::Kind::parallel) {
      std::stable_sort(children.begin(), children.end(),
                       [&](int a, int b) { return smallest_first ? weight[a] < weight[b] : weight[a] > weight[b]; });
    }
    todo.insert(todo.end(), children.rbegin(), children.rend());
  }
  return order;
}

// The sequential DP's cuts of `order` (instead of the graph's own topological order), one for
// each cap on the stages (sequential_assignments).
std::vector<std::vector<int>> chains_along(Problem p, std::vector<graph::NodeId> order, const std::vector<int>& caps) {
  p.order = std::move(order);
  for (std::size_t i = 0; i < p.order.size(); ++i) p.position[p.order[i]] = static_cast<int>(i);
  return sequential_assignments(p, caps);
}

// The plain chains of three orders (the topological order, then the branch orders largest and
// smallest branch first), each followed by its refinement when `refine_too`, for each cap on
// the stages in its place. One table per order serves every cap; a chain that several caps share
// is refined once (refine() reads no cap).
std::vector<std::vector<CandidatePlan>> plain_chains(const Problem& problem, const graph::SPTree& tree,
                                                     const std::vector<int>& caps, bool refine_too) {
  std::vector<std::vector<CandidatePlan>> out(caps.size());
  std::vector<std::pair<std::vector<int>, std::vector<int>>> refined;  // (chain, its refinement)
  for (int order = 0; order < 3; ++order) {
    std::vector<std::vector<int>> chains = order == 0
                                               ? sequential_assignments(problem, caps)
                                               : chains_along(problem, branch_order(problem, tree, order == 2), caps);
    for (std::size_t c = 0; c < caps.size(); ++c) {
      if (chains[c].empty()) continue;
      out[c].push_back({chains[c], kChain, {}, {}});
      if (!refine_too) continue;
      auto known = std::find_if(refined.begin(), refined.end(), [&](const auto& r) { return r.first == chains[c]; });
      if (known == refined.end()) known = refined.insert(refined.end(), {chains[c], refine(problem, chains[c])});
      out[c].push_back({known->second, kChain, {}, {}});
    }
  }
  return out;
}

// With replication: PipeDream's chains (pipedream.h) of `order`, one per device count.
void pipedream_along(Problem p, std::vector<graph::NodeId> order, std::vector<CandidatePlan>& out) {
  p.order = std::move(order);
  for (std::size_t i = 0; i < p.order.size(); ++i) p.position[p.order[i]] = static_cast<int>(i);
  for (ChainPlan& chain : pipedream_plans(p)) {
    std::vector<std::vector<int>> devices = placed_on_first_ranks(p, chain);
    out.push_back({std::move(chain.assignment), kPipeDream, std::move(chain.replicas), std::move(devices)});
  }
}

// With replication, every candidate's leftover devices go to its slowest stages (replica
// allocation is greedy for the layouts no DP chose replicas for, and tops up those that did),
// and plain data parallelism joins the candidates.
// With `every` (Options::every_candidate), each allocation's intermediate states and data
// parallelism at every replica count are candidates too.
void finish_replicas(const Problem& problem, std::vector<CandidatePlan>& candidates, bool every) {
  if (!problem.replicated()) return;
  std::vector<CandidatePlan> states;
  for (CandidatePlan& c : candidates) {
    std::vector<std::vector<int>> trail;
    c.replicas = allocate_replicas(problem, c.assignment, std::move(c.replicas), every ? &trail : nullptr);
    for (std::vector<int>& r : trail) states.push_back({c.assignment, c.partitioner, std::move(r), {}});
  }
  for (CandidatePlan& c : states) candidates.push_back(std::move(c));
  if (every) {
    for (std::vector<int>& counts : data_parallel_counts(problem))
      candidates.push_back(
          {std::vector<int>(problem.num_nodes(), 0), "graphpipe(data-parallel)", std::move(counts), {}});
    return;
  }
  auto [single, counts] = data_parallel_plan(problem);
  candidates.push_back({std::move(single), "graphpipe(data-parallel)", std::move(counts), {}});
}

// The device budgets the searches whose result is not monotone in the budget run at: the powers
// of two up to the budget. The budget itself joins only when it is one of them, so that the
// list for a budget contains the list for every smaller one.
std::vector<int> budget_ladder(int budget) {
  std::vector<int> ladder;
  for (int b = 1; b <= budget; b *= 2) ladder.push_back(b);
  return ladder;
}

// The problem as if only `budget` devices were there (every figure is the same: the figures of
// a plan depend only on the devices it uses).
Problem with_budget(const Problem& p, int budget) {
  Problem at = p;
  at.device_budget = budget;
  at.max_stages = std::min(p.max_stages, budget);
  return at;
}

void add_downset_plans(const Problem& problem, std::vector<CandidatePlan>& candidates) {
  for (std::vector<int>& exact : downset_plans(problem)) candidates.push_back({std::move(exact), kDownset, {}, {}});
}

}  // namespace

std::size_t portfolio_winner(const Problem& problem, const std::vector<CandidatePlan>& candidates) {
  std::size_t best = 0;
  double best_overflow = 0.0, best_step = 0.0, best_bottleneck = 0.0;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    Evaluation ev = evaluate(problem, candidates[i].assignment, candidates[i].replicas, candidates[i].devices);
    double overflow = std::max(ev.max_overflow, 0.0);
    double step = ev.iteration_seconds(problem);
    if (i == 0 || overflow < best_overflow ||
        (overflow == best_overflow && predicted_faster(step, ev.bottleneck, best_step, best_bottleneck))) {
      best = i;
      best_overflow = overflow;
      best_step = step;
      best_bottleneck = ev.bottleneck;
    }
  }
  return best;
}

void GraphpipePortfolio::prepare(const PartitionRequest& request) {
  sp_ = graph::decompose_series_parallel(request.graph);
  if (!sp_->is_series_parallel) {
    log::info("graphpipe: the graph is not series-parallel (" + sp_->report +
              "); falling back to the better of metis and a refined topological-order DP");
  }
}

std::vector<int> GraphpipePortfolio::metis_start(const PartitionRequest& request, const Problem& problem) {
  // Made at the middle candidate size whichever size asks first, so that the plan does not
  // depend on the order in which the sizes are planned.
  const std::lock_guard<std::mutex> lock(metis_mutex_);
  auto [it, fresh] = metis_by_budget_.try_emplace(problem.device_budget);
  if (fresh) {
    const auto& sizes = request.micro_batch_sizes;
    Problem middle = request.problem(sizes[sizes.size() / 2]);
    if (problem.replicated()) middle = with_budget(middle, problem.device_budget);
    it->second =
        metis_assignment(middle, problem.replicated() ? middle.max_stages : request.max_stages, request.options.seed);
  }
  return it->second;
}

std::vector<CandidatePlan> GraphpipePortfolio::fallback_layouts(const PartitionRequest& request,
                                                                const Problem& problem) {
  // Both refined starts are candidates: which one wins is the predicted step's (and then the
  // simulator's) call, not the slowest stage's, since METIS's start keeps branches apart (a
  // shallower stage graph) where the chain's balances the stages.
  std::vector<std::vector<int>> starts{metis_start(request, problem)};
  std::vector<int> chain = sequential_assignment(problem);
  if (!chain.empty()) starts.push_back(std::move(chain));
  std::vector<CandidatePlan> candidates;
  for (const std::vector<int>& start : starts) {
    std::vector<int> refined = request.options.refine ? refine(problem, start) : start;
    const bool seen = std::any_of(candidates.begin(), candidates.end(),
                                  [&](const CandidatePlan& c) { return c.assignment == refined; });
    if (!seen) candidates.push_back({std::move(refined), kFallback, {}, {}});
  }
  add_downset_plans(problem, candidates);
  return candidates;
}

GraphpipePortfolio::Chains GraphpipePortfolio::chains_beside(const PartitionRequest& request, const Problem& problem,
                                                             std::vector<int> caps) const {
  // A graph without a tree has no branch orders, and its layouts never ask (fallback_layouts).
  const auto policy = sp_->is_series_parallel ? std::launch::async : std::launch::deferred;
  return std::async(policy,
                    [this, &problem, caps = std::move(caps), refine_too = request.options.refine] {
                      return plain_chains(problem, sp_->tree, caps, refine_too);
                    })
      .share();
}

std::vector<CandidatePlan> GraphpipePortfolio::layouts(const PartitionRequest& request, const Problem& problem,
                                                       const Chains& chains, std::size_t cap,
                                                       std::vector<ReplicatedAssignment> dp) {
  if (!sp_->is_series_parallel) return fallback_layouts(request, problem);
  const std::vector<CandidatePlan>& plain = chains.get()[cap];
  if (dp.empty()) return fallback_layouts(request, problem);
  std::vector<CandidatePlan> candidates;
  candidates.reserve(dp.size() + plain.size() + 1);
  for (ReplicatedAssignment& plan : dp)
    candidates.push_back({std::move(plan.assignment), kDp, std::move(plan.replicas), {}});
  if (request.options.refine) candidates.push_back({refine(problem, candidates.front().assignment), kDp, {}, {}});
  for (const CandidatePlan& chain : plain) candidates.push_back(chain);
  add_downset_plans(problem, candidates);
  return candidates;
}

std::vector<CandidatePlan> GraphpipePortfolio::candidates(const PartitionRequest& request, const Problem& problem) {
  if (!problem.replicated()) {
    // The plain chains are cut on another thread while the tree DP runs, the longer of the two
    // (about 0.07 s against 0.21 s per micro-batch size on a 10,000-operator graph). Both only
    // read the problem and the tree, and the candidates keep their fixed order, so the plan is the
    // same as cut one after the other.
    const Chains chains = chains_beside(request, problem, {problem.max_stages});
    std::vector<ReplicatedAssignment> dp;
    if (sp_->is_series_parallel) dp = graphpipe_plans(problem, sp_->tree, request.options.tolerance);
    return layouts(request, problem, chains, 0, std::move(dp));
  }
  // Never worse with more devices: the searches above are run at every budget of the ladder
  // (largest first), their layouts topped up with replicas within the whole budget by the
  // allocation that only gains moves as the budget grows (replica_allocation.h), and PipeDream's
  // chains and plain data parallelism, whose lists only grow with the budget, join them. Every
  // candidate for fewer devices is then matched by one at least as fast here.
  std::vector<CandidatePlan> all;
  const std::vector<int> ladder = budget_ladder(problem.device_budget);
  // The budgets' searches only read the request, the problem and the tree (the METIS starts are
  // made under a lock): each runs on its own thread, and their candidates are merged in the
  // ladder's order, so the list is the same as searched one after the other.
  // The plain chains of every budget, from one table per order (plain_chains), are cut while
  // the searches run, and each budget's search takes its own when it is done (through its own
  // copy of the shared future, as threads must).
  std::vector<Problem> rungs;  // largest budget first
  std::vector<int> caps;
  for (auto b = ladder.rbegin(); b != ladder.rend(); ++b) {
    rungs.push_back(with_budget(problem, *b));
    caps.push_back(rungs.back().max_stages);
  }
  const Chains chains = chains_beside(request, problem, caps);
  // The tree DP of every budget, one after the other on one solver: a fragment's least depth on
  // n devices is the same whatever the budget, so each budget's probes are bounded by the depths
  // the searches before it kept (graphpipe_dp.h, graphpipe_ladder_plans): the same plans as a
  // search per budget. Largest first: a smaller budget's probes then find depths at lower
  // targets, which bound them from above, as well as at higher ones.
  std::vector<std::vector<ReplicatedAssignment>> dp(rungs.size());
  if (sp_->is_series_parallel) {
    std::vector<int> budgets;
    for (auto b = ladder.rbegin(); b != ladder.rend(); ++b) budgets.push_back(*b);
    dp = graphpipe_ladder_plans(rungs.front(), sp_->tree, request.options.tolerance, budgets);
  }
  std::vector<std::future<std::vector<CandidatePlan>>> runs;
  for (std::size_t i = 0; i < rungs.size(); ++i) {
    runs.push_back(std::async(std::launch::async, [this, &request, chains, i, &at = rungs[i], &dp] {
      return layouts(request, at, chains, i, std::move(dp[i]));
    }));
  }
  for (auto& run : runs) {
    for (CandidatePlan& c : run.get()) {
      const bool seen = std::any_of(all.begin(), all.end(), [&](const CandidatePlan& o) {
        return o.assignment == c.assignment && o.replicas == c.replicas;
      });
      if (!seen) all.push_back(std::move(c));
    }
  }
  finish_replicas(problem, all, request.options.every_candidate);
  pipedream_along(problem, problem.order, all);
  if (sp_->is_series_parallel) {
    for (int order = 1; order < 3; ++order) pipedream_along(problem, branch_order(problem, sp_->tree, order == 2), all);
  }
  return all;
}

CandidatePlan GraphpipePortfolio::plan(const PartitionRequest& request, const Problem& problem) {
  std::vector<CandidatePlan> all = candidates(request, problem);
  return std::move(all[portfolio_winner(problem, all)]);
}

}  // namespace graphpipe::partition
