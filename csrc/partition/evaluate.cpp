#include "partition/evaluate.h"

#include <algorithm>
#include <limits>
#include <map>
#include <queue>

#include "common/error.h"
#include "cost/gradient_buckets.h"
#include "cost/reshard.h"
#include "partition/backward_halves.h"
#include "partition/placement.h"
#include "partition/recompute.h"
#include "plan/rank_sharing.h"

namespace graphpipe::partition {

double Evaluation::iteration_seconds(const Problem& problem) const {
  const double fixed = problem.model->devices().step_overhead_seconds + rank_skew_seconds(problem);
  if (problem.zero_bubble) {
    return static_cast<double>(problem.num_micro_batches) * split_bottleneck +
           static_cast<double>(depth - 1) * split_fill + optimizer_tail + fixed;
  }
  return pipeline_step(problem.num_micro_batches, depth, bottleneck) + optimizer_tail + fixed;
}

double Evaluation::rank_skew_seconds(const Problem& problem) const {
  const cost::Devices& devices = problem.model->devices();
  if (devices.rank_skew_fraction <= 0.0) return 0.0;
  // Per rank: the forwards and backwards of the stages it holds, with their dispatch, as the
  // simulator's tasks last (a split backward's I + W, up to 1.1 x B, is read as B here).
  std::map<int, double> compute;
  for (const StageFigures& st : stages) {
    const double per_micro_batch = st.forward + st.backward + st.dispatch;
    for (int d : st.devices) compute[d] += static_cast<double>(problem.num_micro_batches) * per_micro_batch;
  }
  double busiest = 0.0;
  for (const auto& [rank, seconds] : compute) busiest = std::max(busiest, seconds);
  return devices.rank_skew_seconds(busiest, static_cast<int>(compute.size()));
}

bool predicted_faster(double step, double bottleneck, double best_step, double best_bottleneck) {
  return step < best_step * (1.0 - 1e-12) || (step <= best_step * (1.0 + 1e-12) && bottleneck < best_bottleneck);
}

namespace {

// Finds one cycle of the label graph (adjacency lists), for the message of a cyclic result.
std::vector<int> find_label_cycle(const std::vector<std::vector<int>>& out) {
  const int k = static_cast<int>(out.size());
  std::vector<int> state(k, 0), parent(k, -1);
  for (int start = 0; start < k; ++start) {
    if (state[start]) continue;
    std::vector<std::pair<int, std::size_t>> stack{{start, 0}};
    state[start] = 1;
    while (!stack.empty()) {
      auto& [v, i] = stack.back();
      if (i < out[v].size()) {
        int w = out[v][i++];
        if (state[w] == 1) {
          std::vector<int> cycle{w};
          for (int x = v; x != w; x = parent[x]) cycle.push_back(x);
          std::reverse(cycle.begin() + 1, cycle.end());
          return cycle;
        }
        if (state[w] == 0) {
          state[w] = 1;
          parent[w] = v;
          stack.push_back({w, 0});
        }
      } else {
        state[v] = 2;
        stack.pop_back();
      }
    }
  }
  return {};
}

// One evaluation, step by step: the labels checked and renumbered topologically, the replica
// counts, each stage's sums, the split backward, the stage edges, the ranks and their
// all-reduce, the transfers at those ranks, the depth, memory and recomputation, the optimizer
// tail and the bottlenecks.
class Evaluator {
 public:
  Evaluator(const Problem& p, const std::vector<int>& assignment, const std::vector<int>& replicas,
            const std::vector<std::vector<int>>& devices)
      : p_(p),
        g_(*p.graph),
        n_(static_cast<int>(g_.num_nodes())),
        assignment_(assignment),
        replicas_(replicas),
        devices_(devices) {}

  Evaluation run() {
    check_labels();
    label_graph();
    if (!renumber()) return ev_;
    replica_counts();
    stage_sums();
    split_backward();
    stage_edges();
    place();
    transfers();
    depth();
    memory();
    optimizer_tail();
    bottlenecks();
    return ev_;
  }

 private:
  // Every operator has a label, every label below the largest an operator.
  void check_labels() {
    if (static_cast<int>(assignment_.size()) != n_) {
      throw PlanningError("assignment has " + std::to_string(assignment_.size()) + " entries for " +
                          std::to_string(n_) + " operators");
    }
    for (int v = 0; v < n_; ++v) {
      if (assignment_[v] < 0) {
        throw PlanningError("operator " + graph::describe(g_, v) + " has no stage (label " +
                            std::to_string(assignment_[v]) + ")");
      }
      k_ = std::max(k_, assignment_[v] + 1);
    }
    first_.assign(k_, std::numeric_limits<int>::max());
    for (int v = 0; v < n_; ++v) first_[assignment_[v]] = std::min(first_[assignment_[v]], p_.position[v]);
    for (int s = 0; s < k_; ++s) {
      if (first_[s] == std::numeric_limits<int>::max()) {
        throw PlanningError("stage label " + std::to_string(s) + " of " + std::to_string(k_) + " has no operator");
      }
    }
  }

  // Stage graph on input labels.
  void label_graph() {
    out_.assign(k_, {});
    indegree_.assign(k_, 0);
    std::vector<std::pair<int, int>> pairs;
    for (const graph::Edge& e : g_.edges()) {
      int a = assignment_[e.src], b = assignment_[e.dst];
      if (a != b) pairs.push_back({a, b});
    }
    std::sort(pairs.begin(), pairs.end());
    pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
    for (auto [a, b] : pairs) {
      out_[a].push_back(b);
      ++indegree_[b];
    }
  }

  // Kahn's order on labels, ties by first operator position; false (and the cycle) when cyclic.
  bool renumber() {
    using Item = std::pair<int, int>;  // (first position, label)
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> ready;
    for (int s = 0; s < k_; ++s) {
      if (indegree_[s] == 0) ready.push({first_[s], s});
    }
    renumber_.assign(k_, -1);
    int next = 0;
    while (!ready.empty()) {
      int s = ready.top().second;
      ready.pop();
      renumber_[s] = next++;
      for (int t : out_[s]) {
        if (--indegree_[t] == 0) ready.push({first_[t], t});
      }
    }
    ev_.num_stages = k_;
    if (next != k_) {
      ev_.acyclic = false;
      ev_.cycle = find_label_cycle(out_);
      return false;
    }
    ev_.acyclic = true;
    ev_.stage_of.resize(n_);
    for (int v = 0; v < n_; ++v) ev_.stage_of[v] = renumber_[assignment_[v]];
    ev_.stages.assign(k_, StageFigures{});
    return true;
  }

  // Replica counts by renumbered stage, and each stage's replica level and row fraction.
  void replica_counts() {
    const int k = k_;
    if (!replicas_.empty() && static_cast<int>(replicas_.size()) != k) {
      throw PlanningError("replica counts for " + std::to_string(replicas_.size()) + " stages, the assignment has " +
                          std::to_string(k));
    }
    if (!devices_.empty() && static_cast<int>(devices_.size()) != k) {
      throw PlanningError("device lists for " + std::to_string(devices_.size()) + " stages, the assignment has " +
                          std::to_string(k));
    }
    for (int label = 0; label < k; ++label) {
      const int r =
          devices_.empty() ? (replicas_.empty() ? 1 : replicas_[label]) : static_cast<int>(devices_[label].size());
      if (!devices_.empty() && !replicas_.empty() && replicas_[label] != r) {
        throw PlanningError("stage label " + std::to_string(label) + " has " + std::to_string(replicas_[label]) +
                            " replicas but " + std::to_string(r) + " devices");
      }
      if (r < 1)
        throw PlanningError("stage label " + std::to_string(label) + " has " + std::to_string(r) + " replicas");
      if (r > 1 && (!p_.replicas || r > p_.replicas->max_replicas())) {
        throw PlanningError("stage label " + std::to_string(label) + " has " + std::to_string(r) + " replicas, but " +
                            (p_.replicas ? "a micro-batch of " + std::to_string(p_.micro_batch_size) +
                                               " rows gives at most " + std::to_string(p_.replicas->max_replicas())
                                         : std::string("replication is off (Options::replicate)")));
      }
      ev_.stages[renumber_[label]].replicas = r;
      replicated_ = replicated_ || r > 1;
    }
    level_.assign(k, 0);
    fraction_.assign(k, 1.0);  // rows of a replica's shard / rows of a micro-batch
    if (replicated_) {
      for (int s = 0; s < k; ++s) {
        level_[s] = p_.replicas->level_of(ev_.stages[s].replicas);
        fraction_[s] = p_.replicas->row_fraction(level_[s]);
      }
    }
  }

  // Each stage's compute, bytes and optimizer time from its operators' at the stage's rows.
  void stage_sums() {
    sync_.assign(replicated_ ? k_ : 0, cost::SyncLoad{});
    for (int v = 0; v < n_; ++v) {
      const int stage = ev_.stage_of[v];
      StageFigures& s = ev_.stages[stage];
      if (replicated_) sync_[stage] += p_.sync_load[v];
      if (s.replicas == 1) {
        s.forward += p_.forward[v];
        s.backward += p_.backward[v];
      } else {
        s.forward += p_.replicas->forward(level_[stage], v);
        s.backward += p_.replicas->backward(level_[stage], v);
      }
      s.static_bytes += p_.static_bytes[v];
      s.activation_bytes += p_.act_bytes[v] * fraction_[stage];
      s.optimizer += p_.optimizer[v];
    }
  }

  // I and W of each stage's split backward, from its operators' at the stage's rows.
  void split_backward() {
    std::vector<double> level_input, level_weight;
    if (replicated_) {
      level_input.resize(n_);
      level_weight.resize(n_);
      for (int v = 0; v < n_; ++v) {
        const int stage = ev_.stage_of[v];
        const bool one = ev_.stages[stage].replicas == 1;
        level_input[v] = one ? p_.backward_input[v] : p_.replicas->backward_input(level_[stage], v);
        level_weight[v] = one ? p_.backward_weight[v] : p_.replicas->backward_weight(level_[stage], v);
      }
    }
    const auto halves = backward_halves(g_, p_.order, ev_.stage_of, k_, replicated_ ? level_input : p_.backward_input,
                                        replicated_ ? level_weight : p_.backward_weight);
    input_walks_.assign(k_, 0);
    for (int s = 0; s < k_; ++s) {
      ev_.stages[s].backward_input = halves[s].input;
      ev_.stages[s].backward_weight = halves[s].weight;
      input_walks_[s] = halves[s].input_walks;
    }
  }

  // The stage edges (one per operator edge between stages, before deduplication, with its
  // bytes) and the tensors each stage receives and holds.
  void stage_edges() {
    for (std::size_t e = 0; e < g_.num_edges(); ++e) {
      const graph::Edge& edge = g_.edge(static_cast<graph::EdgeId>(e));
      int a = ev_.stage_of[edge.src], b = ev_.stage_of[edge.dst];
      if (a == b || !g_.edge_moves_data(static_cast<graph::EdgeId>(e))) continue;
      ev_.stages[b].activation_bytes += p_.edge_bytes[e] * fraction_[b];
      ev_.stages[b].input_bytes += p_.edge_bytes[e] * fraction_[b];
      if (p_.chain) {
        // A chain relays a skip tensor through every stage in between: each receives and sends it
        // on, and holds it for the micro-batch. The stage graph is the chain itself.
        for (int k = a + 1; k < b; ++k) {
          ev_.stages[k].activation_bytes += p_.edge_bytes[e] * fraction_[k];
          ev_.stages[k].input_bytes += p_.edge_bytes[e] * fraction_[k];
        }
        for (int k = a; k < b; ++k) {
          ev_.stage_edges.push_back({k, k + 1});
          pair_bytes_.push_back(p_.edge_bytes[e]);
        }
      } else {
        ev_.stage_edges.push_back({a, b});
        pair_bytes_.push_back(p_.edge_bytes[e]);
      }
    }
  }

  // Ranks, and the all-reduce of each replicated stage over its own.
  void place() {
    if (!devices_.empty()) {
      for (int label = 0; label < k_; ++label) {
        std::vector<int> ranks = devices_[label];
        std::sort(ranks.begin(), ranks.end());
        ev_.stages[renumber_[label]].devices = std::move(ranks);
      }
    } else if (!replicated_) {
      for (int s = 0; s < k_; ++s) ev_.stages[s].devices = {s};
    } else {
      place_replicas();
    }
    for (int s = 0; s < k_; ++s) {
      StageFigures& f = ev_.stages[s];
      if (f.replicas > 1) f.all_reduce = stage_sync_seconds(p_, f.devices, sync_[s]);
    }
  }

  // Heavier stage edges first claim a shared node (placement.h): sum the bytes per pair.
  void place_replicas() {
    std::vector<std::size_t> index(ev_.stage_edges.size());
    for (std::size_t i = 0; i < index.size(); ++i) index[i] = i;
    std::sort(index.begin(), index.end(),
              [&](std::size_t x, std::size_t y) { return ev_.stage_edges[x] < ev_.stage_edges[y]; });
    std::vector<std::pair<int, int>> pairs;
    std::vector<double> bytes;
    for (std::size_t i : index) {
      if (pairs.empty() || pairs.back() != ev_.stage_edges[i]) {
        pairs.push_back(ev_.stage_edges[i]);
        bytes.push_back(0.0);
      }
      bytes.back() += pair_bytes_[i];
    }
    std::vector<int> counts(k_);
    for (int s = 0; s < k_; ++s) counts[s] = ev_.stages[s].replicas;
    std::vector<std::vector<int>> placed = place_stages(p_.model->devices(), counts, pairs, bytes, p_.placement_ranks);
    for (int s = 0; s < k_; ++s) ev_.stages[s].devices = std::move(placed[s]);
  }

  // Operator edge e's transfer from stage x's ranks to stage y's (see transfers()).
  double hop_seconds(std::size_t e, int x, int y) const {
    const cost::Devices& described = p_.model->devices();
    auto on_devices = [&](const std::vector<int>& ranks) {
      for (int r : ranks) {
        if (r < 0 || r >= described.count) return false;
      }
      return true;
    };
    const auto& from = ev_.stages[x].devices;
    const auto& to = ev_.stages[y].devices;
    // More stages than devices (a plan build_plan refuses): no ranks to price, the slowest link.
    if (!on_devices(from) || !on_devices(to)) return p_.edge_seconds[e];
    // Two stages on one rank (several stages per rank): the tensors stay there.
    if (from.size() == 1 && to.size() == 1 && from[0] == to[0]) return 0.0;
    if (from.size() == 1 && to.size() == 1 && described.link_bandwidth[from[0]][to[0]] <= slow_bandwidth_) {
      return p_.edge_seconds[e];
    }
    return cost::reshard_seconds(described, from, to, p_.micro_batch_size, p_.edge_bytes[e]);
  }

  // Every operator edge between stages by the links between the ranks the two stages got
  // (cost/reshard.h, the simulator's rule: re-sharded pairs of replicas at once, the busiest
  // rank's sum), charged at both ends; along a chain, on every hop of its relay. A link that is
  // the description's slowest keeps the problem's own figure (Problem::edge_seconds).
  void transfers() {
    slow_bandwidth_ = p_.replicas ? p_.replicas->link_bandwidth() : p_.model->devices().slowest_link_bandwidth();
    for (std::size_t e = 0; e < g_.num_edges(); ++e) {
      const graph::Edge& edge = g_.edge(static_cast<graph::EdgeId>(e));
      const int a = ev_.stage_of[edge.src], b = ev_.stage_of[edge.dst];
      if (a == b || !g_.edge_moves_data(static_cast<graph::EdgeId>(e))) continue;
      if (p_.chain) {
        for (int h = a; h < b; ++h) {
          const double seconds = hop_seconds(e, h, h + 1);
          ev_.stages[h].transfer += seconds;
          ev_.stages[h + 1].transfer += seconds;
        }
      } else {
        const double seconds = hop_seconds(e, a, b);
        ev_.stages[a].transfer += seconds;
        ev_.stages[b].transfer += seconds;
      }
    }
    std::sort(ev_.stage_edges.begin(), ev_.stage_edges.end());
    ev_.stage_edges.erase(std::unique(ev_.stage_edges.begin(), ev_.stage_edges.end()), ev_.stage_edges.end());
  }

  // The depth: the longest path of stages, where a chain also runs stage i before stage i + 1
  // where no tensor says so.
  void depth() {
    order_edges_ = ev_.stage_edges;
    if (p_.chain) {
      for (int s = 0; s + 1 < k_; ++s) order_edges_.push_back({s, s + 1});
      std::sort(order_edges_.begin(), order_edges_.end());
      order_edges_.erase(std::unique(order_edges_.begin(), order_edges_.end()), order_edges_.end());
    }
    std::vector<int> longest(k_, 1);
    for (int s = k_ - 1; s >= 0; --s) {
      // order_edges_ is sorted by src, so scan the edges out of s
      auto it = std::lower_bound(order_edges_.begin(), order_edges_.end(), std::pair<int, int>{s, -1});
      for (; it != order_edges_.end() && it->first == s; ++it) {
        longest[s] = std::max(longest[s], longest[it->second] + 1);
      }
    }
    ev_.depth = k_ ? *std::max_element(longest.begin(), longest.end()) : 0;
  }

  // Micro-batches in flight, memory, and recomputation where the activations do not fit.
  void memory() {
    std::vector<int> in_flight = p_.in_flight(k_, order_edges_, p_.num_micro_batches);
    if (static_cast<int>(in_flight.size()) != k_) {
      throw PlanningError("the in-flight rule returned " + std::to_string(in_flight.size()) + " figures for " +
                          std::to_string(k_) + " stages");
    }
    for (int s = 0; s < k_; ++s) {
      StageFigures& f = ev_.stages[s];
      f.in_flight = in_flight[s];
      // Recomputation where the activations do not fit (recompute.h, the rule the DPs share):
      // the forward runs again in the backward, in the half that first uses the activations.
      const StageMemory m =
          stage_memory(f.static_bytes, f.activation_bytes, f.input_bytes, f.in_flight, p_.memory_limit);
      f.memory = m.bytes;
      if (m.recompute) {
        f.recompute = true;
        f.backward += f.forward;
        (input_walks_[s] ? f.backward_input : f.backward_weight) += f.forward;
      }
    }
  }

  // The runtime sums a replicated stage's gradients in buckets (cost/gradient_buckets.h) that
  // start while its last backward B still runs (the backward fills them at an even pace over the
  // bytes, the simulator's model) and run one after another, each priced at its share of the
  // stage's all_reduce: bucket i is ready when B has produced the bytes up to it, and the sum's
  // exposed part is how far the last one ends past B's end, and what the sums beside B cost it
  // on devices whose collectives share its cores (cost::exposed_sync_seconds).
  // Backward work upstream of a stage hides as much of its tail.
  void optimizer_tail() {
    // Backward work upstream of each stage (stages are numbered topologically, edges by src).
    std::vector<double> upstream(k_, 0.0);
    for (const auto& [a, b] : order_edges_) upstream[b] = std::max(upstream[b], upstream[a] + ev_.stages[a].backward);
    std::vector<double> stage_params(k_, 0.0);
    for (int v = 0; v < n_; ++v) stage_params[ev_.stage_of[v]] += p_.param_bytes[v];
    for (int s = 0; s < k_; ++s) {
      const StageFigures& f = ev_.stages[s];
      double exposed = f.all_reduce;
      if (f.all_reduce > 0.0) {
        exposed =
            cost::exposed_sync_seconds(f.all_reduce, f.backward, cost::bucket_sizes(stage_params[s], p_.bucket_bytes),
                                       p_.model->devices().collective_overlap_loss);
      }
      ev_.optimizer_tail = std::max(ev_.optimizer_tail, exposed + f.optimizer - upstream[s]);
    }
  }

  // The slowest stage (plain and split backward) and the worst memory overflow.
  void bottlenecks() {
    ev_.max_overflow = -std::numeric_limits<double>::infinity();
    for (int s = 0; s < k_; ++s) ev_.stages[s].dispatch = stage_dispatch_seconds(p_.model->devices());
    for (int s = 0; s < k_; ++s) {
      const StageFigures& f = ev_.stages[s];
      if (f.time() > ev_.bottleneck) ev_.bottleneck = f.time();
      // A split backward dispatches three instructions per micro-batch (F, I, W).
      const double split = f.forward + f.backward_input + f.backward_weight + f.transfer + f.dispatch * 1.5;
      if (split > ev_.split_bottleneck) {
        ev_.split_bottleneck = split;
        ev_.split_fill = std::max(0.0, f.forward + f.transfer + f.backward_input - f.backward_weight);
      }
      double overflow = f.memory - p_.memory_limit;
      if (overflow > ev_.max_overflow) {
        ev_.max_overflow = overflow;
        ev_.worst_memory_stage = s;
      }
    }
    shared_ranks();
  }

  // Stages that share a rank (the user's stage_devices: several stages per rank,
  // plan/rank_sharing.h) share its time and memory: the rank's bottleneck is the sum of its
  // stages' times, its memory the sum of theirs.
  void shared_ranks() {
    std::vector<std::vector<int>> ranks(static_cast<std::size_t>(k_));
    for (int s = 0; s < k_; ++s) ranks[static_cast<std::size_t>(s)] = ev_.stages[s].devices;
    if (!plan::shares_ranks(ranks)) return;
    std::map<int, std::vector<int>> stages_on;
    for (int s = 0; s < k_; ++s) {
      for (int r : ev_.stages[s].devices) stages_on[r].push_back(s);
    }
    for (const auto& [rank, stages] : stages_on) {
      double time = 0.0, split = 0.0, memory = 0.0;
      for (int s : stages) {
        const StageFigures& f = ev_.stages[s];
        time += f.time();
        split += f.forward + f.backward_input + f.backward_weight + f.transfer + f.dispatch * 1.5;
        memory += f.memory;
      }
      ev_.bottleneck = std::max(ev_.bottleneck, time);
      ev_.split_bottleneck = std::max(ev_.split_bottleneck, split);
      if (memory - p_.memory_limit > ev_.max_overflow) {
        ev_.max_overflow = memory - p_.memory_limit;
        ev_.worst_memory_stage = stages.front();
      }
    }
  }

  const Problem& p_;
  const graph::OpGraph& g_;
  const int n_;
  const std::vector<int>& assignment_;
  const std::vector<int>& replicas_;
  const std::vector<std::vector<int>>& devices_;
  int k_ = 0;                          // labels
  std::vector<int> first_;             // label -> first operator position
  std::vector<std::vector<int>> out_;  // label graph
  std::vector<int> indegree_, renumber_;
  Evaluation ev_;
  bool replicated_ = false;
  std::vector<int> level_;            // stage -> replica level
  std::vector<double> fraction_;      // stage -> rows of a replica's shard / rows of a micro-batch
  std::vector<cost::SyncLoad> sync_;  // stage -> what its all-reduce sums (replicated plans)
  std::vector<char> input_walks_;
  std::vector<double> pair_bytes_;  // bytes of each entry of stage_edges before deduplication
  cost::StageEdges order_edges_;
  double slow_bandwidth_ = 0.0;  // the problem's link: hops over it keep Problem::edge_seconds
};

}  // namespace

Evaluation evaluate(const Problem& p, const std::vector<int>& assignment, const std::vector<int>& replicas,
                    const std::vector<std::vector<int>>& devices) {
  return Evaluator(p, assignment, replicas, devices).run();
}

}  // namespace graphpipe::partition
