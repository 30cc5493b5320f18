#pragma once
// Shared by the spatial functionals and the ConvNN1d/2d modules: pad, flatten to tokens, project,
// run the token form with grid coordinates, reshape back and crop.
#include <ATen/core/Tensor.h>

#include <functional>

#include "convnn/nn/options/convnn.h"

namespace convnn::nn::functional::detail {

// Empty functions mean identity (Q = K = V = the padded input's tokens).
struct Projections {
  std::function<at::Tensor(const at::Tensor&)> query, key, value;
};

at::Tensor conv_nn_spatial(const at::Tensor& input, const at::Tensor& kernel,
                           const at::Tensor& bias, const ConvNNFuncOptions& options,
                           int64_t spatial_dims, const Projections& projections);

}  // namespace convnn::nn::functional::detail
