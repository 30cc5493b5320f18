// knn_aggregate against a direct float64 loop over the definition
//   y[g,i,o] = sum_k weights[g,i,k] * (kernel[..,k] applied to values[g, indices[g,i,k], :])
//              + bias[o]
// for depthwise and standard kernels, with and without bias, duplicate indices and strided views.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ostream>
#include <string>

#include "convnn/ops/knn_ops.h"
#include "support/assert_close.h"

namespace knn_aggregate_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

using convnn::testing::AllClose;
using convnn::testing::epsilon_of;

at::Tensor randn(c10::IntArrayRef shape, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, generator, at::TensorOptions().dtype(at::kDouble));
}

at::Tensor randint(int64_t high, c10::IntArrayRef shape, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(high, shape, generator, at::TensorOptions().dtype(at::kLong));
}

c10::optional<at::Tensor> optional(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

at::Tensor loop_aggregate(const at::Tensor& values_in, const at::Tensor& weights_in,
                          const at::Tensor& indices_in, const at::Tensor& kernel_in,
                          const at::Tensor& bias_in) {
  const auto values = values_in.to(at::kDouble).contiguous();
  const auto weights = weights_in.to(at::kDouble).contiguous();
  const auto indices = indices_in.contiguous();
  const bool depthwise = kernel_in.dim() == 2;
  // Depthwise [C,K] is the standard kernel that is diagonal in (out, in).
  const auto kernel3 = depthwise ? at::diag_embed(kernel_in.to(at::kDouble).t()).permute({1, 2, 0})
                                 : kernel_in.to(at::kDouble);
  const auto kernel = kernel3.contiguous();
  const int64_t g = values.size(0), c = values.size(2), n = weights.size(1), k = weights.size(2);
  const int64_t c_out = kernel.size(0);
  auto out = at::zeros({g, n, c_out}, at::kDouble);
  auto y = out.accessor<double, 3>();
  const auto v = values.accessor<double, 3>();
  const auto w = weights.accessor<double, 3>();
  const auto idx = indices.accessor<int64_t, 3>();
  const auto kern = kernel.accessor<double, 3>();
  for (int64_t b = 0; b < g; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t o = 0; o < c_out; ++o) {
        double acc = bias_in.defined() ? bias_in[o].item<double>() : 0.0;
        for (int64_t slot = 0; slot < k; ++slot) {
          for (int64_t ci = 0; ci < c; ++ci) {
            acc += w[b][i][slot] * kern[o][ci][slot] * v[b][idx[b][i][slot]][ci];
          }
        }
        y[b][i][o] = acc;
      }
    }
  }
  return out;
}

// Inputs of one knn_aggregate call.
struct Inputs {
  at::Tensor values, weights, indices, kernel, bias;
};

Inputs make_inputs(bool depthwise, bool with_bias, uint64_t seed, int64_t g = 2, int64_t m = 6,
                   int64_t n = 4, int64_t c = 3, int64_t k = 3, int64_t c_out = 5) {
  Inputs in;
  in.values = randn({g, m, c}, seed);
  in.weights = randn({g, n, k}, seed + 1);
  in.indices = randint(m, {g, n, k}, seed + 2);
  in.kernel = depthwise ? randn({c, k}, seed + 3) : randn({c_out, c, k}, seed + 3);
  if (with_bias) in.bias = randn({depthwise ? c : c_out}, seed + 4);
  return in;
}

at::Tensor aggregate(const Inputs& in) {
  return convnn::ops::knn_aggregate(in.values, in.weights, in.indices, in.kernel,
                                    optional(in.bias));
}

Inputs to_dtype(const Inputs& in, at::ScalarType dtype) {
  const auto cast = [&](const at::Tensor& t) { return t.defined() ? t.to(dtype) : t; };
  return {cast(in.values), cast(in.weights), in.indices, cast(in.kernel), cast(in.bias)};
}

// Error bound of a K*C-term sum in `dtype`, relative to the output's scale.
double tolerance(at::ScalarType dtype, const Inputs& in) {
  return 4.0 * static_cast<double>(in.weights.size(2) * in.values.size(2)) * epsilon_of(dtype);
}

::testing::AssertionResult MatchesLoop(const Inputs& in) {
  const double tol = tolerance(in.values.scalar_type(), in);
  return AllClose(aggregate(in),
                  loop_aggregate(in.values, in.weights, in.indices, in.kernel, in.bias), tol, tol);
}

struct Variant {
  bool depthwise, bias;
};

void PrintTo(const Variant& v, std::ostream* os) {
  *os << (v.depthwise ? "depthwise" : "standard") << (v.bias ? " with bias" : " without bias");
}

class KnnAggregateVariant : public ::testing::TestWithParam<Variant> {};

TEST_P(KnnAggregateVariant, MatchesFloat64LoopInFloat64) {
  EXPECT_TRUE(MatchesLoop(make_inputs(GetParam().depthwise, GetParam().bias, 100)));
}

TEST_P(KnnAggregateVariant, Float32IsWithinFloat32EpsilonOfTheFloat64Loop) {
  const auto in = to_dtype(make_inputs(GetParam().depthwise, GetParam().bias, 200), at::kFloat);
  const auto expected = loop_aggregate(in.values, in.weights, in.indices, in.kernel, in.bias);
  const double tol = tolerance(at::kFloat, in);
  const auto actual = aggregate(in);
  EXPECT_EQ(actual.scalar_type(), at::kFloat);
  EXPECT_TRUE(AllClose(actual, expected, tol, tol));
}

TEST_P(KnnAggregateVariant, DuplicateIndicesCountEveryOccurrence) {
  auto in = make_inputs(GetParam().depthwise, GetParam().bias, 300);
  in.indices = at::zeros_like(in.indices);  // every slot of every query gathers candidate 0
  EXPECT_TRUE(MatchesLoop(in));
  in.indices = randint(2, in.indices.sizes(), 301);  // only candidates 0 and 1
  EXPECT_TRUE(MatchesLoop(in));
}

// A view with the same values as `t` whose last dimension has stride 2.
at::Tensor strided_copy(const at::Tensor& t) {
  auto sizes = t.sizes().vec();
  sizes.back() *= 2;
  auto wide = at::zeros(sizes, t.options());
  auto view = wide.slice(-1, 0, sizes.back(), 2);
  view.copy_(t);
  return view;
}

// A transposed view of a transposed copy: same values, swapped strides.
at::Tensor transposed_copy(const at::Tensor& t) {
  return t.transpose(0, -1).contiguous().transpose(0, -1);
}

TEST_P(KnnAggregateVariant, NonContiguousInputsGiveTheContiguousResult) {
  const auto in = make_inputs(GetParam().depthwise, GetParam().bias, 400);
  const Inputs views{transposed_copy(in.values), strided_copy(in.weights),
                     transposed_copy(in.indices), transposed_copy(in.kernel),
                     in.bias.defined() ? strided_copy(in.bias) : in.bias};
  ASSERT_FALSE(views.values.is_contiguous());
  ASSERT_FALSE(views.indices.is_contiguous());
  EXPECT_TRUE(MatchesLoop(views));
  const double tol = tolerance(at::kDouble, in);
  EXPECT_TRUE(AllClose(aggregate(views), aggregate(in), tol, tol));
}

INSTANTIATE_TEST_SUITE_P(KnnAggregate, KnnAggregateVariant,
                         ::testing::Values(Variant{true, false}, Variant{true, true},
                                           Variant{false, false}, Variant{false, true}),
                         [](const auto& info) {
                           return std::string(info.param.depthwise ? "Depthwise" : "Standard") +
                                  (info.param.bias ? "WithBias" : "WithoutBias");
                         });

TEST(KnnAggregate, StandardWithADiagonalKernelEqualsDepthwise) {
  const auto in = make_inputs(/*depthwise=*/true, /*with_bias=*/true, 500);
  Inputs standard = in;
  standard.kernel = at::diag_embed(in.kernel.t()).permute({1, 2, 0}).contiguous();  // [C,C,K]
  EXPECT_TRUE(AllClose(aggregate(standard), aggregate(in), 1e-14, 1e-14));
}

TEST(KnnAggregate, OutputShapeIsGNCOutForBothKernels) {
  const auto standard = make_inputs(false, false, 600, 3, 7, 2, 4, 5, 6);
  EXPECT_EQ(aggregate(standard).sizes(), (std::vector<int64_t>{3, 2, 6}));
  const auto depthwise = make_inputs(true, false, 600, 3, 7, 2, 4, 5);
  EXPECT_EQ(aggregate(depthwise).sizes(), (std::vector<int64_t>{3, 2, 4}));
}

TEST(KnnAggregate, KEqualsOneIsAWeightedGatherThroughThePointwiseKernel) {
  auto in = make_inputs(false, false, 700, 2, 5, 4, 3, 1, 2);
  const auto gathered = at::stack({in.values[0].index_select(0, in.indices[0].view({-1})),
                                   in.values[1].index_select(0, in.indices[1].view({-1}))});
  const auto expected = at::matmul(gathered * in.weights, in.kernel.squeeze(-1).t());
  EXPECT_TRUE(AllClose(aggregate(in), expected, 1e-14, 1e-14));
}

}  // namespace

}  // namespace knn_aggregate_test
