// The pybind11 module graphpipe._C is assembled from one binding file per core layer; each
// defines one of these functions. Only this folder knows Python.
#pragma once

#include <pybind11/pybind11.h>

namespace graphpipe::bindings {

// Exception classes first: every other binding relies on them being registered.
void bind_errors(pybind11::module_& m);
void bind_log(pybind11::module_& m);
void bind_graph(pybind11::module_& m);
void bind_cost(pybind11::module_& m);
void bind_sync(pybind11::module_& m);
void bind_plan(pybind11::module_& m);
void bind_partition(pybind11::module_& m);
void bind_schedule(pybind11::module_& m);
void bind_sim(pybind11::module_& m);
// Communication hooks before the runtime: GradientBuckets takes a CommHook.
void bind_comm_hooks(pybind11::module_& m);
void bind_runtime(pybind11::module_& m);
void bind_topology(pybind11::module_& m);

}  // namespace graphpipe::bindings
