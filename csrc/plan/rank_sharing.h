// rank_sharing: which stages may share a rank, the one rule that plans, the manual partitioner's
// stage_devices, and schedules all apply.
//
// A rank may hold several stages where each of them runs on that rank alone: the rank then runs
// their computes one at a time (schedule/generate.h) and an edge between two of them moves no
// data. A replicated stage keeps its ranks to itself, because its replicas run its lead's program
// in lockstep (schedule/schedule.h), which a rank shared with another stage could not. A stage
// lists each of its ranks once.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace graphpipe::plan {

// What breaks the rule among `stage_ranks` (per stage, its ranks), as a sentence naming the
// stages and the rank ("stages 0 and 2 both run on rank 0, and one of them is replicated: ..."),
// or nothing. Ranks out of range are the callers' to check.
std::optional<std::string> rank_sharing_problem(const std::vector<std::vector<int>>& stage_ranks);

// Whether any rank holds more than one stage.
bool shares_ranks(const std::vector<std::vector<int>>& stage_ranks);

// How many distinct ranks the stages run on: what the plan occupies, a rank holding several
// stages counted once.
int ranks_used(const std::vector<std::vector<int>>& stage_ranks);

}  // namespace graphpipe::plan
