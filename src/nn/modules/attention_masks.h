#pragma once
// ConvNNAttention's masks of one call, checked and merged into the one mask the op takes.
//
// Conventions (docs/sequences.md): attn_mask as scaled_dot_product_attention's
// (bool: true = may be selected; float: added to the scores), key_padding_mask as
// torch.nn.MultiheadAttention's (bool: true = a padding key that no query selects; float: added).
// The two tools disagree on what a bool `true` means; each argument keeps the meaning its users
// already know from the tool that defines it.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/SymInt.h>

#include "convnn/nn/options/convnn.h"

namespace convnn::nn::detail {

struct AttentionMasks {
  at::Tensor fixed;             // the options' [N,N] mask (C++ ConvNNAttentionOptions::mask)
  at::Tensor attn_mask;         // the call's: [N,N], [B,N,N] or [B,H,N,N]; B and H may be 1 (broadcast)
  at::Tensor key_padding_mask;  // the call's: [B,N]
};

// The op's mask for a batch of `batch` samples of `n` tokens: [N,N] when it is the same for every
// sample and head (no key padding, no per-sample attn_mask), else [B*H,N,N] in the op's slice order
// (sample-major, as fold_heads); undefined when there is no mask and the layer is not causal.
// Bool pieces combine by `and`, float pieces by addition; a bool piece beside a float one masks
// with -inf. Each argument is checked against its rule, and an error names it.
at::Tensor merged_attention_mask(const ConvNNAttentionOptions& options, const AttentionMasks& masks,
                                 const c10::SymInt& batch, const c10::SymInt& n, const at::Device& device);

}  // namespace convnn::nn::detail
