#include "cost/gradient_buckets.h"

#include <algorithm>

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

std::vector<BucketSpan> bucket_spans(double backward_start, double backward_end, const std::vector<double>& bytes,
                                     const std::vector<double>& compress_seconds,
                                     const std::vector<double>& comm_seconds) {
  double total = 0.0;
  for (double b : bytes) total += b;
  std::vector<BucketSpan> spans(bytes.size());
  double produced = 0.0, compressed = backward_start, free = backward_start;
  for (std::size_t k = 0; k < bytes.size(); ++k) {
    BucketSpan& span = spans[k];
    produced += bytes[k];
    span.ready = total > 0.0 ? backward_start + (backward_end - backward_start) * produced / total : backward_end;
    span.compress_start = span.compress_end = span.ready;
    if (compress_seconds[k] > 0.0) {
      span.compress_start = std::max(span.ready, compressed);
      span.compress_end = compressed = span.compress_start + compress_seconds[k];
    }
    span.start = std::max(span.compress_end, free);
    span.end = free = span.start + comm_seconds[k];
  }
  return spans;
}

double overlap_loss_seconds(const std::vector<BucketSpan>& spans, double compute_end, double loss) {
  if (loss <= 0.0) return 0.0;
  double beside = 0.0;
  for (const BucketSpan& span : spans) beside += std::max(std::min(span.end, compute_end) - span.start, 0.0);
  return loss * beside;
}

double exposed_sync_seconds(double all_reduce, double backward, const std::vector<double>& sizes, double overlap_loss) {
  double total = 0.0;
  for (double b : sizes) total += b;
  if (total <= 0.0) return all_reduce;
  std::vector<double> shares;
  shares.reserve(sizes.size());
  for (double b : sizes) shares.push_back(all_reduce * b / total);
  const std::vector<BucketSpan> spans =
      bucket_spans(0.0, backward, sizes, std::vector<double>(sizes.size(), 0.0), shares);
  return spans.back().end - backward + overlap_loss_seconds(spans, backward, overlap_loss);
}

}  // namespace graphpipe::cost
