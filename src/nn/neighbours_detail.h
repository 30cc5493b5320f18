#pragma once
// Neighbours (convnn/nn/neighbours.h) from a forward's selection (src/nn/functional/spatial.h).
#include <vector>

#include "convnn/nn/neighbours.h"
#include "nn/functional/spatial.h"

namespace convnn::nn::detail {

// A spatial layer's: the selection's rows are its output positions, its indices flat in the padded
// grid; [B*heads, Q, K] -> [B, heads, Q, K] with the grid.
Neighbours spatial_neighbours(const functional::detail::Selection& selection, int64_t heads,
                              const std::vector<int64_t>& input_sizes, int64_t padding,
                              const std::vector<int64_t>& stride, const std::vector<int64_t>& dilation, int64_t k);

// An attention layer's: [B*heads, N, K] -> [B, heads, N, K].
Neighbours token_neighbours(const functional::detail::Selection& selection, int64_t heads, int64_t k);

// For an input without a batch dimension: the neighbours of its batch of one, without it.
void drop_batch_dimension(Neighbours& neighbours);

}  // namespace convnn::nn::detail
