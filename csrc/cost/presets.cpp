#include "cost/presets.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/names.h"

namespace graphpipe::cost {

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

void check_count(int count) {
  if (count < 1) {
    throw PlanningError("a device description needs at least 1 device, asked for " + std::to_string(count));
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// FLOP/s of a blocked single-precision matrix product small enough to stay in cache: the best of
// a few repeats, so a busy machine does not make the rank look slower than it is.
double measure_flops() {
  constexpr int n = 96;
  constexpr std::size_t cells = static_cast<std::size_t>(n) * n;
  std::vector<float> a(cells, 1.0f), b(cells, 0.5f), c(cells, 0.0f);
  double best = 0.0;
  for (int repeat = 0; repeat < 5; ++repeat) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < n; ++k) {
        float aik = a[i * n + k];
        for (int j = 0; j < n; ++j) c[i * n + j] += aik * b[k * n + j];
      }
    }
    double t = seconds_since(start);
    if (t > 0) best = std::max(best, 2.0 * n * n * n / t);
  }
  volatile float sink = c[n + 1];
  (void)sink;
  return best;
}

// Bytes per second of a copy larger than the caches (read + write counted).
double measure_bandwidth() {
  const std::size_t bytes = 32u << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 0.0;
  for (int repeat = 0; repeat < 3; ++repeat) {
    auto start = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    double t = seconds_since(start);
    if (t > 0) best = std::max(best, 2.0 * static_cast<double>(bytes) / t);
  }
  volatile char sink = dst[bytes / 2];
  (void)sink;
  return best;
}

}  // namespace

namespace {

// A GPU's compute rates, sustained dense FLOP/s: float32, bfloat16 and float16 (0: none of its own).
struct Rates {
  double float32;
  double bfloat16;
  double float16;
};

// A GPU preset: per-device figures plus NVLink-class links inside a node, slower ones across.
Devices gpu(const char* name, int count, int per_node, double memory, Rates rates, double bandwidth, double overhead,
            double intra_bw, double intra_lat, double inter_bw, double inter_lat) {
  check_count(count);
  Devices d;
  d.name = name;
  d.count = count;
  d.memory_bytes = memory;
  d.flops_per_second = rates.float32;
  d.bfloat16_flops_per_second = rates.bfloat16;
  d.float16_flops_per_second = rates.float16;
  d.memory_bandwidth = bandwidth;
  d.op_overhead_seconds = overhead;
  set_node_links(d, per_node, intra_bw, intra_lat, inter_bw, inter_lat);
  d.validate();
  return d;
}

}  // namespace

// Half of each datasheet peak (dense, no sparsity; presets.h): A100-SXM4 19.5 TFLOP/s float32
// (TF32's 156 is off in PyTorch's matrix products by default), 312 bfloat16 and float16;
// V100-SXM2 125 float16 tensor-core (no bfloat16 tensor cores); H100-SXM 989 bfloat16 and
// float16. V100 and H100 keep their former single rate, the tensor-core one, for float32 too
// (presets.h says why).
Devices v100(int count, int per_node) {
  return gpu("v100", count, per_node, 16 * GiB, {62.5e12, 0.0, 62.5e12}, 900e9, 10e-6, 50e9, 5e-6, 12.5e9, 10e-6);
}

Devices a100(int count, int per_node) {
  return gpu("a100", count, per_node, 80 * GiB, {9.75e12, 156e12, 156e12}, 2.039e12, 5e-6, 300e9, 3e-6, 25e9, 8e-6);
}

Devices h100(int count, int per_node) {
  return gpu("h100", count, per_node, 80 * GiB, {495e12, 495e12, 495e12}, 3.35e12, 5e-6, 450e9, 3e-6, 50e9, 8e-6);
}

Devices cpu_rank(int count, bool measure, int per_node) {
  check_count(count);
  Devices d;
  d.name = measure ? "cpu (measured)" : "cpu";
  d.count = count;
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGE_SIZE);
  double physical = pages > 0 && page_size > 0 ? static_cast<double>(pages) * page_size : 8 * GiB;
  d.memory_bytes = physical / count;
  d.flops_per_second = 20e9;
  d.memory_bandwidth = 5e9;
  if (measure) {
    double flops = measure_flops();
    double bandwidth = measure_bandwidth();
    // A failed or absurd measurement (a timer of zero resolution) keeps the constants.
    if (flops > 1e8) d.flops_per_second = flops;
    if (bandwidth > 1e8) d.memory_bandwidth = bandwidth;
    log::debug("cpu_rank calibration: " + std::to_string(d.flops_per_second) + " FLOP/s, " +
               std::to_string(d.memory_bandwidth) + " B/s");
  }
  d.op_overhead_seconds = 20e-6;
  // Loopback TCP inside a host; 10 GbE between hosts.
  set_node_links(d, per_node > 0 ? per_node : count, 1e9, 50e-6, 1.25e9, 100e-6);
  d.validate();
  return d;
}

std::vector<std::string> preset_names() { return {"cpu", "v100", "a100", "h100"}; }

Devices preset(const std::string& name, int count, int per_node) {
  if (name == "v100") return per_node > 0 ? v100(count, per_node) : v100(count);
  if (name == "a100") return per_node > 0 ? a100(count, per_node) : a100(count);
  if (name == "h100") return per_node > 0 ? h100(count, per_node) : h100(count);
  if (name == "cpu") return cpu_rank(count, true, per_node);
  throw PlanningError("unknown device preset '" + name + "': the presets are " + list_names(preset_names()));
}

}  // namespace graphpipe::cost
