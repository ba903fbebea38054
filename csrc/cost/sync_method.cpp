#include "cost/sync_method.h"

#include <cmath>
#include <sstream>

#include "common/error.h"
#include "common/json_fields.h"

namespace graphpipe::cost {

namespace jf = json_fields;

std::string to_string(SyncKind kind) {
  switch (kind) {
    case SyncKind::all_reduce:
      return "all_reduce";
    case SyncKind::local_sgd:
      return "local_sgd";
    case SyncKind::top_k:
      return "top_k";
    case SyncKind::power_sgd:
      return "power_sgd";
  }
  return "?";
}

std::vector<std::string> sync_kind_names() { return {"all_reduce", "local_sgd", "top_k", "power_sgd"}; }

SyncKind parse_sync_kind(const std::string& name) {
  if (name == "all_reduce" || name == "allreduce") return SyncKind::all_reduce;
  if (name == "local_sgd" || name == "localsgd") return SyncKind::local_sgd;
  if (name == "top_k" || name == "topk") return SyncKind::top_k;
  if (name == "power_sgd" || name == "powersgd") return SyncKind::power_sgd;
  throw PlanningError("unknown sync method kind '" + name + "': choose all_reduce, local_sgd, top_k or power_sgd");
}

void SyncMethod::validate() const {
  const std::string what = "sync method " + to_string(kind) + ": ";
  switch (kind) {
    case SyncKind::all_reduce:
      break;
    case SyncKind::local_sgd:
      if (!(period >= 1.0) || !std::isfinite(period)) {
        throw PlanningError(what + "period must be a finite number of steps >= 1, got " + std::to_string(period));
      }
      break;
    case SyncKind::top_k:
      if (!(ratio > 0.0 && ratio <= 1.0)) {
        throw PlanningError(what + "ratio must be in (0, 1], got " + std::to_string(ratio));
      }
      break;
    case SyncKind::power_sgd:
      if (rank < 1) throw PlanningError(what + "rank must be at least 1, got " + std::to_string(rank));
      if (!(min_compression_rate > 0.0) || !std::isfinite(min_compression_rate)) {
        throw PlanningError(what + "min_compression_rate must be a positive number, got " +
                            std::to_string(min_compression_rate));
      }
      break;
  }
}

std::string SyncMethod::describe() const {
  std::ostringstream text;
  text << to_string(kind);
  std::string args;
  std::ostringstream value;
  switch (kind) {
    case SyncKind::all_reduce:
      break;
    case SyncKind::local_sgd:
      value << "period=" << period;
      break;
    case SyncKind::top_k:
      value << "ratio=" << ratio;
      break;
    case SyncKind::power_sgd:
      value << "rank=" << rank;
      if (min_compression_rate != 2.0) value << ", min_compression_rate=" << min_compression_rate;
      break;
  }
  args = value.str();
  if (hierarchical) args += args.empty() ? "hierarchical" : ", hierarchical";
  if (!args.empty()) text << "(" << args << ")";
  return text.str();
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
