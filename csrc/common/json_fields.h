// Typed, validated access to fields of a JSON document, shared by every loader of the core
// (graphs, device descriptions, plans, schedules). Each accessor names the JSON path of a bad
// field in the FormatError it throws, so a user can find the problem in the file.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "common/error.h"

namespace graphpipe::json_fields {

inline std::string type_name(const nlohmann::json& value) { return value.type_name(); }

// The object `value` must be; `where` is its path for messages.
inline const nlohmann::json& object(const nlohmann::json& value, const std::string& where) {
  if (!value.is_object()) {
    throw FormatError(where + ": expected an object, found " + type_name(value));
  }
  return value;
}

inline const nlohmann::json& array(const nlohmann::json& value, const std::string& where) {
  if (!value.is_array()) {
    throw FormatError(where + ": expected an array, found " + type_name(value));
  }
  return value;
}

inline const nlohmann::json& field(const nlohmann::json& parent, const std::string& key, const std::string& where) {
  object(parent, where);
  auto it = parent.find(key);
  if (it == parent.end()) throw FormatError(where + ": missing field '" + key + "'");
  return *it;
}

template <typename T>
T get(const nlohmann::json& parent, const std::string& key, const std::string& where) {
  const nlohmann::json& value = field(parent, key, where);
  const std::string path = where + "." + key;
  if constexpr (std::is_same_v<T, bool>) {
    if (!value.is_boolean()) throw FormatError(path + ": expected a boolean, found " + type_name(value));
  } else if constexpr (std::is_integral_v<T>) {
    if (!value.is_number_integer()) {
      throw FormatError(path + ": expected an integer, found " + type_name(value));
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!value.is_number()) throw FormatError(path + ": expected a number, found " + type_name(value));
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!value.is_string()) throw FormatError(path + ": expected a string, found " + type_name(value));
  }
  return value.get<T>();
}

// A number that must be >= 0 (and not NaN).
template <typename T>
T non_negative(const nlohmann::json& parent, const std::string& key, const std::string& where) {
  T value = get<T>(parent, key, where);
  if (!(value >= 0)) throw FormatError(where + "." + key + ": must not be negative");
  return value;
}

// Checks the "format" tag and "schema_version" of a document.
inline void check_header(const nlohmann::json& document, const std::string& format, int version) {
  object(document, "$");
  auto tag = get<std::string>(document, "format", "$");
  if (tag != format) {
    throw FormatError("$.format: expected '" + format + "', found '" + tag + "'");
  }
  auto found = get<int>(document, "schema_version", "$");
  if (found != version) {
    throw FormatError("$.schema_version: this build reads version " + std::to_string(version) + " of " + format +
                      ", the file is version " + std::to_string(found));
  }
}

inline nlohmann::json parse(const std::string& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw FormatError(what + " is not valid JSON: " + e.what());
  }
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw FormatError("cannot open '" + path + "' for reading");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) throw FormatError("cannot open '" + path + "' for writing");
  out << text;
  if (!out) throw FormatError("failed writing '" + path + "'");
}

}  // namespace graphpipe::json_fields
