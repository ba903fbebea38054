#include "runtime/flight_recorder.h"

#include <chrono>

namespace graphpipe::runtime {

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string_view flight_state_name(FlightState state) {
  switch (state) {
    case FlightState::posted:
      return "posted";
    case FlightState::waiting:
      return "waiting";
    case FlightState::running:
      return "running";
    case FlightState::completed:
      return "completed";
    case FlightState::failed:
      return "failed";
  }
  return "unknown";
}

FlightRecorder::FlightRecorder(std::size_t capacity) : slots_(capacity) {}

void FlightRecorder::set_capacity(std::size_t capacity) {
  std::lock_guard lock(mutex_);
  slots_.assign(capacity, FlightRecord{});
  next_ = 0;
  current_ = kNone;
}

std::size_t FlightRecorder::capacity() const {
  std::lock_guard lock(mutex_);
  return slots_.size();
}

void FlightRecorder::start_run() {
  std::lock_guard lock(mutex_);
  if (next_ > 0) ++run_;  // the first run is run 0
  current_ = kNone;
}

std::uint64_t FlightRecorder::run() const {
  std::lock_guard lock(mutex_);
  return run_;
}

std::optional<std::size_t> FlightRecorder::index_of(Id id) const {
  if (id == kNone || slots_.empty() || id >= next_ || next_ - id > slots_.size()) return std::nullopt;
  return static_cast<std::size_t>(id % slots_.size());
}

FlightRecorder::Id FlightRecorder::begin(const schedule::Instruction& instruction, FlightState state,
                                         const std::vector<int>& peers, std::int64_t bytes, std::string_view note) {
  const double now = wall_seconds();  // outside the lock: the lock guards memory only
  std::lock_guard lock(mutex_);
  if (slots_.empty()) return kNone;
  const Id id = next_++;
  FlightRecord& r = slots_[id % slots_.size()];
  r.id = id;
  r.run = run_;
  r.instruction = instruction;
  r.peers.assign(peers.begin(), peers.end());  // reuses the slot's buffer
  r.bytes = bytes;
  r.state = state;
  r.start = now;
  r.end = 0.0;
  r.note.assign(note.begin(), note.end());
  if (state == FlightState::running || state == FlightState::waiting) current_ = id;
  return id;
}

void FlightRecorder::wait(Id id) {
  std::lock_guard lock(mutex_);
  if (auto k = index_of(id)) {
    slots_[*k].state = FlightState::waiting;
    current_ = id;
  }
}

void FlightRecorder::end(Id id, FlightState state, std::string_view note) {
  const double now = wall_seconds();
  std::lock_guard lock(mutex_);
  if (auto k = index_of(id)) {
    FlightRecord& r = slots_[*k];
    r.state = state;
    r.end = now;
    r.note.assign(note.begin(), note.end());
  }
  // A failed record stays the current one: it is where the rank stopped.
  if (current_ == id && state != FlightState::failed) current_ = kNone;
}

std::vector<FlightRecord> FlightRecorder::records() const {
  std::lock_guard lock(mutex_);
  std::vector<FlightRecord> out;
  const std::size_t n = slots_.size();
  const Id first = next_ > n ? next_ - n : 0;
  out.reserve(static_cast<std::size_t>(next_ - first));
  for (Id id = first; id < next_; ++id) out.push_back(slots_[id % n]);
  return out;
}

std::optional<FlightRecord> FlightRecorder::last() const {
  std::lock_guard lock(mutex_);
  if (next_ == 0) return std::nullopt;
  if (auto k = index_of(next_ - 1)) return slots_[*k];
  return std::nullopt;
}

std::optional<FlightRecord> FlightRecorder::current() const {
  std::lock_guard lock(mutex_);
  if (auto k = index_of(current_)) return slots_[*k];
  return std::nullopt;
}

}  // namespace graphpipe::runtime
