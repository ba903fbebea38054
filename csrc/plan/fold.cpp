#include "plan/fold.h"

#include "common/error.h"

namespace graphpipe::plan {

std::string_view fold_name(Fold fold) { return fold == Fold::v ? "in a V" : "looping"; }

std::string_view fold_key(Fold fold) { return fold == Fold::v ? "v" : "looping"; }

Fold parse_fold(const std::string& name) {
  if (name == "v") return Fold::v;
  if (name == "looping") return Fold::looping;
  throw PlanningError("unknown fold '" + name + "': choose 'v' (ZB-V's placement) or 'looping' (Megatron's)");
}

std::vector<Fold> all_folds() { return {Fold::v, Fold::looping}; }

}  // namespace graphpipe::plan
