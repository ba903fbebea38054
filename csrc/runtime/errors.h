// Errors of the runtime: what a surviving rank raises when a peer dies, stalls or sends the wrong
// thing, and the error an injected fault raises. The bindings map each to a Python class of the same name under
// graphpipe.GraphpipeError, so a user can catch a dead peer (PeerError), a stuck one (PipelineTimeout, a PeerError) or
// a wiring bug (TransferMismatch) separately. Every message names this rank, the peer rank, the instruction token and
// the stage edge.
#pragma once

#include "common/error.h"

namespace graphpipe::runtime {

// A transfer with a peer failed: the peer died, closed its connection or its backend failed.
class PeerError : public Error {
 public:
  using Error::Error;
};

// A transfer did not complete within the configured timeout (the peer is stuck or dead and
// the backend did not notice). The process group is unusable afterwards.
class PipelineTimeout : public PeerError {
 public:
  using PeerError::PeerError;
};

// A fault injected on purpose (runtime/fault_injection.h, GRAPHPIPE_FAULT) fired with `raise`:
// Python's graphpipe.runtime.faults.InjectedFault, which the faults fired from Python raise too,
// so that a test tells an injected failure from a real one by its type wherever it fired.
class InjectedFaultError : public Error {
 public:
  using Error::Error;
};

// A stage produced (or a receive met) tensors whose number, shape or dtype differ from what the
// stage edge declares.
class TransferMismatch : public Error {
 public:
  using Error::Error;
};

}  // namespace graphpipe::runtime
