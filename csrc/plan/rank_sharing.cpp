#include "plan/rank_sharing.h"

#include <algorithm>
#include <cstddef>
#include <set>

namespace graphpipe::plan {

namespace {

int highest_rank(const std::vector<std::vector<int>>& stage_ranks) {
  int highest = -1;
  for (const auto& ranks : stage_ranks) {
    for (int r : ranks) highest = std::max(highest, r);
  }
  return highest;
}

}  // namespace

std::optional<std::string> rank_sharing_problem(const std::vector<std::vector<int>>& stage_ranks) {
  for (std::size_t s = 0; s < stage_ranks.size(); ++s) {
    std::vector<int> ranks = stage_ranks[s];
    std::sort(ranks.begin(), ranks.end());
    const auto twice = std::adjacent_find(ranks.begin(), ranks.end());
    if (twice != ranks.end()) return "stage " + std::to_string(s) + " lists rank " + std::to_string(*twice) + " twice";
  }
  std::vector<int> owner(static_cast<std::size_t>(highest_rank(stage_ranks) + 1), -1);
  for (std::size_t s = 0; s < stage_ranks.size(); ++s) {
    const auto& ranks = stage_ranks[s];
    for (int r : ranks) {
      if (r < 0) continue;
      int& held = owner[static_cast<std::size_t>(r)];
      if (held >= 0 && (ranks.size() > 1 || stage_ranks[static_cast<std::size_t>(held)].size() > 1)) {
        return "stages " + std::to_string(held) + " and " + std::to_string(s) + " both run on rank " +
               std::to_string(r) +
               ", and one of them is replicated: a rank holds several stages only where each of them runs on "
               "that rank alone";
      }
      held = static_cast<int>(s);
    }
  }
  return std::nullopt;
}

bool shares_ranks(const std::vector<std::vector<int>>& stage_ranks) {
  std::vector<char> seen(static_cast<std::size_t>(highest_rank(stage_ranks) + 1), 0);
  for (const auto& ranks : stage_ranks) {
    for (int r : ranks) {
      if (r < 0) continue;
      if (seen[static_cast<std::size_t>(r)]) return true;
      seen[static_cast<std::size_t>(r)] = 1;
    }
  }
  return false;
}

int ranks_used(const std::vector<std::vector<int>>& stage_ranks) {
  std::set<int> ranks;
  for (const std::vector<int>& stage : stage_ranks) ranks.insert(stage.begin(), stage.end());
  return static_cast<int>(ranks.size());
}

}  // namespace graphpipe::plan
