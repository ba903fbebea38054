// fold: how a plan for k x D devices is folded onto D devices, k stages per device (the
// placements planner/folded_search.h makes), the plan's record of it (Plan::fold) and the names
// users give them.
//
// In a V (k = 2: device d holds stages d and 2D - 1 - d, as ZB-V places them; for more, the
// chain zigzags over the devices) a device's early and late stages meet at the turn, so the
// last device starts its backwards first, at 1F1B's activation memory; looping (d, d + D, ...:
// Megatron's interleaving) keeps every hop a step forward. Which one simulates faster depends on
// the cut, so the planner weighs both unless told one (planner::PlannerOptions::folds).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace graphpipe::plan {

enum class Fold {
  v,        // virtual device v = layer x D + p on p in even layers, on D - 1 - p in odd ones
  looping,  // virtual device v on v mod D
};

// How a plan's partitioner label describes the fold: "in a V" or "looping".
std::string_view fold_name(Fold fold);

// The name users give the fold, and the plan JSON's "fold": "v" or "looping".
std::string_view fold_key(Fold fold);

// The fold a user (or a plan file) names, fold_key's inverse; PlanningError naming the choices
// otherwise.
Fold parse_fold(const std::string& name);

// Every fold, in the order the planner weighs them.
std::vector<Fold> all_folds();

}  // namespace graphpipe::plan
