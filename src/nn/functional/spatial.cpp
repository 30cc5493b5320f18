#include "nn/functional/spatial.h"

#include <ATen/ATen.h>

#include <string>

#include "convnn/nn/functional/convnn.h"
#include "nn/functional/symint_forms.h"
#include "ops/checks.h"

namespace convnn::nn::functional::detail {

std::string spatial_function_name(int64_t spatial_dims) { return "conv_nn" + std::to_string(spatial_dims) + "d"; }

std::string spatial_layer_name(int64_t spatial_dims) { return "ConvNN" + std::to_string(spatial_dims) + "d"; }

const char* spatial_layout(int64_t spatial_dims, bool batched) {
  TORCH_INTERNAL_ASSERT(spatial_dims >= 1 && spatial_dims <= 3, "spatial_layout: ", spatial_dims, " dimensions");
  static const char* const layouts[2][3] = {{"[C,L]", "[C,H,W]", "[C,D,H,W]"}, {"[B,C,L]", "[B,C,H,W]", "[B,C,D,H,W]"}};
  return layouts[batched ? 1 : 0][spatial_dims - 1];
}

at::Tensor conv_nn_spatial(const at::Tensor& input, const at::Tensor& kernel,
                           const at::Tensor& bias, const ConvNNFuncOptions& options,
                           int64_t spatial_dims, const Projections& projections) {
  const auto op = spatial_function_name(spatial_dims);
  TORCH_CHECK(input.defined() && input.dim() == spatial_dims + 2, op, ": input must be ",
              spatial_dims + 2, "-D ", spatial_layout(spatial_dims), ", got ",
              input.defined() ? checks::shape_string(input) : "undefined");
  const int64_t pad = options.padding();
  TORCH_CHECK(pad >= 0, op, ": padding must be non-negative, got ", pad);
  TORCH_CHECK(options.alpha() == 1.0 || options.coordinates(), op, ": alpha = ", options.alpha(),
              " blends in positional similarity, which needs coordinates(true)");

  const auto padded = pad > 0 ? at::constant_pad_nd(input, std::vector<int64_t>(2 * spatial_dims, pad))
                              : input;
  // Symbolic sizes throughout (see convnn.cpp): H and W stay dynamic under torch.export.
  const auto grid = padded.sym_sizes().slice(2).vec();
  const auto tokens = padded.flatten(2).transpose(1, 2);  // [B, prod(grid), C]
  const auto apply = [&](const auto& f) { return f ? f(tokens) : tokens; };
  const auto coordinates =
      options.coordinates() ? grid_coordinates_symint(grid, tokens.options()) : at::Tensor();

  auto token_options = options;
  token_options.padding(0);
  const auto out = conv_nn(apply(projections.query), apply(projections.key),
                           apply(projections.value), kernel, bias, token_options, coordinates);

  auto y = out.transpose(1, 2).unflatten_symint(2, grid);
  for (int64_t d = 0; d < spatial_dims && pad > 0; ++d) {
    y = y.narrow_symint(2 + d, pad, grid[d] - 2 * pad);
  }
  return y.contiguous();
}

void check_spatial_candidates(c10::IntArrayRef sizes, const ConvNNFuncOptions& options,
                              std::string_view where) {
  int64_t m = 1;
  std::string map;
  for (const int64_t size : sizes) {
    TORCH_CHECK(size >= 1, where, ": every spatial size must be at least 1, got ", sizes);
    m *= size + 2 * options.padding();
    map += (map.empty() ? "" : "x") + std::to_string(size);
  }
  check_candidates(options, m, std::string(where) + " (on a " + map + " map with padding " +
                                    std::to_string(options.padding()) + ")");
}

}  // namespace convnn::nn::functional::detail
