#include "convnn/bench/reference_attention.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "nn/functional/symint_forms.h"

namespace convnn::bench {
namespace {

void check_similarity(Similarity similarity, const char* where) {
  TORCH_CHECK(similarity == Similarity::Dot || similarity == Similarity::ScaledDot, where,
              ": similarity must be dot or scaled_dot (Algorithm 1's S = Q K^T), got ",
              to_string(similarity));
}

// The library's head folding: the reference paths split heads as the layer does.
using nn::functional::detail::fold_heads;
using nn::functional::detail::unfold_heads;

}  // namespace

AttentionWeights attention_weights(const nn::ConvNNAttentionImpl& module) {
  const auto& o = module.options;
  TORCH_CHECK(!o.qkv_bias() && !o.out_bias() && !o.bias(),
              "attention_weights: the reference paths are bias-free; build ConvNNAttention with "
              "qkv_bias, out_bias and bias off");
  TORCH_CHECK(!o.kernel_per_head(), "attention_weights: the reference paths share one kernel across heads");
  return {module.query_projection->weight, module.key_projection->weight,
          module.value_projection->weight, module.output_projection->weight, module.kernel};
}

at::Tensor reference_conv_nn(const at::Tensor& queries, const at::Tensor& keys,
                             const at::Tensor& values, const at::Tensor& kernel, int64_t k,
                             Similarity similarity) {
  check_similarity(similarity, "reference_conv_nn");
  TORCH_CHECK(queries.dim() == 3 && keys.dim() == 3 && values.dim() == 3,
              "reference_conv_nn: queries, keys and values must be 3-D [G,N,d], [G,M,d], [G,M,C]");
  TORCH_CHECK(kernel.dim() == 2 || kernel.dim() == 3,
              "reference_conv_nn: kernel must be [C,K] (depthwise) or [C',C,K] (standard), got ",
              kernel.sizes());
  const int64_t g = queries.size(0), n = queries.size(1), m = keys.size(1), c = values.size(2);
  TORCH_CHECK(k >= 1 && k <= m, "reference_conv_nn: k must be in [1, M = ", m, "], got ", k);

  // Step 1: similarity.
  auto scores = at::matmul(queries, keys.transpose(-2, -1));  // [G,N,M]
  if (similarity == Similarity::ScaledDot) {
    scores = scores / std::sqrt(static_cast<double>(queries.size(2)));
  }
  // Step 2: selection (descending, the library's score slot order) and modulation.
  auto [top, indices] = at::topk(scores, k, /*dim=*/-1);  // [G,N,K]
  const auto weights = at::softmax(top, -1);
  // Gather V[I_i, :] through expanded views, as the listing does.
  const auto v_exp = values.permute({0, 2, 1}).unsqueeze(-1).expand({g, c, m, k});  // [G,C,M,K]
  const auto i_exp = indices.unsqueeze(1).expand({g, c, n, k});                     // [G,C,N,K]
  const auto v_nn = at::gather(v_exp, 2, i_exp);                                     // [G,C,N,K]
  const auto x_nn = weights.unsqueeze(1).expand({g, c, n, k}) * v_nn;
  // Step 3: Conv1d with kernel K, stride K over the concatenated neighbourhoods. The listing
  // permutes [G,C,N,K] to [G,C,K,N] before this reshape; that would put the K slots of one window
  // on K different queries, so the neighbourhoods are concatenated as the text defines them.
  const auto flat = x_nn.reshape({g, c, n * k});
  const bool depthwise = kernel.dim() == 2;
  const auto weight = depthwise ? kernel.unsqueeze(1) : kernel;  // [C,1,K] or [C',C,K]
  const int64_t stride[] = {k}, padding[] = {0}, dilation[] = {1};
  const auto y = at::conv1d(flat, weight, /*bias=*/c10::nullopt, stride, padding, dilation,
                            /*groups=*/depthwise ? c : 1);  // [G,C',N]
  return y.permute({0, 2, 1});
}

at::Tensor reference_attention(const at::Tensor& input, const AttentionWeights& w, int64_t heads,
                               int64_t k, Similarity similarity) {
  TORCH_CHECK(input.dim() == 3, "reference_attention: input must be [B,N,C], got ", input.sizes());
  const auto q = fold_heads(at::linear(input, w.query), heads);
  const auto kk = fold_heads(at::linear(input, w.key), heads);
  const auto v = fold_heads(at::linear(input, w.value), heads);
  const auto y = reference_conv_nn(q, kk, v, w.kernel, k, similarity);
  return at::linear(unfold_heads(y, heads), w.output);
}

at::Tensor mhsa_attention(const at::Tensor& input, const AttentionWeights& w, int64_t heads,
                          Similarity similarity) {
  check_similarity(similarity, "mhsa_attention");
  TORCH_CHECK(input.dim() == 3, "mhsa_attention: input must be [B,N,C], got ", input.sizes());
  const auto b = input.size(0), n = input.size(1), c = input.size(2), d = c / heads;
  const auto split = [&](const at::Tensor& x) { return x.view({b, n, heads, d}).transpose(1, 2); };
  const auto q = split(at::linear(input, w.query));
  const auto kk = split(at::linear(input, w.key));
  const auto v = split(at::linear(input, w.value));
  const c10::optional<double> scale =
      similarity == Similarity::Dot ? c10::optional<double>(1.0) : c10::nullopt;
  const auto y = at::scaled_dot_product_attention(q, kk, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                  /*is_causal=*/false, scale);  // [B,H,N,d]
  return at::linear(y.transpose(1, 2).reshape({b, n, c}), w.output);
}

}  // namespace convnn::bench
