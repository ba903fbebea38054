#include "cost/sync_load.h"

#include "cost/sync_kind.h"

namespace graphpipe::cost {

SyncLoad& SyncLoad::operator+=(const SyncLoad& o) {
  numel += o.numel;
  bytes += o.bytes;
  tensors += o.tensors;
  uncompressed_numel += o.uncompressed_numel;
  uncompressed_tensors += o.uncompressed_tensors;
  p_numel += o.p_numel;
  q_numel += o.q_numel;
  compress_seconds += o.compress_seconds;
  return *this;
}

SyncLoad SyncLoad::scaled(double f) const {
  SyncLoad s = *this;
  s.numel *= f;
  s.bytes *= f;
  s.tensors *= f;
  s.uncompressed_numel *= f;
  s.uncompressed_tensors *= f;
  s.p_numel *= f;
  s.q_numel *= f;
  s.compress_seconds *= f;
  return s;
}

SyncLoad tensor_load(const SyncMethod& method, const graph::ParamShape& tensor, const Devices& devices) {
  SyncLoad load;
  if (!tensor.requires_grad) return load;
  load.numel = static_cast<double>(tensor.numel());
  load.bytes = static_cast<double>(tensor.bytes());
  load.tensors = 1.0;
  sync_kind_model(method.kind).add_tensor_load(method, tensor, devices, load);
  return load;
}

SyncLoad flat_load(double bytes) {
  SyncLoad load;
  if (bytes <= 0.0) return load;
  load.numel = bytes / 4.0;
  load.bytes = bytes;
  load.tensors = 1.0;
  load.uncompressed_numel = load.numel;
  load.uncompressed_tensors = 1.0;
  return load;
}

}  // namespace graphpipe::cost
