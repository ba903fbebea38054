// Exceptions of the graphpipe core. Every error the core raises is one of these; the bindings
// translate each class to a Python exception of the same name (graphpipe.errors), so a message
// written here is the message a user reads.
#pragma once

#include <stdexcept>
#include <string>

namespace graphpipe {

// Base of every graphpipe error.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A graph that breaks an invariant: a cycle, a dangling edge, an unreachable output.
class GraphError : public Error {
 public:
  using Error::Error;
};

// A file (graph, plan, schedule, device description) that is malformed or inconsistent.
class FormatError : public Error {
 public:
  using Error::Error;
};

// A request the core cannot satisfy as asked: a model that does not fit in memory, more stages
// than operators, a bad argument.
class PlanningError : public Error {
 public:
  using Error::Error;
};

}  // namespace graphpipe
