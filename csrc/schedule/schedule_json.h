// JSON form of a Schedule (format "graphpipe.schedule", version kScheduleSchemaVersion).
//
//   {"format": "graphpipe.schedule", "schema_version": 1, "kind": "1f1b",
//    "num_micro_batches": 8, "stage_ranks": [[0], [1, 2], [3]],
//    "edges": [{"src": 0, "dst": 1}, {"src": 1, "dst": 2}],
//    "ranks": [["0F0", "0SF0e0", ...], ["1RF0e0", "1F0", ...], ...]}
//
// Instructions are stored as their tokens (instruction.h), which keeps files short and readable.
// Loading checks the header, every field's type (FormatError with the JSON path), each token,
// and then the schedule's invariants (validate(), ScheduleError). Linear in the file size.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "schedule/schedule.h"

namespace graphpipe::schedule {

inline constexpr int kScheduleSchemaVersion = 1;

nlohmann::json to_json(const Schedule& schedule);
Schedule from_json(const nlohmann::json& document);

std::string dumps(const Schedule& schedule, int indent = -1);
Schedule loads(const std::string& text);
void save(const Schedule& schedule, const std::string& path);
Schedule load(const std::string& path);

}  // namespace graphpipe::schedule
