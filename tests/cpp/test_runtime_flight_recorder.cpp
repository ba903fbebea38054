// The flight recorder's ring: what it keeps, what it reports as current, and that it forgets
// only the oldest records.
#include <gtest/gtest.h>

#include "runtime/flight_recorder.h"

namespace {

namespace rt = graphpipe::runtime;
namespace sched = graphpipe::schedule;

sched::Instruction forward(int micro_batch) { return {sched::OpKind::forward, 1, micro_batch, -1}; }
sched::Instruction receive(int micro_batch) { return {sched::OpKind::recv_activation, 1, micro_batch, 0}; }

}  // namespace

TEST(FlightRecorder, KeepsTheLastCapacityRecordsOldestFirst) {
  rt::FlightRecorder recorder(3);
  for (int m = 0; m < 5; ++m) {
    auto id = recorder.begin(forward(m), rt::FlightState::running, {}, 0);
    recorder.end(id, rt::FlightState::completed);
  }
  auto kept = recorder.records();
  ASSERT_EQ(kept.size(), 3U);
  EXPECT_EQ(kept[0].instruction.micro_batch, 2);
  EXPECT_EQ(kept[2].instruction.micro_batch, 4);
  EXPECT_EQ(kept[2].id, 4U);
  for (const auto& r : kept) {
    EXPECT_EQ(r.state, rt::FlightState::completed);
    EXPECT_GE(r.end, r.start);
  }
  ASSERT_TRUE(recorder.last().has_value());
  EXPECT_EQ(recorder.last()->instruction.micro_batch, 4);
}

TEST(FlightRecorder, CurrentIsTheRecordRunningOrWaitedFor) {
  rt::FlightRecorder recorder;
  EXPECT_FALSE(recorder.current().has_value());
  auto posted = recorder.begin(receive(0), rt::FlightState::posted, {0}, 128);
  EXPECT_FALSE(recorder.current().has_value());  // posted, nobody waits yet
  recorder.wait(posted);
  ASSERT_TRUE(recorder.current().has_value());
  EXPECT_EQ(recorder.current()->state, rt::FlightState::waiting);
  EXPECT_EQ(recorder.current()->peers, std::vector<int>{0});
  EXPECT_EQ(recorder.current()->bytes, 128);
  recorder.end(posted, rt::FlightState::failed, "connection closed");
  auto last = recorder.last();
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->state, rt::FlightState::failed);
  EXPECT_EQ(last->note, "connection closed");
}

TEST(FlightRecorder, CapacityZeroRecordsNothingAndIdsOfForgottenRecordsAreIgnored) {
  rt::FlightRecorder recorder(0);
  EXPECT_EQ(recorder.begin(forward(0), rt::FlightState::running, {}, 0), rt::FlightRecorder::kNone);
  EXPECT_TRUE(recorder.records().empty());
  recorder.set_capacity(1);
  auto first = recorder.begin(forward(0), rt::FlightState::running, {}, 0);
  recorder.begin(forward(1), rt::FlightState::running, {}, 0);  // overwrites the first
  recorder.end(first, rt::FlightState::completed);              // no longer kept: no effect
  auto kept = recorder.records();
  ASSERT_EQ(kept.size(), 1U);
  EXPECT_EQ(kept[0].instruction.micro_batch, 1);
  EXPECT_EQ(kept[0].state, rt::FlightState::running);
}

TEST(FlightRecorder, RunsAreNumbered) {
  rt::FlightRecorder recorder;
  EXPECT_EQ(recorder.run(), 0U);
  recorder.start_run();
  auto id = recorder.begin(forward(0), rt::FlightState::running, {}, 0);
  recorder.end(id, rt::FlightState::completed);
  recorder.start_run();  // the first run is run 0; the next one, after records, run 1
  EXPECT_EQ(recorder.run(), 1U);
  EXPECT_EQ(recorder.records().back().run, 0U);
  id = recorder.begin(forward(1), rt::FlightState::running, {}, 0);
  EXPECT_EQ(recorder.records().back().run, 1U);
}
