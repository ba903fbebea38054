#include "plan/plan_format.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace graphpipe::plan {

namespace {

std::string format(const char* pattern, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, pattern, value);
  return buffer;
}

// 1.5 GiB, 12.0 MiB, 300 B: the unit that keeps the number readable.
std::string bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  return format(u ? "%.1f " : "%.0f ", b) + units[u];
}

std::string millis(double seconds) { return format("%.3f", seconds * 1e3); }

std::string pad(std::string text, std::size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

// "0,1,2,3", or "0-3" for a run of consecutive numbers (replicated stages get contiguous blocks
// of ranks; a stage spanning nodes, consecutive nodes).
std::string number_list(const std::vector<int>& d) {
  bool run = d.size() > 2;
  for (std::size_t i = 1; run && i < d.size(); ++i) run = d[i] == d[i - 1] + 1;
  if (run) return std::to_string(d.front()) + "-" + std::to_string(d.back());
  std::string text;
  for (std::size_t i = 0; i < d.size(); ++i) text += (i ? "," : "") + std::to_string(d[i]);
  return text;
}

std::string device_list(const Stage& st) { return number_list(st.devices); }

// The nodes of the stage's devices (Plan::stage_nodes); "?" when the plan did not record them.
std::string node_list(const Plan& plan, const Stage& st) {
  return plan.device_nodes.empty() ? "?" : number_list(plan.stage_nodes(st));
}

// " on 2 nodes" after the device count; nothing when the nodes are not recorded.
std::string nodes_summary(const Plan& plan) {
  const int n = plan.num_device_nodes();
  if (n == 0) return "";
  return n == 1 ? " on 1 node" : " on " + std::to_string(n) + " nodes";
}

// The stage's top-level modules (Stage::modules), at most four: "vision_model, text_model".
std::string module_list(const Stage& st) {
  std::string text;
  for (std::size_t i = 0; i < st.modules.size() && i < 4; ++i) text += (i ? ", " : "") + st.modules[i];
  return text + (st.modules.size() > 4 ? ", ..." : "");
}

// "precision bfloat16: activations and transfers 2 bytes/element, analytic compute at 156
// TFLOP/s (the devices' bfloat16 rate); profiled operators as measured".
std::string precision_line(const Plan& plan) {
  const std::string name = graph::to_string(plan.precision);
  std::string text = "  precision " + name + ": activations and transfers " +
                     std::to_string(graph::element_size(plan.precision)) + " bytes/element";
  if (plan.compute_flops_per_second > 0.0) {
    text += ", analytic compute at " + format("%.4g", plan.compute_flops_per_second / 1e12) + " TFLOP/s";
  }
  return text + "; profiled operators as measured\n";
}

std::string render(const Plan& plan, const graph::OpGraph* g) {
  std::ostringstream out;
  out << "Plan (" << plan.partitioner << "): " << plan.stages.size() << " stages on " << plan.num_devices << " devices"
      << nodes_summary(plan) << ", depth " << plan.depth << ", mini-batch " << plan.batch_size << " = "
      << plan.num_micro_batches << " x " << plan.micro_batch_size << ", optimizer " << plan.optimizer << ", schedule "
      << plan.schedule << (plan.chain ? ", run as a chain" : "") << "\n";
  out << "  bottleneck " << format("%.4g", plan.bottleneck_seconds_per_sample * 1e3) << " ms/sample, predicted step "
      << format("%.4g", plan.predicted_iteration_seconds * 1e3) << " ms, memory limit "
      << bytes(plan.memory_limit_bytes) << "\n";
  out << precision_line(plan);
  // Device lists of replicated stages are longer than one rank: the column grows to fit.
  std::size_t dev_width = 5;
  std::size_t node_width = 5;
  for (const Stage& st : plan.stages) {
    dev_width = std::max(dev_width, device_list(st).size() + 1);
    node_width = std::max(node_width, node_list(plan, st).size() + 1);
  }
  out << "  " << pad("stage", 6) << pad("dev", dev_width) << pad("node", node_width) << pad("ops", 6)
      << pad("fwd ms", 10) << pad("bwd ms", 10) << pad("xfer ms", 10) << pad("params", 11) << pad("act/mb", 11)
      << pad("inflt", 6) << pad("memory", 11) << pad("allred ms", 10) << pad("next", 10);
  // Without the graph the operators' names are unknown; the modules (stored in the plan) are not.
  const bool any_modules =
      std::any_of(plan.stages.begin(), plan.stages.end(), [](const Stage& st) { return !st.modules.empty(); });
  out << (g ? "operators" : any_modules ? "modules" : "") << "\n";
  for (const Stage& st : plan.stages) {
    const std::string devices = device_list(st);
    std::string next;
    for (const StageEdge& e : plan.edges) {
      if (e.src != st.id) continue;
      if (!next.empty()) next += ',';
      next += std::to_string(e.dst);
    }
    if (next.empty()) next = "-";
    out << "  " << pad(std::to_string(st.id), 6) << pad(devices, dev_width) << pad(node_list(plan, st), node_width)
        << pad(std::to_string(st.nodes.size()), 6) << pad(millis(st.forward_seconds), 10)
        << pad(millis(st.backward_seconds), 10) << pad(millis(st.transfer_seconds), 10)
        << pad(bytes(st.param_bytes), 11) << pad(bytes(st.activation_bytes), 11)
        << pad(std::to_string(st.in_flight) + (st.recompute ? "r" : ""), 6) << pad(bytes(st.memory_bytes), 11)
        << pad(millis(st.all_reduce_seconds), 10) << pad(next, 10);
    if (g && !st.nodes.empty()) {
      out << g->node(st.nodes.front()).name;
      if (st.nodes.size() > 1) out << " .. " << g->node(st.nodes.back()).name;
      if (!st.modules.empty()) out << " [" << module_list(st) << "]";
    } else if (!g) {
      out << module_list(st);
    }
    out << "\n";
  }
  if (!plan.edges.empty()) {
    out << "  stage edges:";
    for (const StageEdge& e : plan.edges) {
      out << " " << e.src << "->" << e.dst << " (" << e.edges.size() << " tensors, " << bytes(e.bytes) << ")";
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace

std::string to_string(const Plan& plan, const graph::OpGraph& graph) { return render(plan, &graph); }
std::string to_string(const Plan& plan) { return render(plan, nullptr); }

}  // namespace graphpipe::plan
