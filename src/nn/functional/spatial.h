#pragma once
// Shared by the spatial functionals and the ConvNN1d/2d/3d modules: pad, flatten to tokens, project,
// run the token form with grid coordinates, reshape back and crop.
#include <ATen/core/Tensor.h>

#include <c10/core/SymInt.h>
#include <c10/util/ArrayRef.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "convnn/nn/options/convnn.h"

namespace convnn::nn::functional::detail {

// Empty functions mean identity (Q = K = V = the padded input's tokens).
struct Projections {
  std::function<at::Tensor(const at::Tensor&)> query, key, value;
};

// The spatial forms' names and layouts: "conv_nn2d", "ConvNN2d", "[B,C,H,W]" ([C,H,W] unbatched).
std::string spatial_function_name(int64_t spatial_dims);
std::string spatial_layer_name(int64_t spatial_dims);
const char* spatial_layout(int64_t spatial_dims, bool batched = true);

// What a forward selected, when its caller asks (a non-null Selection*): [B*heads, queries, K]
// each, detached. indices are token indices: the keys' rows (random candidates mapped back to
// their tokens); for a spatial form, row-major flat indices in the padded grid, and the rows are
// the output positions in row-major order. The default forward keeps nothing.
struct Selection {
  at::Tensor indices, scores, weights;
};

// Row-major flat indices [...] in a grid of `sizes` -> coordinates [..., D].
at::Tensor unravel(const at::Tensor& flat, const std::vector<int64_t>& sizes);

// conv_nn with the queries' coordinates [N,P] apart from the keys' [M,P] (a spatial form whose
// queries are a subset of its tokens: stride); conv_nn is this with the same coordinates for both.
at::Tensor conv_nn_with_query_coordinates(const at::Tensor& queries, const at::Tensor& keys,
                                          const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& bias,
                                          const ConvNNFuncOptions& options, const at::Tensor& query_coordinates,
                                          const at::Tensor& key_coordinates, Selection* selection = nullptr);

// conv_nn on keys and values already folded per key/value head, [B*kv_heads,M,d] and
// [B*kv_heads,M,dv] (slices of a head-major key/value cache, read in place), against queries
// [B,N,H*d]; no random candidates and no coordinates. Returns [B,N,H*dv'].
at::Tensor conv_nn_folded_kv(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                             const at::Tensor& kernel, const at::Tensor& bias, const ConvNNFuncOptions& options);

// stride or dilation for `spatial_dims` axes: one value for every axis or one per axis, each at
// least 1; `where` leads the message.
std::vector<int64_t> per_axis(const std::vector<int64_t>& values, int64_t spatial_dims, std::string_view where,
                              const char* name);

at::Tensor conv_nn_spatial(const at::Tensor& input, const at::Tensor& kernel,
                           const at::Tensor& bias, const ConvNNFuncOptions& options,
                           int64_t spatial_dims, const Projections& projections, Selection* selection = nullptr);

// The candidate rule of every ConvNN form, in one place: 0 <= num_candidates <= m and
// 1 <= k <= the candidates each query ranks (num_candidates, or all m). `where` leads the message.
// m is a SymInt: under torch.compile / torch.export the token count is symbolic.
void check_candidates(const ConvNNFuncOptions& options, const c10::SymInt& m, std::string_view where);

// The same rule for a spatial input of these sizes before padding: m is the padded grid's size.
// Lets a model check every layer when it is built, before any data flows.
void check_spatial_candidates(c10::IntArrayRef sizes, const ConvNNFuncOptions& options,
                              std::string_view where);

}  // namespace convnn::nn::functional::detail
