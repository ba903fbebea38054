#include "plan/stage_modules.h"

#include <unordered_set>

namespace graphpipe::plan {

std::vector<std::string> top_modules(const graph::OpGraph& g, const std::vector<graph::NodeId>& nodes) {
  std::vector<std::string> seen;
  std::unordered_set<std::string> known;
  for (const graph::NodeId v : nodes) {
    const std::string& module = g.node(v).module;
    if (module.empty()) continue;
    std::string top = module.substr(0, module.find('.'));
    if (known.insert(top).second) seen.push_back(std::move(top));
  }
  return seen;
}

}  // namespace graphpipe::plan
