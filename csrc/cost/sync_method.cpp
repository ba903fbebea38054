#include "cost/sync_method.h"

#include "common/error.h"
#include "common/json_fields.h"
#include "cost/sync_kind.h"

namespace graphpipe::cost {

namespace jf = json_fields;

std::string to_string(SyncKind kind) { return std::string(sync_kind_model(kind).name()); }

std::vector<std::string> sync_kind_names() {
  std::vector<std::string> names;
  for (SyncKind kind : all_sync_kinds()) names.push_back(to_string(kind));
  return names;
}

SyncKind parse_sync_kind(const std::string& name) {
  for (SyncKind kind : all_sync_kinds()) {
    const SyncKindModel& model = sync_kind_model(kind);
    if (name == model.name()) return kind;
    for (std::string_view alias : model.aliases()) {
      if (name == alias) return kind;
    }
  }
  std::string choices;
  for (const std::string& known : sync_kind_names()) choices += (choices.empty() ? "" : ", ") + known;
  throw PlanningError("unknown sync method kind '" + name + "': choose one of " + choices);
}

bool SyncMethod::local_updates() const { return sync_kind_model(kind).local_updates(); }

void SyncMethod::validate() const { sync_kind_model(kind).validate(*this, "sync method " + to_string(kind) + ": "); }

std::string SyncMethod::describe() const {
  std::string args;
  for (const SyncArgument& argument : sync_kind_model(kind).arguments(*this)) {
    if (argument.in_summary) args += (args.empty() ? "" : ", ") + argument.name + "=" + argument.value;
  }
  if (hierarchical) args += args.empty() ? "hierarchical" : ", hierarchical";
  return to_string(kind) + (args.empty() ? "" : "(" + args + ")");
}

nlohmann::json to_json(const SyncMethod& m) {
  return {{"kind", to_string(m.kind)},
          {"period", m.period},
          {"ratio", m.ratio},
          {"rank", m.rank},
          {"min_compression_rate", m.min_compression_rate},
          {"hierarchical", m.hierarchical}};
}

SyncMethod sync_method_from_json(const nlohmann::json& value, const std::string& where) {
  jf::object(value, where);
  SyncMethod m;
  m.kind = parse_sync_kind(jf::get<std::string>(value, "kind", where));
  m.period = jf::get<double>(value, "period", where);
  m.ratio = jf::get<double>(value, "ratio", where);
  m.rank = jf::get<int>(value, "rank", where);
  m.min_compression_rate = jf::get<double>(value, "min_compression_rate", where);
  m.hierarchical = jf::get<bool>(value, "hierarchical", where);
  m.validate();
  return m;
}

}  // namespace graphpipe::cost
