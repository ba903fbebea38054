// The series-parallel DP's rebuild (dp_solver.h): the plan of the target last solved, following
// each fragment's first move (dp_steps.h) through the memo; a fragment whose bounds pinned its
// depth has no move there, and is searched for it (with_move). Stage labels are handed out in the
// order the stages are met; rebuilt_replicas_ records each label's replica count.
#include <variant>

#include "partition/series_parallel_dp/dp_solver.h"

namespace graphpipe::partition::series_parallel_dp {

namespace {

// Where the join stage of a Join, Cross or Close step ends.
JoinAt join_at(const Step& step) {
  if (const auto* join = std::get_if<Join>(&step)) return join->at;
  if (const auto* cross = std::get_if<Cross>(&step)) return cross->at;
  return std::get<Close>(step).at;
}

}  // namespace

std::vector<int> Solver::rebuild() {
  std::vector<int> assignment(p_.num_nodes(), -1);
  rebuilt_replicas_.clear();
  int next_label = 0;
  rebuild_solve(tree_.root, root_devices_, 0, assignment, next_label);
  return assignment;
}

// A new stage label, recording its replica count.
int Solver::take(int& next, int replicas) {
  rebuilt_replicas_.push_back(replicas);
  return next++;
}

void Solver::label(int t, int stage, std::vector<int>& assignment) const {
  for (graph::NodeId v : leaves_[t]) assignment[v] = stage;
}

void Solver::rebuild_solve(int t, int n, int d, std::vector<int>& assignment, int& next) {
  d = cap(d);
  const Entry e = with_move([&] { return solve(t, n, d); });
  if (const auto* whole = std::get_if<WholeStage>(&e.step)) {
    label(t, take(next, whole->replicas), assignment);
  } else if (tree_.nodes[t].kind == graph::SPNode::Kind::series) {
    rebuild_series(t, 0, n, d, assignment, next);
  } else {
    rebuild_parallel(t, 0, n, d, assignment, next);
  }
}

void Solver::rebuild_series(int t, int i, int n, int d, std::vector<int>& assignment, int& next) {
  const auto& children = tree_.nodes[t].children;
  if (i == static_cast<int>(children.size())) return;
  const Entry e = with_move([&] { return series(t, i, n, d); });
  if (const auto* group = std::get_if<Group>(&e.step)) {
    const int stage = take(next, group->replicas);
    for (int c = i; c <= group->last; ++c) label(children[c], stage, assignment);
    rebuild_series(t, group->last + 1, n - group->replicas, d, assignment, next);
  } else if (const auto* split = std::get_if<Split>(&e.step)) {
    const int rest = series(t, i + 1, n - split->devices, d).depth;
    rebuild_solve(children[i], split->devices, d + rest, assignment, next);
    rebuild_series(t, i + 1, n - split->devices, d, assignment, next);
  } else {
    const Fork& fork = std::get<Fork>(e.step);
    const int branch = sorted_[children[fork.child]][fork.lead];
    const int stage = take(next, fork.replicas);
    for (int c = i; c < fork.child; ++c) label(children[c], stage, assignment);
    for (int c = 0; c < fork.head; ++c) label(items_[branch][c], stage, assignment);
    rebuild_inside(branch, fork.head, n - fork.replicas, d, assignment, next);
  }
}

void Solver::rebuild_inside(int branch, int k, int n, int d, std::vector<int>& assignment, int& next) {
  const Entry e = with_move([&] { return inside(branch, k, n, d); });
  const int par = parent_[branch];
  const int t = parent_[par];
  const int q = slot_[par];
  const int m = static_cast<int>(tree_.nodes[t].children.size());
  if (const auto* open = std::get_if<Open>(&e.step)) {
    const int dj = q + 1 == m ? 0 : series(t, q + 1, open->join_devices, d).depth;
    if (open->branch_devices > 0) rebuild_series(branch, k, open->branch_devices, cap(d + dj), assignment, next);
    rebuild_others(branch, n - open->join_devices - open->branch_devices, cap(d + dj), assignment, next);
    if (q + 1 < m) rebuild_series(t, q + 1, open->join_devices, d, assignment, next);
    return;
  }
  // Join, cross and close: the join stage holds children q+1..last_child, the series after it
  // runs on after_devices.
  const auto [last_child, after_devices] = join_at(e.step);
  const int rest = last_child + 1 == m ? 0 : series(t, last_child + 1, after_devices, d).depth;
  const int d2 = cap(d + rest);
  if (const auto* close = std::get_if<Close>(&e.step)) {
    const auto& children = tree_.nodes[t].children;
    const int stage = take(next, close->replicas);
    for (std::size_t c = static_cast<std::size_t>(k); c < items_[branch].size(); ++c) {
      label(items_[branch][c], stage, assignment);
    }
    label(other_lead(branch), stage, assignment);
    for (int c = q + 1; c <= last_child; ++c) label(children[c], stage, assignment);
    rebuild_parallel(par, 2, n - after_devices - close->replicas, cap(d2 + 1), assignment, next);
  } else if (const auto* join = std::get_if<Join>(&e.step)) {
    rebuild_to_join(branch, k, join->tail_devices, d2, last_child, assignment, next);
    rebuild_others(branch, n - after_devices - join->tail_devices, cap(d2 + 1), assignment, next);
  } else {
    const Cross& cross = std::get<Cross>(e.step);
    if (cross.fork_devices > 0) rebuild_series(branch, k, cross.fork_devices, cap(d2 + 1), assignment, next);
    rebuild_to_join(other_lead(branch), 0, cross.tail_devices, d2, last_child, assignment, next);
    rebuild_parallel(par, 2, n - after_devices - cross.tail_devices - cross.fork_devices, cap(d2 + 1), assignment,
                     next);
  }
  if (last_child + 1 < m) rebuild_series(t, last_child + 1, after_devices, d, assignment, next);
}

void Solver::rebuild_others(int branch, int n, int d, std::vector<int>& assignment, int& next) {
  const int par = parent_[branch];
  if (sorted_[par][0] == branch) {
    rebuild_parallel(par, 1, n, d, assignment, next);
    return;
  }
  int keyed_d = d;  // the rebuild below goes on with d as given
  const std::uint64_t k = fragment(kOthers, par, par, 0, n, keyed_d);
  const int n1 = std::get<OthersSplit>(with_move([&] {
                                         others(branch, n, d);  // memoised: the split it chose
                                         return *memo_.find(k);
                                       }).step)
                     .largest_devices;
  rebuild_solve(sorted_[par][0], n1, d, assignment, next);
  rebuild_parallel(par, 2, n - n1, d, assignment, next);
}

void Solver::rebuild_to_join(int branch, int i, int n, int d, int e, std::vector<int>& assignment, int& next) {
  const Entry r = with_move([&] { return branch_to_join(branch, i, n, d, e); });
  const auto& items = items_[branch];
  if (const auto* join = std::get_if<JoinStage>(&r.step)) {
    const int par = parent_[branch];
    const auto& children = tree_.nodes[parent_[par]].children;
    const int stage = take(next, join->replicas);
    for (std::size_t c = static_cast<std::size_t>(i); c < items.size(); ++c) label(items[c], stage, assignment);
    for (int c = slot_[par] + 1; c <= e; ++c) label(children[c], stage, assignment);
  } else if (const auto* group = std::get_if<Group>(&r.step)) {
    const int stage = take(next, group->replicas);
    for (int c = i; c <= group->last; ++c) label(items[c], stage, assignment);
    rebuild_to_join(branch, group->last + 1, n - group->replicas, d, e, assignment, next);
  } else {
    const int devices = std::get<Split>(r.step).devices;
    const int rest = branch_to_join(branch, i + 1, n - devices, d, e).depth;
    rebuild_solve(items[i], devices, d + rest, assignment, next);
    rebuild_to_join(branch, i + 1, n - devices, d, e, assignment, next);
  }
}

void Solver::rebuild_parallel(int t, int j, int n, int d, std::vector<int>& assignment, int& next) {
  const auto& branches = sorted_[t];
  if (j == static_cast<int>(branches.size())) return;
  const Entry e = with_move([&] { return parallel(t, j, n, d); });
  if (const auto* run = std::get_if<Run>(&e.step)) {
    const int stage = take(next, run->replicas);
    for (int q = j; q <= run->last; ++q) label(branches[q], stage, assignment);
    rebuild_parallel(t, run->last + 1, n - run->replicas, d, assignment, next);
  } else {
    const int devices = std::get<Split>(e.step).devices;
    rebuild_solve(branches[j], devices, d, assignment, next);
    rebuild_parallel(t, j + 1, n - devices, d, assignment, next);
  }
}

}  // namespace graphpipe::partition::series_parallel_dp
