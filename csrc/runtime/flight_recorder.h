// FlightRecorder: a ring buffer of a rank's last executor instructions and collectives, for
// diagnosing a pipeline that failed or hung (which instruction each rank was in, which peer it
// waited for, which transfer no peer matched).
//
// The executor records every instruction it runs: a compute (F, B, I, W, OPT) from when it
// starts running until it completes or fails; a transfer (RF, SF, RB, SB) from when it is
// posted, through the wait for it, until it completes or fails; the gradient all-reduce of a
// replicated stage (AR) while the executor waits for it. Each record holds the instruction
// (token, kind, stage, micro-batch, edge), its peer ranks, its payload bytes, its state and its
// start and end times. Only the last `capacity` records are kept; older ones are overwritten.
//
// current() is the record the rank is in right now (running or waiting), for a watcher thread
// (graphpipe/runtime/flight.py publishes it so that peers can tell who is stuck) and for the
// dumps written when the pipeline fails. Readers and the executor thread share the recorder: a
// mutex guards it, held only to copy one record in or out.
//
// Cost: per instruction two clock reads, one uncontended lock per state change and a copy of
// the peer list into a slot whose vector keeps its capacity, so no allocation once the ring has
// gone round; benchmarks/flight_bench.py measures a step with it on and off (docs/results.md). Off with
// capacity 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schedule/instruction.h"

namespace graphpipe::runtime {

enum class FlightState : std::uint8_t {
  posted,     // a transfer handed to the process group, not waited for yet
  waiting,    // the executor waits for it (a transfer, or AR's all-reduce)
  running,    // a compute instruction running on this rank
  completed,  // done
  failed,     // threw (the note says what)
};

// "posted", "waiting", ... as the dumps write them.
std::string_view flight_state_name(FlightState state);

struct FlightRecord {
  std::uint64_t id = 0;   // sequence number since the recorder was made
  std::uint64_t run = 0;  // which run() of the executor it belongs to, from 0
  schedule::Instruction instruction;
  std::vector<int> peers;  // transfers: the other end's ranks; AR: the stage's other replicas
  std::int64_t bytes = 0;  // payload of a transfer or an all-reduce
  FlightState state = FlightState::posted;
  // Seconds since the Unix epoch (the system clock: comparable between ranks of one host, and
  // roughly between hosts); end is 0 while the record is open.
  double start = 0.0;
  double end = 0.0;
  std::string note;  // empty, or the first line of an error, or an injected fault
};

class FlightRecorder {
 public:
  using Id = std::uint64_t;
  static constexpr Id kNone = ~Id{0};
  static constexpr std::size_t kDefaultCapacity = 1024;

  explicit FlightRecorder(std::size_t capacity = kDefaultCapacity);

  // Keeps the last `capacity` records from now on (0: records nothing); drops those kept.
  void set_capacity(std::size_t capacity);
  std::size_t capacity() const;

  // A new run() of the executor starts: records from now on carry the next run number.
  void start_run();
  // Opens a record in `state` (running and waiting make it the current one); kNone when off.
  Id begin(const schedule::Instruction& instruction, FlightState state, const std::vector<int>& peers,
           std::int64_t bytes, std::string_view note = {});
  // A posted transfer is now waited for (it becomes the current record).
  void wait(Id id);
  // Closes a record as completed or failed, with an optional note (a failure's first line).
  void end(Id id, FlightState state, std::string_view note = {});

  // The records kept, oldest first.
  std::vector<FlightRecord> records() const;
  // The record running or waited for now, if any (none between instructions and outside run()).
  std::optional<FlightRecord> current() const;
  // The newest record, if any.
  std::optional<FlightRecord> last() const;
  // The number of the run in progress or last run (0 before any).
  std::uint64_t run() const;

 private:
  // Where a record still kept lies in slots_ (none once overwritten); with mutex_ held.
  std::optional<std::size_t> index_of(Id id) const;

  mutable std::mutex mutex_;
  std::vector<FlightRecord> slots_;
  Id next_ = 0;
  Id current_ = kNone;
  std::uint64_t run_ = 0;
};

}  // namespace graphpipe::runtime
