#include "cost/power_sgd.h"

#include <algorithm>

namespace graphpipe::cost {

PowerSgdMatrix power_sgd_matrix(const std::vector<std::int64_t>& shape, int rank, double min_compression_rate) {
  PowerSgdMatrix m;
  m.rows = shape.empty() ? 1 : shape[0];
  m.cols = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) m.cols *= shape[i];
  m.rank = static_cast<int>(std::min<std::int64_t>({m.rows, m.cols, static_cast<std::int64_t>(rank)}));
  // torch's _should_compress: compressed_size * min_compression_rate < uncompressed_size.
  const double uncompressed = static_cast<double>(m.rows) * static_cast<double>(m.cols);
  const double compressed = static_cast<double>(m.rows + m.cols) * m.rank;
  m.compressed = m.rank > 0 && compressed * min_compression_rate < uncompressed;
  return m;
}

int power_sgd_orthogonalize_launches(int rank) { return rank <= 2 ? std::max(2, 6 * rank - 4) : 2; }

double power_sgd_matrix_seconds(const PowerSgdMatrix& m, int element_size, const Devices& devices) {
  if (!m.compressed) return 0.0;
  const auto rows = static_cast<double>(m.rows), cols = static_cast<double>(m.cols);
  const auto r = static_cast<double>(m.rank), e = static_cast<double>(element_size);
  auto step = [&](double flops, double bytes) {
    const double compute = devices.flops_per_second > 0.0 ? flops / devices.flops_per_second : 0.0;
    const double memory = devices.memory_bandwidth > 0.0 ? bytes / devices.memory_bandwidth : 0.0;
    return std::max(compute, memory);
  };
  // The three products: each reads or writes the matrix and the two thin factors.
  const double product = step(2.0 * rows * cols * r, (rows * cols + rows * r + cols * r) * e);
  // Orthogonalising Q (cols x r') and P (rows x r'): read and written in place.
  const double orthogonalize_q = step(cols * r * (2.0 * r + 1.0), 2.0 * cols * r * e);
  const double orthogonalize_p = step(rows * r * (2.0 * r + 1.0), 2.0 * rows * r * e);
  const int launches = 3 + 2 * power_sgd_orthogonalize_launches(m.rank);
  return 3.0 * product + orthogonalize_q + orthogonalize_p + launches * devices.op_overhead_seconds;
}

}  // namespace graphpipe::cost
