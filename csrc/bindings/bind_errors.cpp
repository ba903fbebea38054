// C++ exceptions of common/error.h become Python exceptions of the same names, so a message
// written in the core reaches the user unchanged.
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "common/error.h"

namespace py = pybind11;

namespace graphpipe::bindings {

void bind_errors(py::module_& m) {
  // pybind11 tries translators newest first: register the base class before its subclasses
  // so that each subclass maps to its own Python class.
  auto& base = py::register_exception<Error>(m, "GraphpipeError", PyExc_RuntimeError);
  py::register_exception<GraphError>(m, "GraphError", base.ptr());
  py::register_exception<FormatError>(m, "FormatError", base.ptr());
  py::register_exception<PlanningError>(m, "PlanningError", base.ptr());
}

}  // namespace graphpipe::bindings
