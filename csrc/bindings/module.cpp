// Entry point of graphpipe._C.
#include "bindings/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "graphpipe C++ core: operator graphs, partitioning, schedules, simulation, runtime";
  graphpipe::bindings::bind_errors(m);
  graphpipe::bindings::bind_log(m);
  graphpipe::bindings::bind_graph(m);
  graphpipe::bindings::bind_cost(m);
  graphpipe::bindings::bind_sync(m);
  graphpipe::bindings::bind_plan(m);
  graphpipe::bindings::bind_partition(m);
  graphpipe::bindings::bind_schedule(m);
  graphpipe::bindings::bind_sim(m);
  graphpipe::bindings::bind_comm_hooks(m);
  graphpipe::bindings::bind_runtime(m);
  graphpipe::bindings::bind_topology(m);
}
