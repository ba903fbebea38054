// Rules the Python runtime reads from the C++ core instead of restating them: which stage a
// manual mapping's rules give each operator (partition/manual/manual.h), so that
// graphpipe.runtime.manual_plan matches rules exactly as the manual partitioner does.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "graph/op_graph.h"
#include "partition/manual/manual.h"

namespace py = pybind11;

namespace graphpipe::bindings {

void bind_topology(py::module_& m) {
  m.def("manual_rule_stages", &partition::manual_rule_stages, py::arg("graph"), py::arg("mapping"),
        "Per operator of `graph`, the stage of the longest rule of `mapping` ((prefix, stage) pairs) "
        "that covers it, -1 where none does (partition/manual/manual.h).");
}

}  // namespace graphpipe::bindings
