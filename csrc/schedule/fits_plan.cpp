#include "schedule/fits_plan.h"

#include <string>

#include "schedule/generate.h"

namespace graphpipe::schedule {

namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ",") + std::to_string(r);
  return "[" + text + "]";
}

}  // namespace

void check_fits(const Schedule& s, const plan::Plan& plan) {
  if (static_cast<int>(plan.stages.size()) != s.num_stages()) {
    throw ScheduleError("the schedule has " + std::to_string(s.num_stages()) + " stages but the plan has " +
                        std::to_string(plan.stages.size()));
  }
  if (plan.edges.size() != s.edges.size()) {
    throw ScheduleError("the schedule has " + std::to_string(s.edges.size()) + " stage edges but the plan has " +
                        std::to_string(plan.edges.size()));
  }
  for (std::size_t e = 0; e < plan.edges.size(); ++e) {
    if (plan.edges[e].src != s.edges[e].src || plan.edges[e].dst != s.edges[e].dst) {
      throw ScheduleError("stage edge " + std::to_string(e) + " is " + std::to_string(plan.edges[e].src) + "->" +
                          std::to_string(plan.edges[e].dst) + " in the plan but " + std::to_string(s.edges[e].src) +
                          "->" + std::to_string(s.edges[e].dst) + " in the schedule: was it made for another plan?");
    }
  }
  if (s.num_micro_batches != plan.num_micro_batches) {
    throw ScheduleError("the schedule has " + std::to_string(s.num_micro_batches) + " micro-batches but the plan has " +
                        std::to_string(plan.num_micro_batches));
  }
  const std::vector<std::vector<int>> want = stage_ranks(plan);
  for (std::size_t st = 0; st < want.size(); ++st) {
    if (s.stage_ranks[st] != want[st]) {
      throw ScheduleError("stage " + std::to_string(st) + " runs on ranks " + ranks_text(s.stage_ranks[st]) +
                          " in the schedule but on " + ranks_text(want[st]) +
                          " in the plan: was it made for another plan?");
    }
  }
}

}  // namespace graphpipe::schedule
