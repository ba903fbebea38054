#include "sim/simulate.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <sstream>

#include "common/error.h"
#include "cost/cost_model.h"
#include "cost/gradient_buckets.h"
#include "cost/reshard.h"
#include "cost/sync_cost.h"
#include "schedule/check.h"
#include "schedule/fits_plan.h"
#include "schedule/generate.h"
#include "sim/cross_replica_tail.h"

namespace graphpipe::sim {

using plan::Plan;
using schedule::Instruction;
using schedule::OpKind;
using schedule::Schedule;
using schedule::ScheduleError;

namespace {

// The optimizer the step runs: SimOptions::optimizer where given, else the plan's (Plan::optimizer),
// else Adam, the planner's default, for a plan built without one.
cost::Optimizer stepped_optimizer(const plan::Plan& plan, const SimOptions& options) {
  if (options.optimizer) return *options.optimizer;
  return plan.optimizer.empty() ? cost::Optimizer::adam : cost::parse_optimizer(plan.optimizer);
}

// The optimizer step (cost::optimizer_step_seconds, at SimOptions::optimizer_traffic_factor) of
// stepped_optimizer over the stage's trained parameter tensors: those its graph gives, or one flat
// tensor for a plan read without its graph.
double optimizer_seconds(const plan::Plan& plan, const plan::Stage& stage, const cost::Devices& devices,
                         const SimOptions& options) {
  const auto trained = std::count_if(stage.parameters.begin(), stage.parameters.end(),
                                     [](const graph::ParamShape& p) { return p.requires_grad; });
  const std::size_t tensors =
      !stage.parameters.empty() ? static_cast<std::size_t>(trained) : (stage.param_bytes > 0.0 ? 1 : 0);
  return cost::optimizer_step_seconds(stage.param_bytes, tensors, devices, stepped_optimizer(plan, options),
                                      options.optimizer_traffic_factor);
}

struct Interval {
  double start, end;
};

// Total length of the union of `intervals` (sorted in place).
std::vector<Interval> merge(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end(), [](auto& a, auto& b) { return a.start < b.start; });
  std::vector<Interval> merged;
  for (const auto& i : intervals) {
    if (i.end <= i.start) continue;
    if (!merged.empty() && i.start <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, i.end);
    } else {
      merged.push_back(i);
    }
  }
  return merged;
}

double length(const std::vector<Interval>& disjoint) {
  double total = 0.0;
  for (const auto& i : disjoint) total += i.end - i.start;
  return total;
}

double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double total = 0.0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    double lo = std::max(a[i].start, b[j].start), hi = std::min(a[i].end, b[j].end);
    if (hi > lo) total += hi - lo;
    (a[i].end < b[j].end) ? ++i : ++j;
  }
  return total;
}

void check_inputs(const Plan& plan, const Schedule& s, const cost::Devices& devices) {
  schedule::check_fits(s, plan);
  const auto R = static_cast<std::size_t>(s.num_ranks());
  if (devices.count < s.num_ranks() || devices.link_latency.size() < R || devices.link_bandwidth.size() < R) {
    throw PlanningError("the schedule uses " + std::to_string(R) + " ranks but the devices '" + devices.name +
                        "' describe " + std::to_string(devices.count) + " (with link matrices for " +
                        std::to_string(devices.link_latency.size()) + ")");
  }
  for (std::size_t r = 0; r < R; ++r) {
    if (devices.link_latency[r].size() < R || devices.link_bandwidth[r].size() < R) {
      throw PlanningError("devices '" + devices.name + "': link matrix row " + std::to_string(r) +
                          " is shorter than the " + std::to_string(R) + " ranks");
    }
  }
}

// Replays the schedule's programs, timing every task. One object per simulate() call.
class Replay {
 public:
  Replay(const Plan& plan, const Schedule& s, const cost::Devices& devices, const SimOptions& options,
         const cost::SyncMethod& method, bool averaging)
      : plan_(plan),
        s_(s),
        devices_(devices),
        options_(options),
        method_(method),
        averaging_(averaging),
        R_(s.num_ranks()),
        M_(s.num_micro_batches) {
    const std::size_t E = s.edges.size();
    transfer_task_.assign(2 * E * M_, -1);
    pc_.assign(R_, 0);
    clock_.assign(R_, 0.0);
    clock_cause_.assign(R_, -1);
    in_batch_.assign(R_, 0);
    batch_end_.assign(R_, 0);
    unfinished_.assign(R_, 0);
    pair_free_.assign(static_cast<std::size_t>(R_) * R_, 0.0);
    pair_last_.assign(pair_free_.size(), -1);
    sends_.resize(pair_free_.size());
    recvs_.resize(pair_free_.size());
    tasks_.reserve(s.num_instructions());
    in_edges_.resize(s.num_stages());
    last_backward_.assign(s.num_stages(), -1);
    out_edges_.resize(s.num_stages());
    for (std::size_t e = 0; e < E; ++e) {
      in_edges_[s.edges[e].dst].push_back(static_cast<int>(e));
      out_edges_[s.edges[e].src].push_back(static_cast<int>(e));
    }
    price_syncs();
  }

  std::vector<Task> run() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int r = 0; r < R_; ++r) progress |= options_.overlap ? advance_overlapped(r) : advance_blocking(r);
    }
    for (int r = 0; r < R_; ++r) {
      if (pc_[r] < s_.ranks[r].size()) {
        throw ScheduleError("internal error: the simulation stalled at rank " + std::to_string(r) + ", step " +
                            std::to_string(pc_[r]));
      }
    }
    return std::move(tasks_);
  }

 private:
  struct Posted {
    int rank;
    std::size_t step;
    double time;
    int cause;
  };

  // What a replicated stage's sync costs, bucket by bucket (cost/sync_cost.h).
  struct StageSync {
    bool replicated = false;
    std::vector<cost::BucketCost> buckets;  // gradient methods, in start order
    std::vector<double> bytes;              // each bucket's gradient bytes (when it is ready: cost::bucket_spans)
    cost::BucketCost average;               // local SGD: one averaging of the parameters
  };

  void price_syncs() {
    sync_.resize(s_.num_stages());
    for (int st = 0; st < s_.num_stages(); ++st) {
      const auto& ranks = s_.stage_ranks[st];
      if (ranks.size() < 2) continue;
      const auto& stage = plan_.stages[st];
      StageSync& ss = sync_[st];
      ss.replicated = true;
      const std::vector<cost::SyncLoad> loads =
          cost::stage_bucket_loads(method_, stage.parameters, stage.param_bytes, options_.bucket_bytes, devices_);
      const cost::GroupPricer pricer(devices_, ranks, method_.hierarchical);
      cost::SyncCost priced = cost::price_sync(method_, loads, pricer);
      if (method_.local_updates()) {
        if (!priced.buckets.empty()) ss.average = priced.buckets.front();
        continue;
      }
      ss.buckets = std::move(priced.buckets);
      for (const cost::SyncLoad& load : loads) ss.bytes.push_back(load.bytes);
    }
  }

  std::size_t pair(int src, int dst) const { return static_cast<std::size_t>(src) * R_ + dst; }
  std::size_t pair_of(int r, const Instruction& i) const {
    const int peer = s_.peer_rank(i);
    return schedule::is_send(i.kind) ? pair(r, peer) : pair(peer, r);
  }
  std::size_t transfer_slot(OpKind kind, int edge, int mb) const {
    const bool gradient = kind == OpKind::send_gradient || kind == OpKind::recv_gradient;
    return (static_cast<std::size_t>(gradient) * s_.edges.size() + edge) * M_ + mb;
  }

  // The runtime's cost per compute instruction: the devices' measured figure
  // (cost::Devices::instruction_overhead_seconds, 0 when unmeasured), the one the planner charges.
  double overhead() const { return devices_.instruction_overhead_seconds; }

  double compute_seconds(const Instruction& i) const {
    const auto& stage = plan_.stages[i.stage];
    switch (i.kind) {
      case OpKind::forward:
        return stage.forward_seconds + overhead();
      case OpKind::backward:
        return stage.backward_seconds + overhead();
      case OpKind::backward_input:
        return schedule::backward_split(stage).first + overhead();
      case OpKind::backward_weight:
        return schedule::backward_split(stage).second + overhead();
      case OpKind::optimizer_step:
        // A fault-tolerant step's optimizer steps come after the replicas agree (cross_replica_tail.h).
        return options_.cross_replica.enabled() ? 0.0 : optimizer_seconds(plan_, stage, devices_, options_);
      default:
        return 0.0;
    }
  }

  int add_compute(int r, const Instruction& i, double start, int cause) {
    if (i.kind == OpKind::all_reduce) return add_all_reduce(r, i, start, cause);
    if (i.kind == OpKind::optimizer_step && averaging_ && sync_[i.stage].replicated) {
      // Local SGD: the step that averages runs the all-reduce of the parameters after the
      // optimizer step, not overlapped with anything (torch's model averaging).
      const int step = add_task(r, i, start, cause);
      Task t;
      t.kind = TaskKind::average;
      t.rank = r;
      t.stage = i.stage;
      t.start = tasks_[step].end;
      t.end = t.start + sync_[i.stage].average.seconds();
      t.cause = step;
      tasks_.push_back(t);
      return static_cast<int>(tasks_.size()) - 1;
    }
    return add_task(r, i, start, cause);
  }

  int add_task(int r, const Instruction& i, double start, int cause) {
    Task t;
    t.kind = i.kind == OpKind::forward           ? TaskKind::forward
             : i.kind == OpKind::backward        ? TaskKind::backward
             : i.kind == OpKind::backward_input  ? TaskKind::backward_input
             : i.kind == OpKind::backward_weight ? TaskKind::backward_weight
                                                 : TaskKind::optimizer;
    t.rank = r;
    t.stage = i.stage;
    t.micro_batch = i.micro_batch;
    t.start = start;
    t.end = start + compute_seconds(i);
    t.cause = cause;
    tasks_.push_back(t);
    const int index = static_cast<int>(tasks_.size()) - 1;
    // The replicas' gradient sum starts during the backward that finishes the weight gradients.
    if (t.kind == TaskKind::backward || t.kind == TaskKind::backward_weight) last_backward_[i.stage] = index;
    return index;
  }

  // The sync of a replicated stage's gradients, as the runtime runs it: each bucket's compression
  // (by a compressing method) and collectives at the times cost::bucket_spans gives over the
  // stage's last backward (cost/sync_cost.h prices both; with the default all-reduce,
  // cost::best_all_reduce over the stage's ranks). The all_reduce task spans the first
  // collective's start to the last one's end; the rank goes on (to its optimizer step) at its
  // end, pushed back by what the collectives beside the backward cost it
  // (Devices::collective_overlap_loss). Since `start` (the rank's clock) is at or after the last
  // backward's end, the task ends no earlier than it. Local SGD has no gradient exchange: an
  // empty task.
  int add_all_reduce(int r, const Instruction& i, double start, int cause) {
    const StageSync& ss = sync_[i.stage];
    Task t;
    t.kind = TaskKind::all_reduce;
    t.rank = r;
    t.stage = i.stage;
    t.start = start;
    t.end = start;
    t.cause = cause;
    const int b = last_backward_[i.stage];
    if (!ss.buckets.empty() && b >= 0) {
      std::vector<double> compress, comm;
      for (const cost::BucketCost& bucket : ss.buckets) {
        compress.push_back(bucket.compute_seconds);
        comm.push_back(bucket.comm_seconds);
      }
      const std::vector<cost::BucketSpan> spans =
          cost::bucket_spans(tasks_[b].start, tasks_[b].end, ss.bytes, compress, comm);
      int last_compress = -1;
      for (std::size_t k = 0; k < spans.size(); ++k) {
        if (compress[k] <= 0.0) continue;
        Task c;
        c.kind = TaskKind::compress;
        c.rank = r;
        c.stage = i.stage;
        c.micro_batch = static_cast<int>(k);
        c.start = spans[k].compress_start;
        c.end = spans[k].compress_end;
        // Waiting on the previous bucket's compression, or on the backward.
        c.cause = last_compress >= 0 && spans[k].compress_start > spans[k].ready ? last_compress : b;
        tasks_.push_back(c);
        last_compress = static_cast<int>(tasks_.size()) - 1;
      }
      t.start = spans.front().start;
      // Collectives beside the backward slow it where they share its cores (the rank goes on
      // that much later: cost::overlap_loss_seconds).
      t.end = std::max(spans.back().end, start) +
              cost::overlap_loss_seconds(spans, tasks_[b].end, devices_.collective_overlap_loss);
      if (last_compress >= 0 && spans.back().end > start) t.cause = last_compress;
    }
    tasks_.push_back(t);
    return static_cast<int>(tasks_.size()) - 1;
  }

  // How long one transfer of edge `e` takes between the stages' ranks: cost/reshard.h, the rule
  // the planner's evaluation prices stage edges by (the links the ranks use; re-sharded pairs of
  // replicas at once, as long as the busiest rank).
  double transfer_seconds(int e) const {
    const auto& se = plan_.edges[e];
    return cost::reshard_seconds(devices_, s_.stage_ranks[se.src], s_.stage_ranks[se.dst], plan_.micro_batch_size,
                                 se.bytes, se.tensors);
  }

  // Matches posted sends and receives of one pair; each match becomes a transfer task.
  void match(std::size_t p) {
    auto& sq = sends_[p];
    auto& rq = recvs_[p];
    while (!sq.empty() && !rq.empty()) {
      const Posted a = sq.front(), b = rq.front();
      sq.pop_front();
      rq.pop_front();
      const Instruction& send = s_.ranks[a.rank][a.step];
      Task t;
      t.kind = send.kind == OpKind::send_activation ? TaskKind::activation : TaskKind::gradient;
      t.rank = a.rank;
      t.peer = b.rank;
      t.stage = send.stage;
      t.micro_batch = send.micro_batch;
      t.edge = send.edge;
      t.start = a.time;
      t.cause = a.cause;
      if (b.time > t.start) {
        t.start = b.time;
        t.cause = b.cause;
      }
      if (pair_free_[p] > t.start) {
        t.start = pair_free_[p];
        t.cause = pair_last_[p];
      }
      t.end = t.start + transfer_seconds(send.edge);
      tasks_.push_back(t);
      const int index = static_cast<int>(tasks_.size()) - 1;
      pair_free_[p] = t.end;
      pair_last_[p] = index;
      transfer_task_[transfer_slot(send.kind, send.edge, send.micro_batch)] = index;
      for (int rank : {a.rank, b.rank}) {
        if (in_batch_[rank] && unfinished_[rank] > 0) --unfinished_[rank];
      }
    }
  }

  // overlap = false: batches of transfers block the rank until every transfer has arrived.
  bool advance_blocking(int r) {
    const auto& program = s_.ranks[r];
    bool progress = false;
    while (pc_[r] < program.size()) {
      if (in_batch_[r]) {
        if (unfinished_[r] > 0) break;
        for (std::size_t k = pc_[r]; k < batch_end_[r]; ++k) {
          const Instruction& i = program[k];
          const int t = transfer_task_[transfer_slot(i.kind, i.edge, i.micro_batch)];
          if (tasks_[t].end > clock_[r]) {
            clock_[r] = tasks_[t].end;
            clock_cause_[r] = t;
          }
        }
        in_batch_[r] = 0;
        pc_[r] = batch_end_[r];
        progress = true;
        continue;
      }
      const Instruction& i = program[pc_[r]];
      if (schedule::is_compute(i.kind)) {
        const int t = add_compute(r, i, clock_[r], clock_cause_[r]);
        clock_[r] = tasks_[t].end;
        clock_cause_[r] = t;
        ++pc_[r];
        progress = true;
        continue;
      }
      std::size_t q = pc_[r];
      while (q < program.size() && schedule::is_transfer(program[q].kind)) ++q;
      in_batch_[r] = 1;
      batch_end_[r] = q;
      unfinished_[r] = q - pc_[r];
      for (std::size_t k = pc_[r]; k < q; ++k) {
        const std::size_t p = pair_of(r, program[k]);
        (schedule::is_send(program[k].kind) ? sends_ : recvs_)[p].push_back({r, k, clock_[r], clock_cause_[r]});
      }
      for (std::size_t k = pc_[r]; k < q; ++k) match(pair_of(r, program[k]));
      progress = true;
    }
    return progress;
  }

  // overlap = true: sends and receives never block; a compute waits for its inputs' arrival.
  bool advance_overlapped(int r) {
    const auto& program = s_.ranks[r];
    bool progress = false;
    while (pc_[r] < program.size()) {
      const Instruction& i = program[pc_[r]];
      if (schedule::is_transfer(i.kind)) {
        const std::size_t p = pair_of(r, i);
        // A receive is posted ahead of time: only the send's time counts.
        const bool send = schedule::is_send(i.kind);
        (send ? sends_ : recvs_)[p].push_back({r, pc_[r], send ? clock_[r] : 0.0, send ? clock_cause_[r] : -1});
        match(p);
        ++pc_[r];
        progress = true;
        continue;
      }
      double start = clock_[r];
      int cause = clock_cause_[r];
      bool ready = true;
      auto input = [&](OpKind kind, int e) {
        const int t = transfer_task_[transfer_slot(kind, e, i.micro_batch)];
        if (t < 0) {
          ready = false;
        } else if (tasks_[t].end > start) {
          start = tasks_[t].end;
          cause = t;
        }
      };
      // A local edge's tensors are on this rank already: its producer ran earlier in this
      // program (schedule.h), so the rank's clock covers it.
      if (i.kind == OpKind::forward) {
        for (int e : in_edges_[i.stage]) {
          if (!s_.local(e)) input(OpKind::send_activation, e);
        }
      } else if (schedule::produces_input_gradients(i.kind)) {
        for (int e : out_edges_[i.stage]) {
          if (!s_.local(e)) input(OpKind::send_gradient, e);
        }
      }
      if (!ready) break;
      const int t = add_compute(r, i, start, cause);
      clock_[r] = tasks_[t].end;
      clock_cause_[r] = t;
      ++pc_[r];
      progress = true;
    }
    return progress;
  }

  const Plan& plan_;
  const Schedule& s_;
  const cost::Devices& devices_;
  const SimOptions& options_;
  const cost::SyncMethod method_;
  const bool averaging_;         // local SGD: this step averages the parameters
  std::vector<StageSync> sync_;  // per stage
  const int R_;
  const int M_;
  std::vector<Task> tasks_;
  std::vector<int> transfer_task_;  // [direction][edge][micro-batch] -> task index
  std::vector<std::size_t> pc_, batch_end_, unfinished_;
  std::vector<double> clock_;     // when the rank's program may go on
  std::vector<int> clock_cause_;  // the task that set clock_
  std::vector<char> in_batch_;
  std::vector<double> pair_free_;  // when each ordered link is free
  std::vector<int> pair_last_;
  std::vector<std::deque<Posted>> sends_, recvs_;
  std::vector<std::vector<int>> in_edges_, out_edges_;  // per stage
  std::vector<int> last_backward_;                      // per stage: its latest backward task so far
};

}  // namespace

std::string_view task_kind_name(TaskKind kind) {
  switch (kind) {
    case TaskKind::forward:
      return "forward";
    case TaskKind::backward:
      return "backward";
    case TaskKind::activation:
      return "activation";
    case TaskKind::gradient:
      return "gradient";
    case TaskKind::optimizer:
      return "optimizer";
    case TaskKind::all_reduce:
      return "all_reduce";
    case TaskKind::backward_input:
      return "backward_input";
    case TaskKind::backward_weight:
      return "backward_weight";
    case TaskKind::compress:
      return "compress";
    case TaskKind::average:
      return "average";
    case TaskKind::cross_replica:
      return "cross_replica";
  }
  return "?";
}

std::string task_name(const Task& t) {
  const std::string mb = std::to_string(t.micro_batch);
  switch (t.kind) {
    case TaskKind::forward:
      return "F" + mb + " s" + std::to_string(t.stage);
    case TaskKind::backward:
      return "B" + mb + " s" + std::to_string(t.stage);
    case TaskKind::activation:
      return "A" + mb + " e" + std::to_string(t.edge);
    case TaskKind::gradient:
      return "G" + mb + " e" + std::to_string(t.edge);
    case TaskKind::optimizer:
      return "OPT s" + std::to_string(t.stage);
    case TaskKind::all_reduce:
      return "AR s" + std::to_string(t.stage);
    case TaskKind::backward_input:
      return "I" + mb + " s" + std::to_string(t.stage);
    case TaskKind::backward_weight:
      return "W" + mb + " s" + std::to_string(t.stage);
    case TaskKind::compress:
      return "C" + mb + " s" + std::to_string(t.stage);
    case TaskKind::average:
      return "AVG s" + std::to_string(t.stage);
    case TaskKind::cross_replica:
      return "XR r" + std::to_string(t.rank);
  }
  return "?";
}

namespace {

// The step's wait for its slowest rank: Devices::rank_skew_seconds of the busiest rank's compute
// (its forwards and backwards, halves included), over the ranks that hold a stage (replicas
// included: they compute as their lead does; a rank of the description that holds none waits for
// nobody and keeps nobody waiting).
double rank_skew(const std::vector<Task>& tasks, const Schedule& s, const cost::Devices& devices) {
  std::vector<int> holding;
  for (const auto& ranks : s.stage_ranks) holding.insert(holding.end(), ranks.begin(), ranks.end());
  std::sort(holding.begin(), holding.end());
  holding.erase(std::unique(holding.begin(), holding.end()), holding.end());
  std::vector<double> compute(static_cast<std::size_t>(s.num_ranks()), 0.0);
  for (const Task& t : tasks) {
    if (t.kind == TaskKind::forward || t.kind == TaskKind::backward || t.kind == TaskKind::backward_input ||
        t.kind == TaskKind::backward_weight) {
      compute[t.rank] += t.end - t.start;
    }
  }
  const double busiest = compute.empty() ? 0.0 : *std::max_element(compute.begin(), compute.end());
  return devices.rank_skew_seconds(busiest, static_cast<int>(holding.size()));
}

// The step's length (its last task's end plus the fixed cost and the wait for the slowest rank), the mean over a
// local-SGD period
// (`other`: the length of the other kind of step, when the plan averages), the samples and the
// critical path back from the last task.
void step_figures(SimResult& result, const Plan& plan, const Schedule& s, const cost::Devices& devices,
                  const SimOptions& options, const std::function<double()>& other_step) {
  const auto& tasks = result.tasks;
  int last = -1;
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    if (last < 0 || tasks[k].end >= tasks[last].end) last = static_cast<int>(k);
  }
  // The step's fixed cost (Devices::step_overhead_seconds) comes on top of its tasks, and so
  // does its wait for the slowest rank (Devices::rank_skew_seconds of the busiest rank's compute).
  result.iteration_seconds =
      (last < 0 ? 0.0 : tasks[last].end) + devices.step_overhead_seconds + rank_skew(tasks, s, devices);
  result.amortized_iteration_seconds = result.iteration_seconds;
  if (other_step) {
    // The other kind of step, for the mean over a period: one step in `period` averages.
    const double other = other_step();
    const double averaging = options.sync_step ? result.iteration_seconds : other;
    const double local = options.sync_step ? other : result.iteration_seconds;
    result.amortized_iteration_seconds = local + (averaging - local) * cost::amortisation(result.sync);
  }
  result.samples =
      plan.batch_size > 0 ? plan.batch_size : s.num_micro_batches * std::max<std::int64_t>(plan.micro_batch_size, 1);
  result.samples_per_second = result.amortized_iteration_seconds > 0.0
                                  ? static_cast<double>(result.samples) / result.amortized_iteration_seconds
                                  : 0.0;
  for (int k = last; k >= 0; k = tasks[k].cause) result.critical_path.push_back(k);
  std::reverse(result.critical_path.begin(), result.critical_path.end());
}

// One lead rank's busy, communicating (and not computing) and waiting time in a step of T.
RankStats lead_stats(int r, int stage, std::vector<Interval> compute, std::vector<Interval> comm, double T) {
  RankStats stats;
  stats.rank = r;
  stats.stage = stage;
  auto busy = merge(std::move(compute));
  auto talking = merge(std::move(comm));
  stats.busy_seconds = length(busy);
  stats.comm_seconds = std::max(0.0, length(talking) - overlap(talking, busy));
  stats.bubble_seconds = std::max(0.0, T - stats.busy_seconds - stats.comm_seconds);
  if (T > 0.0) {
    stats.busy_share = stats.busy_seconds / T;
    stats.comm_share = stats.comm_seconds / T;
    stats.bubble_share = stats.bubble_seconds / T;
    stats.idle_share = 1.0 - stats.busy_share;
  }
  return stats;
}

// Per rank: busy, communicating (and not computing), waiting; a replica's figures are its lead's.
void rank_stats(SimResult& result, const Schedule& s) {
  const int R = s.num_ranks();
  std::vector<std::vector<Interval>> compute(R), comm(R);
  for (const auto& t : result.tasks) {
    if (t.kind == TaskKind::activation || t.kind == TaskKind::gradient) {
      comm[t.rank].push_back({t.start, t.end});
      comm[t.peer].push_back({t.start, t.end});
    } else if (t.kind == TaskKind::all_reduce || t.kind == TaskKind::average || t.kind == TaskKind::cross_replica) {
      comm[t.rank].push_back({t.start, t.end});
    } else {
      compute[t.rank].push_back({t.start, t.end});
    }
  }
  std::vector<int> stage_of_rank(R, -1);
  for (int st = 0; st < s.num_stages(); ++st) {
    for (int r : s.stage_ranks[st]) stage_of_rank[r] = st;
  }
  for (int r = 0; r < R; ++r) {
    if (stage_of_rank[r] >= 0 && s.lead_rank(stage_of_rank[r]) != r) {
      result.ranks.emplace_back();  // a replica: filled from its lead below
      continue;
    }
    result.ranks.push_back(
        lead_stats(r, stage_of_rank[r], std::move(compute[r]), std::move(comm[r]), result.iteration_seconds));
  }
  for (int r = 0; r < R; ++r) {
    if (stage_of_rank[r] < 0) continue;
    const int lead = s.lead_rank(stage_of_rank[r]);
    if (lead == r) continue;
    result.ranks[r] = result.ranks[lead];
    result.ranks[r].rank = r;
  }
}

// Per stage: micro-batches in flight from the start of the forward to the end of the backward.
// At equal times a release counts before an acquisition (the memory is reused).
void stage_peaks(SimResult& result, const Plan& plan, const Schedule& s) {
  std::vector<std::vector<std::pair<double, int>>> changes(s.num_stages());
  for (const auto& t : result.tasks) {
    // Held until its weight gradients are done: B, or W (which frees what I kept).
    if (t.kind == TaskKind::forward) changes[t.stage].push_back({t.start, +1});
    if (t.kind == TaskKind::backward || t.kind == TaskKind::backward_weight) changes[t.stage].push_back({t.end, -1});
  }
  for (int st = 0; st < s.num_stages(); ++st) {
    auto& c = changes[st];
    std::sort(c.begin(), c.end());
    int held = 0, peak = 0;
    for (const auto& [time, delta] : c) peak = std::max(peak, held += delta);
    result.stages.push_back({st, s.lead_rank(st), peak, peak * plan.stages[st].activation_bytes});
  }
}

}  // namespace

SimResult simulate(const Plan& plan, const Schedule& s, const cost::Devices& devices, const SimOptions& options) {
  check_inputs(plan, s, devices);
  schedule::require_deadlock_free(s);  // validates too

  SimResult result;
  result.overlap = options.overlap;
  result.sync = options.sync.value_or(plan.sync);
  result.sync.validate();
  // Replicas run their lead's program in lockstep (schedule/schedule.h): the leads are replayed,
  // and each replica's figures are its lead's.
  const Schedule leads = schedule::leads_only(s);
  const bool averages = result.sync.local_updates() && std::any_of(s.stage_ranks.begin(), s.stage_ranks.end(),
                                                                   [](const auto& r) { return r.size() > 1; });
  options.cross_replica.validate();
  if (options.cross_replica.enabled() && result.sync.local_updates()) {
    throw PlanningError(
        "a fault-tolerant step (CrossReplica.replicas > 1) averages the gradients across the "
        "replicas every step; sync=" +
        result.sync.describe() +
        " keeps its replicated stages "
        "apart between averages: simulate it with an all-reduce, top-k or PowerSGD sync");
  }
  result.tasks = Replay(plan, leads, devices, options, result.sync, averages && options.sync_step).run();
  if (options.cross_replica.enabled()) {
    std::vector<double> optimizer(plan.stages.size());
    for (std::size_t st = 0; st < plan.stages.size(); ++st)
      optimizer[st] = optimizer_seconds(plan, plan.stages[st], devices, options);
    add_cross_replica_tail(result.tasks, plan, leads, devices, options.cross_replica, optimizer);
  }
  std::function<double()> other_step;
  if (averages) {
    other_step = [&] {
      const std::vector<Task> tasks = Replay(plan, leads, devices, options, result.sync, !options.sync_step).run();
      double other = 0.0;
      for (const Task& t : tasks) other = std::max(other, t.end + devices.step_overhead_seconds);
      return other + rank_skew(tasks, s, devices);
    };
  }
  step_figures(result, plan, s, devices, options, other_step);
  rank_stats(result, s);
  stage_peaks(result, plan, s);
  return result;
}

std::string SimResult::summary() const {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "simulation (%s): iteration %.6g s, %.6g samples/s (%lld samples)\n",
                overlap ? "communication overlapped" : "communication blocking", iteration_seconds, samples_per_second,
                static_cast<long long>(samples));
  out << line;
  if (amortized_iteration_seconds != iteration_seconds) {
    std::snprintf(line, sizeof line, "sync %s: amortised iteration %.6g s\n", sync.describe().c_str(),
                  amortized_iteration_seconds);
    out << line;
  }
  out << "rank  stage   busy    comm  bubble\n";
  for (const auto& r : ranks) {
    std::snprintf(line, sizeof line, "%4d  %5d  %5.1f%%  %5.1f%%  %5.1f%%\n", r.rank, r.stage, 100 * r.busy_share,
                  100 * r.comm_share, 100 * r.bubble_share);
    out << line;
  }
  out << "stage  rank  peak in flight  peak activation bytes\n";
  for (const auto& st : stages) {
    std::snprintf(line, sizeof line, "%5d  %4d  %14d  %.4g\n", st.stage, st.rank, st.peak_in_flight,
                  st.peak_activation_bytes);
    out << line;
  }
  out << "critical path (" << critical_path.size() << " tasks):";
  const std::size_t shown = 24;
  for (std::size_t k = 0; k < critical_path.size(); ++k) {
    if (critical_path.size() > shown && k == shown / 2) {
      out << " ... (" << critical_path.size() - shown << " more)";
      k = critical_path.size() - shown / 2;
    }
    out << (k ? " -> " : " ") << task_name(tasks[critical_path[k]]);
  }
  out << '\n';
  return out.str();
}

}  // namespace graphpipe::sim
