#include "sim/cross_replica_tail.h"

#include <set>

namespace graphpipe::sim {

void add_cross_replica_tail(std::vector<Task>& tasks, const plan::Plan& plan, const schedule::Schedule& leads,
                            const cost::Devices& devices, const cost::CrossReplica& cross_replica,
                            const std::vector<double>& optimizer_seconds) {
  const int R = leads.num_ranks();
  // A task that followed an optimizer step (of another stage of its rank; the step took no time)
  // now follows what that step followed: the step moves after the barrier.
  auto unmoved = [&](int cause) {
    while (cause >= 0 && tasks[cause].kind == TaskKind::optimizer) cause = tasks[cause].cause;
    return cause;
  };
  for (Task& t : tasks) {
    if (t.kind != TaskKind::optimizer) t.cause = unmoved(t.cause);
  }
  // Each rank's last task other than its optimizer steps, which wait for the barrier.
  std::vector<int> last(R, -1);
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    const Task& t = tasks[k];
    if (t.kind == TaskKind::optimizer) continue;
    for (int r : {t.rank, t.peer}) {
      if (r >= 0 && (last[r] < 0 || t.end > tasks[last[r]].end)) last[r] = static_cast<int>(k);
    }
  }
  // Every rank leaves its pipeline step with the step's closing loss sum over the pipeline's
  // ranks (runtime/steps.py), so every average starts when the last rank's part ends.
  int step_end = -1;
  for (int r = 0; r < R; ++r) {
    if (last[r] >= 0 && (step_end < 0 || tasks[last[r]].end > tasks[step_end].end)) step_end = last[r];
  }
  double barrier = 0.0;
  int barrier_cause = -1;
  for (int r = 0; r < R; ++r) {
    std::set<int> stages;
    for (const auto& i : leads.ranks[r]) stages.insert(i.stage);
    if (stages.empty()) continue;
    double bytes = 0.0;
    for (int st : stages) bytes += plan.stages[st].param_bytes;
    Task t;
    t.kind = TaskKind::cross_replica;
    t.rank = r;
    t.start = step_end >= 0 ? tasks[step_end].end : 0.0;
    t.end = t.start + cost::cross_replica_seconds(cross_replica, devices, bytes);
    t.cause = step_end;
    tasks.push_back(t);
    if (barrier_cause < 0 || t.end > barrier) {
      barrier = t.end;
      barrier_cause = static_cast<int>(tasks.size()) - 1;
    }
  }
  barrier += cross_replica.coordination_seconds;
  std::vector<double> clock(R, barrier);
  std::vector<int> clock_cause(R, barrier_cause);
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    Task& t = tasks[k];
    if (t.kind != TaskKind::optimizer) continue;
    t.start = clock[t.rank];
    t.end = t.start + optimizer_seconds[t.stage];
    t.cause = clock_cause[t.rank];
    clock[t.rank] = t.end;
    clock_cause[t.rank] = static_cast<int>(k);
  }
}

}  // namespace graphpipe::sim
