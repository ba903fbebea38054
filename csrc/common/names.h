// names: lists of names for error messages, so that an "unknown X" error names every choice
// from the same list the code accepts (partitioners, schedule kinds, presets, optimizers).
#pragma once

#include <string>
#include <vector>

namespace graphpipe {

// "a, b, c" with last_separator ", "; "a, b or c" with " or ".
inline std::string list_names(const std::vector<std::string>& names, const std::string& last_separator = ", ") {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i) text += i + 1 == names.size() ? last_separator : ", ";
    text += names[i];
  }
  return text;
}

}  // namespace graphpipe
