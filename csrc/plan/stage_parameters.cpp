#include "plan/stage_parameters.h"

#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace graphpipe::plan {

namespace {

// The module tree of one stage: each tree node is a module, with its own parameters and its
// children in creation order.
class ModuleTree {
 public:
  ModuleTree() : nodes_(1) {}

  void insert(const std::string& name, const graph::ParamShape* shape) {
    int at = 0;
    std::size_t start = 0;
    for (std::size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
      at = child(at, name.substr(start, dot - start));
      start = dot + 1;
    }
    nodes_[at].parameters.push_back(shape);
  }

  // Depth first, a module's own parameters before its children's (nn.Module.named_parameters).
  std::vector<graph::ParamShape> walk() const {
    std::vector<graph::ParamShape> out;
    std::vector<int> todo{0};
    while (!todo.empty()) {
      const int at = todo.back();
      todo.pop_back();
      for (const graph::ParamShape* p : nodes_[at].parameters) out.push_back(*p);
      for (auto it = nodes_[at].children.rbegin(); it != nodes_[at].children.rend(); ++it) todo.push_back(*it);
    }
    return out;
  }

 private:
  struct Node {
    std::unordered_map<std::string, int> index;
    std::vector<int> children;
    std::vector<const graph::ParamShape*> parameters;
  };
  int child(int at, const std::string& atom) {
    auto it = nodes_[at].index.find(atom);
    if (it != nodes_[at].index.end()) return it->second;
    const int id = static_cast<int>(nodes_.size());
    nodes_[at].index.emplace(atom, id);
    nodes_[at].children.push_back(id);
    nodes_.emplace_back();
    return id;
  }
  std::vector<Node> nodes_;
};

}  // namespace

void fill_stage_parameters(Plan& plan, const graph::OpGraph& g) {
  // Every owned parameter's shape by name (tied users name the owner's parameter).
  std::unordered_map<std::string_view, const graph::ParamShape*> shapes;
  for (const graph::Node& n : g.nodes()) {
    for (const graph::ParamShape& p : n.param_shapes) shapes.emplace(p.name, &p);
  }
  for (Stage& st : plan.stages) {
    st.parameters.clear();
    ModuleTree tree;
    std::unordered_set<std::string_view> seen;
    bool known = true;
    for (graph::NodeId v : st.nodes) {
      const graph::Node& n = g.node(v);
      if (n.param_bytes > 0 && n.param_shapes.empty()) known = false;
      for (const auto* names : {&n.params, &n.shared_params}) {
        for (const std::string& name : *names) {
          if (!seen.insert(name).second) continue;
          auto it = shapes.find(name);
          if (it == shapes.end()) {
            known = false;
            continue;
          }
          tree.insert(name, it->second);
        }
      }
    }
    if (known) st.parameters = tree.walk();
  }
}

}  // namespace graphpipe::plan
