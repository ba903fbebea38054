// power_sgd: what torch's PowerSGD hook does with one gradient tensor, for the sync pricing
// (cost/sync_cost.h). The rule is torch's (torch/distributed/algorithms/ddp_comm_hooks/
// powerSGD_hook.py, powerSGD_hook and _should_compress), restated here because the cost model
// must know it without running the hook:
//
//   - every tensor of a bucket is viewed as a matrix of rows = shape[0] and cols = the rest
//     (tensor.view(shape[0], -1); a 1-D tensor of n entries is n x 1);
//   - its rank is r' = min(rows, cols, rank);
//   - it is compressed when (rows + cols) x r' x min_compression_rate < rows x cols (strictly),
//     torch's default min_compression_rate being 2; a 1-D tensor never is (rows + 1 > rows).
//     Compressed: the replicas all-reduce P (rows x r') and then Q (cols x r'), and the
//     matrix is rebuilt as P Q^T. Not compressed: its entries join the bucket's one all-reduce of
//     uncompressed tensors.
//
// The compression compute of a compressed matrix, in torch's order with warm start: Q is
// orthogonalised, P = M Q, P orthogonalised (after its all-reduce), Q = M^T P, and M = P Q^T
// after Q's all-reduce. The three products take 2 rows cols r' flops each and read or write the
// matrix once; an orthogonalisation of a k x r' matrix takes k r' (2 r' + 1) flops (Gram-Schmidt:
// per column a norm, a division and the projections on the remaining columns; torch uses QR for
// r' > 2, of the same order). Each step is priced as the cost model prices an operator
// (cost_model.h): max(flops / throughput, bytes / memory bandwidth), plus the device's fixed
// overhead per kernel launched (the three products and the orthogonalisations' launches). A
// scalar parameter is a 1 x 1 matrix (never compressed).
#pragma once

#include <cstdint>
#include <vector>

#include "cost/devices.h"

namespace graphpipe::cost {

struct PowerSgdMatrix {
  std::int64_t rows = 0, cols = 0;
  int rank = 0;  // r' = min(rows, cols, rank)
  bool compressed = false;
  std::int64_t numel() const { return rows * cols; }
  std::int64_t p_numel() const { return compressed ? rows * rank : 0; }
  std::int64_t q_numel() const { return compressed ? cols * rank : 0; }
};

PowerSgdMatrix power_sgd_matrix(const std::vector<std::int64_t>& shape, int rank, double min_compression_rate);

// Kernel launches of one orthogonalisation of r' columns: Gram-Schmidt's norm and division per
// column and the product, sum, scaling and subtraction of each projection step (r' <= 2), one
// QR call and its workspace otherwise (torch's _orthogonalize).
int power_sgd_orthogonalize_launches(int rank);

// Seconds one replica spends compressing and rebuilding the matrix (0 when not compressed).
double power_sgd_matrix_seconds(const PowerSgdMatrix& matrix, int element_size, const Devices& devices);

}  // namespace graphpipe::cost
