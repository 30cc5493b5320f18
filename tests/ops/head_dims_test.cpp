// knn_attention with heads as a dimension (src/ops/op_signatures.h, "Heads as a dimension of their
// own"): [B,H,N,D] queries, keys and values (here the head-split views of one [B,N,3*H*D]
// projection, as a layer makes them) give exactly what the [B*H,N,D] folded call gives, on the fused
// CPU path, the generic path, through autograd and on meta tensors, in the documented layouts; bad
// layouts are refused by name.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "convnn/ops/knn_ops.h"
#include "ops/generic/generic.h"
#include "support/error_message.h"
#include "support/gradcheck.h"

namespace head_dims_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)
namespace {

using Attention = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

struct Geometry {
  int64_t b, h, n, d;
};

// One [B,N,3*H*D] projection split into [B,H,N,D] query, key and value views (strided: the heads sit
// inside the token rows), and the same three folded to contiguous [B*H,N,D].
struct Projection {
  at::Tensor qkv, queries, keys, values;

  Projection(const Geometry& g, at::ScalarType dtype, bool grad = false) {
    qkv = torch::randn({g.b, g.n, 3 * g.h * g.d}, torch::TensorOptions().dtype(dtype)).requires_grad_(grad);
    auto parts = qkv.split(g.h * g.d, -1);
    queries = by_head(parts[0], g.h);
    keys = by_head(parts[1], g.h);
    values = by_head(parts[2], g.h);
  }
  static at::Tensor by_head(const at::Tensor& x, int64_t heads) { return x.unflatten(2, {heads, -1}).transpose(1, 2); }
};

at::Tensor folded(const at::Tensor& t) { return t.flatten(0, 1).contiguous(); }

using AttentionCall = Attention (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const c10::optional<at::Tensor>&, int64_t, const std::string&,
                                    const c10::optional<at::Tensor>&, bool, const std::string&, double);

Attention dispatched(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kernel,
                     const c10::optional<at::Tensor>& bias, int64_t slots, const std::string& similarity,
                     const c10::optional<at::Tensor>& mask, bool index_order, const std::string& rho, double t) {
  return convnn::ops::knn_attention(q, k, v, kernel, bias, slots, similarity, mask, index_order, rho, t);
}

Attention generic(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kernel,
                  const c10::optional<at::Tensor>& bias, int64_t slots, const std::string& similarity,
                  const c10::optional<at::Tensor>& mask, bool index_order, const std::string& rho, double t) {
  return convnn::ops::generic::knn_attention(q, k, v, kernel, bias, slots, similarity, mask, index_order, rho, t);
}

// The [B,H,N,C] output is stored as [B,N,H,C]: its [B,N,H*C] form is a view.
void expect_heads_inside_tokens(const at::Tensor& output) {
  EXPECT_TRUE(output.transpose(1, 2).is_contiguous()) << output.strides();
  EXPECT_EQ(output.transpose(1, 2).flatten(2).data_ptr(), output.data_ptr());
}

TEST(HeadDims, ForwardIsTheFoldedCallBitForBitOnTheFusedAndGenericPaths) {
  torch::manual_seed(0);
  const Geometry g{2, 3, 9, 4};
  for (const auto dtype : {at::kDouble, at::kFloat}) {
    const Projection p(g, dtype);
    const auto kernel = torch::randn({g.d, 4}, p.qkv.options());
    const auto causal = torch::ones({g.n, g.n}, torch::kBool).tril();
    // Additive, 0 or -inf (the rule for distances), a different pattern per slice.
    const auto per_slice = torch::zeros({g.b, g.h, g.n, g.n}, p.qkv.options()).masked_fill(
        torch::rand({g.b, g.h, g.n, g.n}) < 0.3, -std::numeric_limits<double>::infinity());
    for (const auto& mask : {c10::optional<at::Tensor>(), c10::optional<at::Tensor>(causal),
                             c10::optional<at::Tensor>(per_slice)}) {
      const auto folded_mask = mask && mask->dim() == 4 ? c10::optional<at::Tensor>(folded(*mask)) : mask;
      for (const AttentionCall call : {&dispatched, &generic}) {
        for (const char* similarity : {"scaled_dot", "l1", "cosine"}) {
          const auto [out, scores, indices, weights] =
              call(p.queries, p.keys, p.values, kernel, c10::nullopt, 4, similarity, mask, false, "softmax", 0.5);
          const auto [out3, scores3, indices3, weights3] =
              call(folded(p.queries), folded(p.keys), folded(p.values), kernel, c10::nullopt, 4, similarity,
                   folded_mask, false, "softmax", 0.5);
          SCOPED_TRACE(std::string(similarity) + " " + c10::toString(dtype));
          EXPECT_TRUE(torch::equal(indices, indices3.unflatten(0, {g.b, g.h})));
          EXPECT_TRUE(torch::equal(scores.nan_to_num(), scores3.unflatten(0, {g.b, g.h}).nan_to_num()));
          EXPECT_TRUE(torch::equal(weights, weights3.unflatten(0, {g.b, g.h})));
          EXPECT_TRUE(torch::equal(out, out3.unflatten(0, {g.b, g.h})));
          EXPECT_TRUE(scores.is_contiguous() && indices.is_contiguous() && weights.is_contiguous());
          expect_heads_inside_tokens(out);
        }
      }
    }
  }
}

TEST(HeadDims, APerSampleMaskBroadcastsOverTheHeadsAsScaledDotProductAttentionsDoes) {
  // [B,1,N,M] serves each of the sample's heads: the [B,H,N,M] mask it broadcasts to, bit for bit.
  torch::manual_seed(3);
  const Geometry g{2, 3, 9, 4};
  const Projection p(g, at::kFloat);
  const auto kernel = torch::randn({g.d, 4});
  const auto per_sample = torch::rand({g.b, 1, g.n, g.n}) < 0.6;
  const auto every_head = per_sample.expand({g.b, g.h, g.n, g.n});
  for (const AttentionCall call : {&dispatched, &generic}) {
    const auto got = call(p.queries, p.keys, p.values, kernel, c10::nullopt, 4, "dot", per_sample, false, "softmax", 1.0);
    const auto want = call(p.queries, p.keys, p.values, kernel, c10::nullopt, 4, "dot", every_head, false, "softmax", 1.0);
    EXPECT_TRUE(torch::equal(std::get<0>(got), std::get<0>(want)));
    EXPECT_TRUE(torch::equal(std::get<2>(got), std::get<2>(want)));
    EXPECT_TRUE(torch::equal(std::get<3>(got), std::get<3>(want)));
  }
}

TEST(HeadDims, AMaskOfOneSampleBroadcastsOverTheBatchAsScaledDotProductAttentionsDoes) {
  // [1,1,N,M] is the shared [N,M] and [1,H,N,M] serves head h of every sample: each gives the
  // [B,H,N,M] mask it broadcasts to, bit for bit.
  torch::manual_seed(4);
  const Geometry g{2, 3, 9, 4};
  const Projection p(g, at::kFloat);
  const auto kernel = torch::randn({g.d, 4});
  for (const auto& mask : {torch::rand({1, 1, g.n, g.n}) < 0.6, torch::rand({1, g.h, g.n, g.n}) < 0.6}) {
    const auto every_head = mask.expand({g.b, g.h, g.n, g.n});
    for (const AttentionCall call : {&dispatched, &generic}) {
      const auto got = call(p.queries, p.keys, p.values, kernel, c10::nullopt, 4, "dot", mask, false, "softmax", 1.0);
      const auto want =
          call(p.queries, p.keys, p.values, kernel, c10::nullopt, 4, "dot", every_head, false, "softmax", 1.0);
      EXPECT_TRUE(torch::equal(std::get<0>(got), std::get<0>(want))) << mask.sizes();
      EXPECT_TRUE(torch::equal(std::get<2>(got), std::get<2>(want))) << mask.sizes();
      EXPECT_TRUE(torch::equal(std::get<3>(got), std::get<3>(want))) << mask.sizes();
    }
  }
}

TEST(HeadDims, GradientsAreTheFoldedCallsAndPassFiniteDifferences) {
  torch::manual_seed(1);
  const Geometry g{2, 2, 6, 3};
  const auto kernel = torch::randn({g.d, 3}, torch::kDouble).requires_grad_(true);
  const auto bias = torch::randn({g.d}, torch::kDouble).requires_grad_(true);
  const auto run = [&](const Projection& p, bool fold) {
    const auto at = [&](const at::Tensor& t) { return fold ? folded(t) : t; };
    auto out = std::get<0>(convnn::ops::knn_attention(at(p.queries), at(p.keys), at(p.values), kernel, bias, 3,
                                                      "scaled_dot", c10::nullopt, false, "softmax", 0.8));
    return fold ? out.unflatten(0, {g.b, g.h}) : out;
  };
  const Projection by_head(g, at::kDouble, /*grad=*/true), by_slice = [&] {
    Projection p = by_head;
    p.qkv = by_head.qkv.detach().clone().requires_grad_(true);
    auto parts = p.qkv.split(g.h * g.d, -1);
    p.queries = Projection::by_head(parts[0], g.h);
    p.keys = Projection::by_head(parts[1], g.h);
    p.values = Projection::by_head(parts[2], g.h);
    return p;
  }();
  const auto direction = torch::randn({g.b, g.h, g.n, g.d}, torch::kDouble);
  const auto grads = [&](const at::Tensor& out, const at::Tensor& qkv) {
    return torch::autograd::grad({(out * direction).sum()}, {qkv, kernel, bias});
  };
  const auto four = grads(run(by_head, false), by_head.qkv), three = grads(run(by_slice, true), by_slice.qkv);
  for (size_t i = 0; i < four.size(); ++i) EXPECT_TRUE(torch::equal(four[i], three[i])) << i;

  EXPECT_TRUE(convnn::testing::GradCheck(
      [&](const std::vector<at::Tensor>& x) {
        auto parts = x[0].split(g.h * g.d, -1);
        return std::get<0>(convnn::ops::knn_attention(
            Projection::by_head(parts[0], g.h), Projection::by_head(parts[1], g.h),
            Projection::by_head(parts[2], g.h), x[1], x[2], 3, "scaled_dot", c10::nullopt, false, "softmax", 0.8));
      },
      {by_head.qkv, kernel, bias}));
}

TEST(HeadDims, MetaOutputsHaveTheRealShapesAndStridesEvenWithSingletonDims) {
  for (const Geometry g : {Geometry{2, 3, 5, 4}, Geometry{2, 1, 5, 4}, Geometry{1, 3, 1, 4}, Geometry{2, 3, 4, 1}}) {
    const Projection real(g, at::kFloat);
    const auto kernel = torch::randn({g.d, 1});
    const auto meta = [](const at::Tensor& t) { return t.to(at::kMeta); };
    const auto run = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& w) {
      return convnn::ops::knn_attention(q, k, v, w, c10::nullopt, 1, "dot", c10::nullopt, false, "softmax", 1.0);
    };
    const auto [out, scores, indices, weights] = run(real.queries, real.keys, real.values, kernel);
    const auto [m_out, m_scores, m_indices, m_weights] =
        run(meta(real.queries), meta(real.keys), meta(real.values), meta(kernel));
    const std::string where = c10::str("B,H,N,D = ", g.b, ",", g.h, ",", g.n, ",", g.d);
    for (const auto& [r, m] : {std::pair{out, m_out}, std::pair{scores, m_scores}, std::pair{indices, m_indices},
                               std::pair{weights, m_weights}}) {
      EXPECT_EQ(r.sizes(), m.sizes()) << where;
      EXPECT_EQ(r.strides(), m.strides()) << where;
    }
    const auto grads = convnn::ops::knn_attention_backward(torch::ones_like(out), real.queries, real.keys, real.values,
                                                           kernel, scores, indices, weights, "dot", "softmax", 1.0,
                                                           {true, true, true, true, false});
    const auto m_grads = convnn::ops::knn_attention_backward(
        meta(torch::ones_like(out)), meta(real.queries), meta(real.keys), meta(real.values), meta(kernel),
        m_scores, m_indices, m_weights, "dot", "softmax", 1.0, {true, true, true, true, false});
    EXPECT_EQ(std::get<0>(grads).sizes(), std::get<0>(m_grads).sizes()) << where;
    EXPECT_EQ(std::get<0>(grads).strides(), std::get<0>(m_grads).strides()) << where;
    EXPECT_EQ(std::get<2>(grads).sizes(), real.values.sizes()) << where;
  }
}

// `run` must raise a c10::Error whose message contains every fragment.
::testing::AssertionResult ThrowsWith(const std::function<void()>& run, std::initializer_list<std::string> fragments) {
  const std::string message = convnn::testing::error_of(run);
  for (const auto& fragment : fragments) {
    if (message.find(fragment) == std::string::npos) {
      return ::testing::AssertionFailure() << "message\n  " << message << "\nlacks\n  " << fragment;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(HeadDims, BadLayoutsAreRefusedWithTheArgumentTheShapeAndTheRule) {
  const Geometry g{2, 3, 5, 4};
  const Projection p(g, at::kFloat);
  const auto kernel = torch::randn({g.d, 2});
  const auto call = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const c10::optional<at::Tensor>& mask = c10::nullopt, int64_t slots = 2) {
    return [=] {
      convnn::ops::knn_attention(q, k, v, kernel, c10::nullopt, slots, "dot", mask, false, "softmax", 1.0);
    };
  };
  EXPECT_TRUE(ThrowsWith(call(p.queries.unsqueeze(0), p.keys, p.values),
                         {"knn_attention: queries, keys and values must be all 3-D [G,N,D] or all 4-D [B,H,N,D]",
                          "queries [1, 2, 3, 5, 4]"}));
  EXPECT_TRUE(ThrowsWith(call(p.queries, folded(p.keys), p.values), {"all 4-D [B,H,N,D]", "keys [6, 5, 4]"}));
  EXPECT_TRUE(ThrowsWith(call(p.queries, p.keys.narrow(1, 0, 2), p.values.narrow(1, 0, 2)),
                         {"keys [2, 2, 5, 4] must have the queries' [B,H] = [2,3]"}));
  EXPECT_TRUE(ThrowsWith(call(p.queries, p.keys, p.values, torch::ones({6, 5, 5}, torch::kBool)),
                         {"with head dims, mask must be 2-D [N,M] (shared) or 4-D [B,H,N,M], [B,1,N,M], "
                          "[1,H,N,M] or [1,1,N,M] (broadcast over the queries' [B,H] as in "
                          "scaled_dot_product_attention), got [6, 5, 5]"}));
  EXPECT_TRUE(ThrowsWith(call(p.queries, p.keys, p.values, torch::ones({2, 2, 5, 5}, torch::kBool)),
                         {"mask [2, 2, 5, 5] must have the queries' B = 2 or 1 in dim 0 and their H = 3 or 1 "
                          "in dim 1"}));
  EXPECT_TRUE(ThrowsWith(call(p.queries, p.keys, p.values, torch::ones({3, 1, 5, 5}, torch::kBool)),
                         {"mask [3, 1, 5, 5] must have the queries' B = 2 or 1 in dim 0"}));
  // A rule of the folded call names the folded shapes, and says which ones the caller passed.
  EXPECT_TRUE(ThrowsWith(call(p.queries, p.keys, p.values, c10::nullopt, 9),
                         {"k must be", "ran on the [B,H,N,D] inputs as [B*H,N,D] slices (queries [2, 3, 5, 4])"}));
  // Not structured bindings: a lambda cannot capture them in C++17 (Clang refuses).
  const auto forward = convnn::ops::knn_attention(p.queries, p.keys, p.values, kernel, c10::nullopt, 2, "dot",
                                                  c10::nullopt, false, "softmax", 1.0);
  EXPECT_TRUE(ThrowsWith(
      [&] {
        convnn::ops::knn_attention_backward(folded(std::get<0>(forward)), p.queries, p.keys, p.values, kernel,
                                            std::get<1>(forward), std::get<2>(forward), std::get<3>(forward), "dot",
                                            "softmax", 1.0, {true, true, true, true, false});
      },
      {"knn_attention_backward: with head dims, grad_output must be 4-D [B,H,N,C], got [6, 5, 4]"}));
}

}  // namespace
}  // namespace head_dims_test
