#pragma once
// The ConvNN operator as functions: on token sequences (the core every layer uses) and on 1-D and
// 2-D spatial maps with identity projections. Semantics: docs/operator.md.
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include "convnn/nn/options/convnn.h"

namespace convnn::nn::functional {

/// ConvNN over tokens. queries [B,N,H*dq], keys [B,M,Hkv*dq], values [B,M,Hkv*dv], with H = heads and
/// Hkv = kv_heads (= H unless set; fewer is grouped-query attention, query head h reading key/value
/// head h / (H / Hkv)).
/// kernel: depthwise [dv,K] (shared across heads) or [H,dv,K] (kernel_per_head); standard
/// [dv',dv,K] or [H,dv',dv,K]. bias: undefined, [dv'] or [H,dv'].
/// coordinates: undefined or [N,P] positional coordinates (requires N == M), blended by alpha.
/// Returns [B,N,H*dv'].
at::Tensor conv_nn(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                   const at::Tensor& kernel, const at::Tensor& bias,
                   const ConvNNFuncOptions& options, const at::Tensor& coordinates = {});

/// ConvNN on [B,C,L] with identity projections (Q = K = V = input), padding and coordinates from
/// the options. Returns [B,C',L].
at::Tensor conv_nn1d(const at::Tensor& input, const at::Tensor& kernel, const at::Tensor& bias,
                     const ConvNNFuncOptions& options);
/// ConvNN on [B,C,H,W] with identity projections. Returns [B,C',H,W].
at::Tensor conv_nn2d(const at::Tensor& input, const at::Tensor& kernel, const at::Tensor& bias,
                     const ConvNNFuncOptions& options);
/// ConvNN on [B,C,D,H,W] with identity projections. Returns [B,C',D,H,W].
at::Tensor conv_nn3d(const at::Tensor& input, const at::Tensor& kernel, const at::Tensor& bias,
                     const ConvNNFuncOptions& options);

/// rho applied to the selected scores [..,K]; -inf (masked) slots weigh exactly 0, and a row with
/// no valid slot weighs 0 everywhere.
at::Tensor rho_weights(const at::Tensor& scores, Rho rho, double temperature = 1.0);

/// Normalised coordinates of a grid, row-major: [prod(sizes), sizes.size()], with the same step
/// 1/(max(sizes)-1) on every axis so that distances are isotropic.
at::Tensor grid_coordinates(c10::IntArrayRef sizes, const at::TensorOptions& options);

/// r of m candidates drawn uniformly without replacement, ascending, int64 on `device`.
at::Tensor draw_candidates(int64_t m, int64_t r, c10::optional<at::Generator> generator,
                           const at::Device& device);

// Masks, bool [N,N], true = may be selected (as in scaled_dot_product_attention).
/// j <= i.
at::Tensor causal_mask(int64_t n, const at::Device& device = at::kCPU);
/// BigBird: |i-j| <= window, the first num_global tokens see and are seen by all, and each row
/// gets num_random extra random columns from the generator.
at::Tensor bigbird_mask(int64_t n, int64_t window, int64_t num_global, int64_t num_random,
                        c10::optional<at::Generator> generator = c10::nullopt,
                        const at::Device& device = at::kCPU);
/// Sparse Transformer strided pattern: |i-j| < stride or (i-j) divisible by stride; with causal,
/// only j <= i.
at::Tensor strided_mask(int64_t n, int64_t stride, bool causal = true,
                        const at::Device& device = at::kCPU);

}  // namespace convnn::nn::functional
