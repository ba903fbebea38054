#include "partition/metis/refine.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

#include "common/error.h"

namespace graphpipe::partition {

namespace {

// Up to this many (operator, stage) pairs a round considers every stage as a destination;
// beyond it only stages the operator has an edge to (bounded cost on large graphs).
constexpr std::size_t kAllTargetsBudget = 4096;

class Refiner {
 public:
  Refiner(const Problem& p, std::vector<int> labels) : p_(p), g_(*p.graph), label_(std::move(labels)) {
    k_ = 0;
    for (int l : label_) k_ = std::max(k_, l + 1);
    words_ = (k_ + 63) / 64;
    compute_.assign(k_, 0.0);
    transfer_.assign(k_, 0.0);
    static_.assign(k_, 0.0);
    act_.assign(k_, 0.0);
    members_.assign(k_, {});
    slot_.assign(label_.size(), 0);
    count_.assign(static_cast<std::size_t>(k_) * k_, 0);
    for (std::size_t v = 0; v < label_.size(); ++v) {
      int s = label_[v];
      compute_[s] += p.compute[v];
      static_[s] += p.static_bytes[v];
      act_[s] += p.act_bytes[v];
      slot_[v] = static_cast<int>(members_[s].size());
      members_[s].push_back(static_cast<int>(v));
    }
    for (std::size_t e = 0; e < g_.num_edges(); ++e) {
      const graph::Edge& edge = g_.edge(static_cast<graph::EdgeId>(e));
      int a = label_[edge.src], b = label_[edge.dst];
      if (a == b) continue;
      transfer_[a] += p.edge_seconds[e];
      transfer_[b] += p.edge_seconds[e];
      act_[b] += p.edge_bytes[e];
      ++count_[a * k_ + b];
    }
    adjacent_.assign(static_cast<std::size_t>(k_) * words_, 0);
    for (int a = 0; a < k_; ++a)
      for (int b = 0; b < k_; ++b)
        if (count_[a * k_ + b]) flip(a * k_ + b);
    dt_.assign(k_, 0.0);
    da_.assign(k_, 0.0);
    touched_flag_.assign(k_, 0);
    update_structure();
  }

  std::vector<int> run() {
    const int max_moves = 2 * static_cast<int>(label_.size()) + 64;
    for (int moves = 0; moves < max_moves; ++moves) {
      if (!step()) break;
    }
    return label_;
  }

 private:
  struct Move {
    int v, to;
    double score;
  };

  double time(int s) const { return compute_[s] + transfer_[s]; }
  double memory(int s) { return static_[s] + act_[s] * in_flight(s); }
  int in_flight(int s) {
    current();
    return in_flight_[s];
  }

  // Stage pair a * k_ + b gained its first operator edge or lost its last: toggle its bit.
  void flip(int pair) {
    const int a = pair / k_, b = pair % k_;
    adjacent_[static_cast<std::size_t>(a) * words_ + b / 64] ^= std::uint64_t{1} << (b % 64);
    flipped_.push_back(pair);
  }

  // The order, reachability and in-flight counts are derived from the stage graph when read
  // (reaches(), in_flight()), not at every move: most moves tried are undone unread, and a move
  // and its undo flip the same pairs back, which leaves the graph as it was derived. So they are
  // derived again only when some pair has flipped an odd number of times since (pair_step tries
  // thousands of move pairs per round; deriving after each move and undo was 9/10 of its time).
  void current() {
    if (flipped_.empty()) return;
    std::sort(flipped_.begin(), flipped_.end());
    bool changed = false;
    for (std::size_t i = 0; i < flipped_.size() && !changed;) {
      std::size_t j = i;
      while (j < flipped_.size() && flipped_[j] == flipped_[i]) ++j;
      changed = (j - i) % 2 == 1;
      i = j;
    }
    flipped_.clear();
    if (changed) update_structure();
  }

  // Calls f(b) for every stage b that stage a has an edge to, ascending.
  template <class F>
  void for_each_successor(int a, F f) const {
    const std::uint64_t* row = &adjacent_[static_cast<std::size_t>(a) * words_];
    for (int w = 0; w < words_; ++w) {
      for (std::uint64_t left = row[w]; left != 0; left &= left - 1) f(w * 64 + std::countr_zero(left));
    }
  }

  // Topological order of stages, reachability and in-flight counts after a change. O(k + stage
  // edges x words) from the adjacency bit rows (every loop visits the pairs in the order a scan
  // of the count matrix would).
  void update_structure() {
    std::vector<int> indegree(k_, 0);
    for (int a = 0; a < k_; ++a) for_each_successor(a, [&](int b) { ++indegree[b]; });
    std::vector<int> order;
    order.reserve(k_);
    for (int s = 0; s < k_; ++s)
      if (!indegree[s]) order.push_back(s);
    for (std::size_t i = 0; i < order.size(); ++i) {
      for_each_successor(order[i], [&](int b) {
        if (--indegree[b] == 0) order.push_back(b);
      });
    }
    if (static_cast<int>(order.size()) != k_) {
      throw PlanningError("internal error: refinement reached a cyclic stage graph");
    }
    reach_.assign(static_cast<std::size_t>(k_) * words_, 0);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      int a = *it;
      std::uint64_t* row = &reach_[static_cast<std::size_t>(a) * words_];
      for_each_successor(a, [&](int b) {
        row[b / 64] |= std::uint64_t{1} << (b % 64);
        const std::uint64_t* other = &reach_[static_cast<std::size_t>(b) * words_];
        for (int w = 0; w < words_; ++w) row[w] |= other[w];
      });
    }
    std::vector<int> position(k_);
    for (int i = 0; i < k_; ++i) position[order[i]] = i;
    cost::StageEdges edges;
    for (int a = 0; a < k_; ++a) for_each_successor(a, [&](int b) { edges.push_back({position[a], position[b]}); });
    std::vector<int> by_position = p_.in_flight(k_, edges, p_.num_micro_batches);
    in_flight_.assign(k_, 1);
    for (int s = 0; s < k_; ++s) in_flight_[s] = by_position[position[s]];
    flipped_.clear();
  }

  bool reaches(int a, int b) {
    current();
    return (reach_[static_cast<std::size_t>(a) * words_ + b / 64] >> (b % 64)) & 1u;
  }

  bool valid(int v, int from, int to) {
    if (members_[from].size() < 2) return false;
    bool pred_in_from = false, succ_in_from = false;
    for (graph::EdgeId e : g_.in_edges(v)) {
      int r = label_[g_.edge(e).src];
      if (r == from) pred_in_from = true;
      if (r != to && reaches(to, r)) return false;
    }
    for (graph::EdgeId e : g_.out_edges(v)) {
      int t = label_[g_.edge(e).dst];
      if (t == from) succ_in_from = true;
      if (t != to && reaches(t, to)) return false;
    }
    return !(pred_in_from && succ_in_from);
  }

  void touch(int s) {
    if (!touched_flag_[s]) {
      touched_flag_[s] = 1;
      touched_.push_back(s);
    }
  }

  // Fills dt_/da_ (and touched_) with the changes of moving v from `from` to `to`.
  void deltas(int v, int from, int to) {
    for (int s : touched_) {
      dt_[s] = da_[s] = 0.0;
      touched_flag_[s] = 0;
    }
    touched_.clear();
    touch(from);
    touch(to);
    dt_[from] -= p_.compute[v];
    dt_[to] += p_.compute[v];
    da_[from] -= p_.act_bytes[v];
    da_[to] += p_.act_bytes[v];
    for (graph::EdgeId e : g_.in_edges(v)) {
      int x = label_[g_.edge(e).src];
      double t = p_.edge_seconds[e], b = p_.edge_bytes[e];
      touch(x);
      if (x != from) dt_[x] -= t, dt_[from] -= t, da_[from] -= b;
      if (x != to) dt_[x] += t, dt_[to] += t, da_[to] += b;
    }
    for (graph::EdgeId e : g_.out_edges(v)) {
      int y = label_[g_.edge(e).dst];
      double t = p_.edge_seconds[e], b = p_.edge_bytes[e];
      touch(y);
      if (y != from) dt_[from] -= t, dt_[y] -= t, da_[y] -= b;
      if (y != to) dt_[to] += t, dt_[y] += t, da_[y] += b;
    }
  }

  double new_static(int s, int v, int from, int to) const {
    return static_[s] + (s == from ? -p_.static_bytes[v] : 0.0) + (s == to ? p_.static_bytes[v] : 0.0);
  }

  void apply(int v, int from, int to) {
    // The stage graph (and so the order, reachability and in-flight counts that
    // update_structure derives from it alone) changes only when a stage pair gains its first
    // operator edge or loses its last (flip(); current() derives them again when read).
    auto less = [&](int pair) {
      if (--count_[pair] == 0) flip(pair);
    };
    auto more = [&](int pair) {
      if (count_[pair]++ == 0) flip(pair);
    };
    for (graph::EdgeId e : g_.in_edges(v)) {
      int x = label_[g_.edge(e).src];
      double t = p_.edge_seconds[e], b = p_.edge_bytes[e];
      if (x != from) transfer_[x] -= t, transfer_[from] -= t, act_[from] -= b, less(x * k_ + from);
      if (x != to) transfer_[x] += t, transfer_[to] += t, act_[to] += b, more(x * k_ + to);
    }
    for (graph::EdgeId e : g_.out_edges(v)) {
      int y = label_[g_.edge(e).dst];
      double t = p_.edge_seconds[e], b = p_.edge_bytes[e];
      if (y != from) transfer_[from] -= t, transfer_[y] -= t, act_[y] -= b, less(from * k_ + y);
      if (y != to) transfer_[to] += t, transfer_[y] += t, act_[y] += b, more(to * k_ + y);
    }
    compute_[from] -= p_.compute[v];
    compute_[to] += p_.compute[v];
    static_[from] -= p_.static_bytes[v];
    static_[to] += p_.static_bytes[v];
    act_[from] -= p_.act_bytes[v];
    act_[to] += p_.act_bytes[v];
    // membership lists: swap-remove from `from`, append to `to`
    auto& list = members_[from];
    int last = list.back();
    list[slot_[v]] = last;
    slot_[last] = slot_[v];
    list.pop_back();
    slot_[v] = static_cast<int>(members_[to].size());
    members_[to].push_back(v);
    label_[v] = to;
  }

  bool step() {
    int worst_memory = -1;
    for (int s = 0; s < k_; ++s) {
      if (memory(s) > p_.memory_limit &&
          (worst_memory < 0 || memory(s) - p_.memory_limit > memory(worst_memory) - p_.memory_limit)) {
        worst_memory = s;
      }
    }
    const bool memory_mode = worst_memory >= 0;
    int target = worst_memory;
    double bottleneck = 0.0;
    for (int s = 0; s < k_; ++s) bottleneck = std::max(bottleneck, time(s));
    if (!memory_mode) {
      for (int s = 0; s < k_; ++s)
        if (target < 0 && time(s) == bottleneck) target = s;
    }
    if (target < 0) return false;
    std::vector<Move> moves;
    std::vector<int> members = members_[target];
    std::sort(members.begin(), members.end());  // determinism independent of list history
    const bool all_targets = members.size() * static_cast<std::size_t>(k_) <= kAllTargetsBudget;
    for (int v : members) {
      std::vector<int> neighbours;
      for (graph::EdgeId e : g_.in_edges(v)) neighbours.push_back(label_[g_.edge(e).src]);
      for (graph::EdgeId e : g_.out_edges(v)) neighbours.push_back(label_[g_.edge(e).dst]);
      if (all_targets) {
        // Few candidates: any stage may receive v (an independent operator can balance a stage
        // it has no edge to, at the price of new transfers, which the score includes).
        neighbours.resize(k_);
        for (int s = 0; s < k_; ++s) neighbours[s] = s;
      }
      std::sort(neighbours.begin(), neighbours.end());
      neighbours.erase(std::unique(neighbours.begin(), neighbours.end()), neighbours.end());
      for (int to : neighbours) {
        if (to == target || !valid(v, target, to)) continue;
        deltas(v, target, to);
        bool ok = true;
        double worst_time = 0.0;
        for (int s : touched_) {
          double t = time(s) + dt_[s];
          double m = new_static(s, v, target, to) + (act_[s] + da_[s]) * in_flight(s);
          worst_time = std::max(worst_time, t);
          if (s != target && m > p_.memory_limit && m > memory(s)) ok = false;
        }
        if (!ok) continue;
        double score;
        if (memory_mode) {
          double m = new_static(target, v, target, to) + (act_[target] + da_[target]) * in_flight(target);
          if (!(m < memory(target))) continue;
          score = m;
        } else {
          if (!(worst_time < bottleneck * (1.0 - 1e-12))) continue;
          score = worst_time;
        }
        moves.push_back({v, to, score});
      }
    }
    std::stable_sort(moves.begin(), moves.end(), [](const Move& a, const Move& b) { return a.score < b.score; });
    std::vector<double> before(k_);
    for (int s = 0; s < k_; ++s) before[s] = memory(s);
    for (const Move& m : moves) {
      apply(m.v, target, m.to);
      // The stage graph changed, so in-flight counts may have: keep the move only if no stage
      // overflows more than before it (and, in memory mode, the target's memory shrank).
      bool fits = !memory_mode || memory(target) < before[target];
      for (int s = 0; s < k_ && fits; ++s) {
        if (s != target && memory(s) > p_.memory_limit && memory(s) > before[s]) fits = false;
        if (!memory_mode && memory(s) > p_.memory_limit) fits = false;
      }
      if (fits) return true;
      apply(m.v, m.to, target);  // undo
    }
    if (!memory_mode && members.size() * static_cast<std::size_t>(k_) <= kAllTargetsBudget) {
      return pair_step(target, members, bottleneck);
    }
    return false;
  }

  // No single move helps: try a move of v out of the bottleneck stage that may overload its
  // destination Q, followed by the best move of one operator out of Q (anywhere, the bottleneck
  // stage included: a swap). Kept only if afterwards every stage is faster than the old
  // bottleneck or no slower with fewer stages at it, and everything fits. Small rounds only.
  bool pair_step(int target, const std::vector<int>& members, double bottleneck) {
    int at_bottleneck = 0;
    for (int s = 0; s < k_; ++s) at_bottleneck += time(s) >= bottleneck;
    for (int v : members) {
      for (int q = 0; q < k_; ++q) {
        if (q == target || !valid(v, target, q)) continue;
        apply(v, target, q);
        std::vector<int> second = members_[q];
        std::sort(second.begin(), second.end());
        for (int u : second) {
          if (u == v) continue;
          for (int r = 0; r < k_; ++r) {
            if (r == q || !valid(u, q, r)) continue;
            apply(u, q, r);
            double worst = 0.0;
            int at_worst = 0;
            for (int s = 0; s < k_; ++s) worst = std::max(worst, time(s));
            for (int s = 0; s < k_; ++s) at_worst += time(s) >= worst;
            const bool better = worst < bottleneck * (1.0 - 1e-12) ||
                                (worst <= bottleneck && at_worst < at_bottleneck && time(target) < bottleneck);
            // Memory (in-flight counts from the changed stage graph) only for a pair that is faster.
            bool fits = better;
            for (int s = 0; s < k_ && fits; ++s) fits = memory(s) <= p_.memory_limit;
            if (fits) return true;
            apply(u, r, q);
          }
        }
        apply(v, q, target);
      }
    }
    return false;
  }

  const Problem& p_;
  const graph::OpGraph& g_;
  std::vector<int> label_;
  int k_ = 0;
  int words_ = 1;
  std::vector<double> compute_, transfer_, static_, act_;
  std::vector<std::vector<int>> members_;
  std::vector<int> slot_;
  std::vector<int> count_;
  std::vector<std::uint64_t> reach_;
  std::vector<std::uint64_t> adjacent_;  // bit b of row a: count_[a * k_ + b] > 0
  std::vector<int> in_flight_;
  std::vector<int> flipped_;  // stage pairs flipped since update_structure (current())
  std::vector<double> dt_, da_;
  std::vector<char> touched_flag_;
  std::vector<int> touched_;
};

}  // namespace

std::vector<int> refine(const Problem& problem, std::vector<int> assignment) {
  if (assignment.empty()) return assignment;
  return Refiner(problem, std::move(assignment)).run();
}

}  // namespace graphpipe::partition
