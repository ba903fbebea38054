#include "cost/gradient_buckets.h"

#include <map>

namespace graphpipe::cost {

std::vector<GradientBucket> gradient_buckets(const std::vector<graph::ParamShape>& parameters, double bucket_bytes) {
  std::vector<GradientBucket> buckets;
  std::map<std::string, std::size_t> open;  // dtype -> its open bucket
  for (int p = static_cast<int>(parameters.size()) - 1; p >= 0; --p) {
    const graph::ParamShape& t = parameters[p];
    if (!t.requires_grad) continue;
    auto it = open.find(t.dtype);
    // As runtime/gradient_buckets.cpp: a new bucket once the open one holds bucket_bytes or more.
    if (it == open.end() || (bucket_bytes > 0.0 && buckets[it->second].bytes() >= bucket_bytes)) {
      buckets.push_back({t.dtype, t.element_size, 0, {}});
      it = open.insert_or_assign(t.dtype, buckets.size() - 1).first;
    }
    GradientBucket& b = buckets[it->second];
    b.numel += t.numel();
    b.parameters.push_back(p);
  }
  return buckets;
}

}  // namespace graphpipe::cost
