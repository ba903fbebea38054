#include "partition/registry.h"

#include <iterator>
#include <string_view>

#include "common/error.h"
#include "common/names.h"
#include "partition/manual/manual_partitioner.h"
#include "partition/metis/metis.h"
#include "partition/partitioner.h"
#include "partition/piper/piper_partitioner.h"
#include "partition/sequential/sequential_partitioner.h"
#include "partition/series_parallel_dp/graphpipe_portfolio.h"

namespace graphpipe::partition {

namespace {

struct Entry {
  std::string_view name;
  std::unique_ptr<Partitioner> (*make)();
};

template <class P>
std::unique_ptr<Partitioner> make() {
  return std::make_unique<P>();
}

// An explicit table rather than self-registration from each partitioner's file: the core is a
// static library, and the linker drops object files that nothing references, so a partitioner
// registering itself from a static initialiser would silently vanish from the registry.
// The order is the order users read in partitioner_names() and in the error message.
constexpr Entry kRegistry[] = {
    {GraphpipePortfolio::kName, &make<GraphpipePortfolio>},       {MetisPartitioner::kName, &make<MetisPartitioner>},
    {SequentialPartitioner::kName, &make<SequentialPartitioner>}, {ManualPartitioner::kName, &make<ManualPartitioner>},
    {PiperPartitioner::kName, &make<PiperPartitioner>},
};

}  // namespace

std::vector<std::string> partitioner_names() {
  std::vector<std::string> names;
  names.reserve(std::size(kRegistry));
  for (const Entry& entry : kRegistry) names.emplace_back(entry.name);
  return names;
}

std::unique_ptr<Partitioner> make_partitioner(const std::string& name) {
  for (const Entry& entry : kRegistry) {
    if (entry.name == name) return entry.make();
  }
  throw PlanningError("unknown partitioner '" + name + "': choose " + list_names(partitioner_names(), " or "));
}

bool places_by_user(const std::string& name) { return make_partitioner(name)->places_by_user(); }

std::vector<std::string> baseline_names() {
  std::vector<std::string> names;
  for (const Entry& entry : kRegistry) {
    if (entry.make()->is_baseline()) names.emplace_back(entry.name);
  }
  return names;
}

}  // namespace graphpipe::partition
