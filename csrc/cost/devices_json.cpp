#include "cost/devices_json.h"

#include <map>
#include <string>

#include "common/error.h"
#include "common/json_fields.h"

namespace graphpipe::cost {

namespace jf = json_fields;

nlohmann::json to_json(const Devices& d) {
  nlohmann::json doc{{"format", "graphpipe.devices"},
                     {"schema_version", kDevicesSchemaVersion},
                     {"name", d.name},
                     {"count", d.count},
                     {"memory_bytes", d.memory_bytes},
                     {"flops_per_second", d.flops_per_second},
                     {"memory_bandwidth", d.memory_bandwidth},
                     {"op_overhead_seconds", d.op_overhead_seconds},
                     {"instruction_overhead_seconds", d.instruction_overhead_seconds},
                     {"step_overhead_seconds", d.step_overhead_seconds},
                     {"relative_speed", d.relative_speed},
                     {"link_bandwidth", d.link_bandwidth},
                     {"link_latency", d.link_latency}};
  if (!d.node.empty()) doc["node"] = d.node;
  // absent: no rate of its own, the float32 rate (cost/devices.h)
  if (d.bfloat16_flops_per_second > 0.0) doc["bfloat16_flops_per_second"] = d.bfloat16_flops_per_second;
  if (d.float16_flops_per_second > 0.0) doc["float16_flops_per_second"] = d.float16_flops_per_second;
  if (d.extra_tensor_seconds) doc["extra_tensor_seconds"] = *d.extra_tensor_seconds;  // absent: unmeasured
  if (d.collective_overlap_loss > 0.0) doc["collective_overlap_loss"] = d.collective_overlap_loss;        // absent: 0
  if (d.rank_skew_fraction > 0.0) doc["rank_skew_fraction"] = d.rank_skew_fraction;                       // absent: 0
  if (!d.optimizer_tensor_seconds.empty()) doc["optimizer_tensor_seconds"] = d.optimizer_tensor_seconds;  // absent: {}
  if (d.has_collective_link()) {  // absent: collectives priced from the links (cost/devices.h)
    doc["collective_latency_seconds"] = d.collective_latency_seconds;
    doc["collective_bandwidth_bytes_per_second"] = d.collective_bandwidth_bytes_per_second;
  }
  return doc;
}

namespace {

// "optimizer_tensor_seconds": an object of prices per optimizer name (devices.h). A bare number is
// the form before prices were kept per optimizer, measured with SGD unless told otherwise: read as
// SGD's price.
std::map<std::string, double> optimizer_prices(const nlohmann::json& doc) {
  const auto& value = doc["optimizer_tensor_seconds"];
  if (value.is_number()) return {{"sgd", jf::non_negative<double>(doc, "optimizer_tensor_seconds", "$")}};
  jf::object(value, "$.optimizer_tensor_seconds");
  std::map<std::string, double> prices;
  for (const auto& [name, price] : value.items()) {
    prices[name] = jf::non_negative<double>(value, name, "$.optimizer_tensor_seconds");
  }
  return prices;
}

std::vector<std::vector<double>> matrix(const nlohmann::json& doc, const std::string& key, int count, bool positive) {
  const std::string path = "$." + key;
  const auto& rows = jf::array(jf::field(doc, key, "$"), path);
  if (static_cast<int>(rows.size()) != count) {
    throw FormatError(path + ": expected " + std::to_string(count) + " rows (one per device), found " +
                      std::to_string(rows.size()));
  }
  std::vector<std::vector<double>> result(count, std::vector<double>(count, 0.0));
  for (int a = 0; a < count; ++a) {
    const std::string row_path = path + "[" + std::to_string(a) + "]";
    const auto& row = jf::array(rows[a], row_path);
    if (static_cast<int>(row.size()) != count) {
      throw FormatError(row_path + ": expected " + std::to_string(count) + " entries, found " +
                        std::to_string(row.size()));
    }
    for (int b = 0; b < count; ++b) {
      const std::string cell = row_path + "[" + std::to_string(b) + "]";
      if (!row[b].is_number()) throw FormatError(cell + ": expected a number, found " + row[b].type_name());
      double v = row[b].get<double>();
      if (a != b && (positive ? !(v > 0.0) : !(v >= 0.0))) {
        throw FormatError(cell + ": must be " + (positive ? "positive" : "non-negative") + ", found " +
                          std::to_string(v));
      }
      result[a][b] = v;
    }
  }
  return result;
}

double positive(const nlohmann::json& doc, const std::string& key) {
  double v = jf::get<double>(doc, key, "$");
  if (!(v > 0.0)) throw FormatError("$." + key + ": must be positive, found " + std::to_string(v));
  return v;
}

}  // namespace

Devices devices_from_json(const nlohmann::json& doc) {
  jf::check_header(doc, "graphpipe.devices", kDevicesSchemaVersion);
  Devices d;
  d.name = jf::get<std::string>(doc, "name", "$");
  d.count = jf::get<int>(doc, "count", "$");
  if (d.count < 1) throw FormatError("$.count: must be at least 1, found " + std::to_string(d.count));
  d.memory_bytes = positive(doc, "memory_bytes");
  d.flops_per_second = positive(doc, "flops_per_second");
  d.memory_bandwidth = positive(doc, "memory_bandwidth");
  d.op_overhead_seconds = jf::non_negative<double>(doc, "op_overhead_seconds", "$");
  // Optional: files written before the runtime costs (or the collective link) were measured
  // read as unmeasured (0); files without the 16-bit rates price every precision at the float32 one.
  for (auto [key, field] :
       {std::pair{"instruction_overhead_seconds", &d.instruction_overhead_seconds},
        std::pair{"step_overhead_seconds", &d.step_overhead_seconds},
        std::pair{"collective_latency_seconds", &d.collective_latency_seconds},
        std::pair{"collective_bandwidth_bytes_per_second", &d.collective_bandwidth_bytes_per_second},
        std::pair{"collective_overlap_loss", &d.collective_overlap_loss},
        std::pair{"rank_skew_fraction", &d.rank_skew_fraction},
        std::pair{"bfloat16_flops_per_second", &d.bfloat16_flops_per_second},
        std::pair{"float16_flops_per_second", &d.float16_flops_per_second}}) {
    if (doc.contains(key)) *field = jf::non_negative<double>(doc, key, "$");
  }
  if (doc.contains("optimizer_tensor_seconds")) d.optimizer_tensor_seconds = optimizer_prices(doc);
  if (doc.contains("extra_tensor_seconds")) {  // optional: absent, each extra tensor costs a latency
    d.extra_tensor_seconds = jf::non_negative<double>(doc, "extra_tensor_seconds", "$");
  }
  d.relative_speed = positive(doc, "relative_speed");
  d.link_bandwidth = matrix(doc, "link_bandwidth", d.count, true);
  d.link_latency = matrix(doc, "link_latency", d.count, false);
  if (doc.contains("node")) {  // optional: without it every device is on one node
    const auto& nodes = jf::array(doc["node"], "$.node");
    if (static_cast<int>(nodes.size()) != d.count) {
      throw FormatError("$.node: expected " + std::to_string(d.count) + " entries (one per device), found " +
                        std::to_string(nodes.size()));
    }
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      if (!nodes[i].is_number_integer() || nodes[i].get<int>() < 0) {
        throw FormatError("$.node[" + std::to_string(i) + "]: expected a non-negative integer, found " +
                          nodes[i].dump());
      }
      d.node.push_back(nodes[i].get<int>());
    }
  }
  try {
    d.validate();
  } catch (const PlanningError& e) {
    throw FormatError(std::string("invalid device description: ") + e.what());
  }
  return d;
}

std::string dumps(const Devices& devices, int indent) { return to_json(devices).dump(indent); }

Devices loads_devices(const std::string& text) { return devices_from_json(jf::parse(text, "device description")); }

void save(const Devices& devices, const std::string& path) { jf::write_file(path, dumps(devices, 2)); }

Devices load_devices(const std::string& path) {
  return devices_from_json(jf::parse(jf::read_file(path), "'" + path + "'"));
}

}  // namespace graphpipe::cost
