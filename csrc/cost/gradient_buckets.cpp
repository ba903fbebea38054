#include "cost/gradient_buckets.h"

#include <map>
#include <utility>

namespace graphpipe::cost {

std::vector<GradientBucket> bucket_layout(const std::vector<BucketEntry>& parameters, double bucket_bytes) {
  std::vector<GradientBucket> buckets;
  // (dtype, device) -> its open bucket, and whether that is the first it opened (DDP's small one).
  std::map<std::pair<std::string, std::string>, std::pair<std::size_t, bool>> open;
  for (int p = static_cast<int>(parameters.size()) - 1; p >= 0; --p) {
    const BucketEntry& t = parameters[p];
    if (!t.trained) continue;
    const std::pair<std::string, std::string> key{t.dtype, t.device};
    auto it = open.find(key);
    const bool none = it == open.end();
    const double cap = !none && it->second.second ? first_bucket_cap(bucket_bytes) : bucket_bytes;
    if (none || (cap > 0.0 && buckets[it->second.first].bytes() >= cap)) {
      buckets.push_back({t.dtype, t.element_size, 0, {}});
      it = open.insert_or_assign(key, std::make_pair(buckets.size() - 1, none)).first;
    }
    GradientBucket& b = buckets[it->second.first];
    b.numel += t.numel;
    b.parameters.push_back(p);
  }
  return buckets;
}

std::vector<GradientBucket> gradient_buckets(const std::vector<graph::ParamShape>& parameters, double bucket_bytes) {
  std::vector<BucketEntry> entries;
  entries.reserve(parameters.size());
  for (const graph::ParamShape& t : parameters) {
    entries.push_back({t.dtype, std::string(), t.element_size, t.numel(), t.requires_grad});
  }
  return bucket_layout(entries, bucket_bytes);
}

}  // namespace graphpipe::cost
