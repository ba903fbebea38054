#include "graph/precision.h"

#include "common/error.h"
#include "common/names.h"

namespace graphpipe::graph {

namespace {
constexpr Precision kAll[] = {Precision::float32, Precision::float64, Precision::bfloat16, Precision::float16};
}

std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::float32:
      return "float32";
    case Precision::float64:
      return "float64";
    case Precision::bfloat16:
      return "bfloat16";
    case Precision::float16:
      return "float16";
  }
  return "float32";
}

std::vector<std::string> precision_names() {
  std::vector<std::string> names;
  for (Precision p : kAll) names.push_back(to_string(p));
  return names;
}

Precision parse_precision(std::string_view name) {
  constexpr std::string_view torch_prefix = "torch.";
  if (name.starts_with(torch_prefix)) name.remove_prefix(torch_prefix.size());
  for (Precision p : kAll) {
    if (name == to_string(p)) return p;
  }
  throw GraphError("unknown compute precision '" + std::string(name) + "': choose " + list_names(precision_names()));
}

int element_size(Precision precision) {
  switch (precision) {
    case Precision::float64:
      return 8;
    case Precision::bfloat16:
    case Precision::float16:
      return 2;
    case Precision::float32:
      return 4;
  }
  return 4;
}

bool is_half(Precision precision) { return precision == Precision::bfloat16 || precision == Precision::float16; }

}  // namespace graphpipe::graph
