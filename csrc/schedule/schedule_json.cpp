#include "schedule/schedule_json.h"

#include "common/json_fields.h"

namespace graphpipe::schedule {

namespace jf = json_fields;
using nlohmann::json;

json to_json(const Schedule& s) {
  json edges = json::array();
  for (const auto& e : s.edges) edges.push_back({{"src", e.src}, {"dst", e.dst}});
  json ranks = json::array();
  for (const auto& program : s.ranks) {
    json tokens = json::array();
    for (const auto& i : program) tokens.push_back(to_token(i));
    ranks.push_back(std::move(tokens));
  }
  return {{"format", "graphpipe.schedule"},
          {"schema_version", kScheduleSchemaVersion},
          {"kind", s.kind},
          {"num_micro_batches", s.num_micro_batches},
          {"stage_ranks", s.stage_ranks},
          {"edges", std::move(edges)},
          {"ranks", std::move(ranks)}};
}

Schedule from_json(const json& doc) {
  jf::check_header(doc, "graphpipe.schedule", kScheduleSchemaVersion);
  Schedule s;
  s.kind = jf::get<std::string>(doc, "kind", "$");
  s.num_micro_batches = jf::get<int>(doc, "num_micro_batches", "$");
  const json& stage_ranks = jf::array(jf::field(doc, "stage_ranks", "$"), "$.stage_ranks");
  // Each entry is a stage's list of ranks (lead first); a bare integer, the form of schedules
  // written before replicated stages, is a stage on one rank.
  for (std::size_t k = 0; k < stage_ranks.size(); ++k) {
    const std::string at = "$.stage_ranks[" + std::to_string(k) + "]";
    if (stage_ranks[k].is_number_integer()) {
      s.stage_ranks.push_back({stage_ranks[k].get<int>()});
      continue;
    }
    const json& replicas = jf::array(stage_ranks[k], at);
    std::vector<int> ranks;
    for (std::size_t j = 0; j < replicas.size(); ++j) {
      if (!replicas[j].is_number_integer()) {
        throw FormatError(at + "[" + std::to_string(j) + "]: expected an integer rank");
      }
      ranks.push_back(replicas[j].get<int>());
    }
    s.stage_ranks.push_back(std::move(ranks));
  }
  const json& edges = jf::array(jf::field(doc, "edges", "$"), "$.edges");
  for (std::size_t k = 0; k < edges.size(); ++k) {
    const std::string at = "$.edges[" + std::to_string(k) + "]";
    s.edges.push_back({jf::get<int>(edges[k], "src", at), jf::get<int>(edges[k], "dst", at)});
  }
  const json& ranks = jf::array(jf::field(doc, "ranks", "$"), "$.ranks");
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::string at = "$.ranks[" + std::to_string(r) + "]";
    const json& program = jf::array(ranks[r], at);
    s.ranks.emplace_back();
    for (std::size_t k = 0; k < program.size(); ++k) {
      const std::string here = at + "[" + std::to_string(k) + "]";
      if (!program[k].is_string()) throw FormatError(here + ": expected a token string");
      try {
        s.ranks.back().push_back(parse_token(program[k].get<std::string>()));
      } catch (const FormatError& e) {
        throw FormatError(here + ": " + e.what());
      }
    }
  }
  validate(s);
  return s;
}

std::string dumps(const Schedule& s, int indent) { return to_json(s).dump(indent); }
Schedule loads(const std::string& text) { return from_json(jf::parse(text, "schedule")); }
void save(const Schedule& s, const std::string& path) { jf::write_file(path, dumps(s, 1)); }
Schedule load(const std::string& path) {
  return from_json(jf::parse(jf::read_file(path), "schedule file '" + path + "'"));
}

}  // namespace graphpipe::schedule
