// Python access to the core's log level (GRAPHPIPE_LOG_LEVEL sets the initial one).
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "common/log.h"

namespace py = pybind11;

namespace graphpipe::bindings {

void bind_log(py::module_& m) {
  m.def(
      "set_log_level", [](const std::string& name) { log::set_level(log::parse_level(name)); }, py::arg("level"),
      "Sets the core's log level: trace, debug, info, warn, error or off.");
  m.def(
      "log", [](const std::string& level, const std::string& message) { log::write(log::parse_level(level), message); },
      py::arg("level"), py::arg("message"), "Writes one line through the core's logger.");
}

}  // namespace graphpipe::bindings
