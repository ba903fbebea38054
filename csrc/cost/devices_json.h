// JSON form of Devices (schema "graphpipe.devices", version kDevicesSchemaVersion).
//
//   {"format": "graphpipe.devices", "schema_version": 1, "name": "v100", "count": 8,
//    "memory_bytes": ..., "flops_per_second": ..., "memory_bandwidth": ...,
//    "op_overhead_seconds": ..., "relative_speed": 1.0,
//    "link_bandwidth": [[...], ...], "link_latency": [[...], ...],
//    "node": [0, 0, 0, 0, 1, ...],            (optional: each device's node; absent: one node)
//    "instruction_overhead_seconds": ..., "step_overhead_seconds": ...,   (optional: measured
//    "collective_latency_seconds": ..., "collective_bandwidth_bytes_per_second": ...,   runtime
//    "extra_tensor_seconds": ..., "collective_overlap_loss": ...,          and link figures)
//    "optimizer_tensor_seconds": {"sgd": ..., "adam": ...},   (optional: absent {}; a bare number,
//    "rank_skew_fraction": ...,                                 the older form, is SGD's price; 0)
//    "bfloat16_flops_per_second": ..., "float16_flops_per_second": ...}   (optional: 0, absent)
//
// Loading checks the header, every field's presence and type, and the invariants of devices.h;
// a problem raises FormatError with the JSON path of the field ("$.link_bandwidth[2][5]: ...").
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "cost/devices.h"

namespace graphpipe::cost {

inline constexpr int kDevicesSchemaVersion = 1;

nlohmann::json to_json(const Devices& devices);
Devices devices_from_json(const nlohmann::json& document);

std::string dumps(const Devices& devices, int indent = -1);
Devices loads_devices(const std::string& text);
void save(const Devices& devices, const std::string& path);
Devices load_devices(const std::string& path);

}  // namespace graphpipe::cost
