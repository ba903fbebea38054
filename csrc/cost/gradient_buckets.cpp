#include "cost/gradient_buckets.h"

#include <map>
#include <utility>

namespace graphpipe::cost {

std::vector<GradientBucket> bucket_layout(const std::vector<BucketEntry>& parameters, double bucket_bytes) {
  std::vector<GradientBucket> buckets;
  std::map<std::pair<std::string, std::string>, std::size_t> open;  // (dtype, device) -> its open bucket
  for (int p = static_cast<int>(parameters.size()) - 1; p >= 0; --p) {
    const BucketEntry& t = parameters[p];
    if (!t.trained) continue;
    auto it = open.find({t.dtype, t.device});
    if (it == open.end() || (bucket_bytes > 0.0 && buckets[it->second].bytes() >= bucket_bytes)) {
      buckets.push_back({t.dtype, t.element_size, 0, {}});
      it = open.insert_or_assign({t.dtype, t.device}, buckets.size() - 1).first;
    }
    GradientBucket& b = buckets[it->second];
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
