// Precision: the floating-point type a model computes in, as its trace recorded it
// (OpGraph::compute_precision). A model traced under torch.autocast(dtype=torch.bfloat16)
// computes in bfloat16: its activations, and so the tensors a pipeline sends between stages, are
// 2 bytes per element (the trace measured them so), and a GPU runs its matrix products on the
// tensor cores' 16-bit rate (cost::Devices::flops_for). Parameters keep their own dtypes
// (graph::ParamShape): autocast computes in the reduced type from float32 weights.
//
// The names are torch's without "torch.": "float32", "float64", "bfloat16", "float16".
// Parsing is O(1); an unknown name throws GraphError naming the precisions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace graphpipe::graph {

enum class Precision { float32, float64, bfloat16, float16 };

// "float32", "float64", "bfloat16", "float16".
std::string to_string(Precision precision);
std::vector<std::string> precision_names();
// A name from precision_names() ("torch.bfloat16" is read as "bfloat16"); throws GraphError.
Precision parse_precision(std::string_view name);
// Bytes of one element: 4, 8, 2, 2.
int element_size(Precision precision);
// bfloat16 and float16: the 16-bit types a GPU's tensor cores run at their reduced-precision rate.
bool is_half(Precision precision);

}  // namespace graphpipe::graph
