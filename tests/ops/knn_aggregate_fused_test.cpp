// The fused CPU knn_aggregate and knn_aggregate_backward (src/ops/cpu/knn_aggregate_*_kernel.cpp),
// reached through the dispatcher, agree with the plain-ATen reference given the same indices: in
// float32, bfloat16 and float16 their error against a float64 computation is at most twice the
// reference's own error in the same dtype (plus one unit in the last place of the output scale),
// the backward is bitwise reproducible and independent of the thread count, and float64
// gradients pass a finite-difference check. The standard kernel has two strategies, chosen by
// shape: query side when M >= N, value side when M < N (fewer candidates than queries); every
// check below runs on both.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <string>
#include <tuple>
#include <vector>

#include "convnn/ops/knn_ops.h"
#include "ops/generic/generic.h"
#include "ops/reference/reference.h"
#include "support/assert_close.h"
#include "support/gradcheck.h"

namespace {

using convnn::testing::epsilon_of;
using convnn::testing::max_abs_diff;

struct Shape {
  int64_t g, n, m, c, c_out, k;
  bool depthwise, bias;
  std::string name() const {
    return "G=" + std::to_string(g) + " N=" + std::to_string(n) + " M=" + std::to_string(m) +
           " C=" + std::to_string(c) + (depthwise ? " depthwise" : " C'=" + std::to_string(c_out)) +
           " K=" + std::to_string(k) + (bias ? " bias" : "");
  }
};

void PrintTo(const Shape& shape, std::ostream* os) { *os << shape.name(); }

// The inputs of one problem, in float64 (cast per test).
struct Problem {
  torch::Tensor values, weights, indices, kernel, bias, grad_output;  // bias undefined without one

  Problem to(torch::ScalarType dtype) const {
    Problem p = *this;
    for (auto* t : {&p.values, &p.weights, &p.kernel, &p.bias, &p.grad_output}) {
      if (t->defined()) *t = t->to(dtype);
    }
    return p;
  }
  c10::optional<torch::Tensor> optional_bias() const {
    return bias.defined() ? c10::optional<torch::Tensor>(bias) : c10::nullopt;
  }
};

// Random problem; `index_range` < M draws indices from [0, index_range) only, so that many
// queries (and slots of one query) share value rows.
Problem make_problem(const Shape& s, uint64_t seed, int64_t index_range = 0) {
  torch::manual_seed(seed);
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  Problem p;
  p.values = torch::randn({s.g, s.m, s.c}, f64);
  p.weights = torch::randn({s.g, s.n, s.k}, f64);
  const int64_t range = index_range > 0 ? index_range : s.m;
  p.indices = torch::randint(0, range, {s.g, s.n, s.k}, torch::kLong);
  p.kernel = s.depthwise ? torch::randn({s.c, s.k}, f64) : torch::randn({s.c_out, s.c, s.k}, f64);
  const int64_t c_out = s.depthwise ? s.c : s.c_out;
  if (s.bias) p.bias = torch::randn({c_out}, f64);
  p.grad_output = torch::randn({s.g, s.n, c_out}, f64);
  return p;
}

// Each query selects every candidate once, in a random order per row: K = M.
torch::Tensor all_candidates_shuffled(int64_t g, int64_t n, int64_t m) {
  return std::get<1>(torch::rand({g, n, m}).sort(/*dim=*/-1));
}

torch::Tensor fused_forward(const Problem& p) {
  return convnn::ops::knn_aggregate(p.values, p.weights, p.indices, p.kernel, p.optional_bias());
}

torch::Tensor reference_forward(const Problem& p) {
  return convnn::reference::knn_aggregate(p.values, p.weights, p.indices, p.kernel,
                                          p.optional_bias());
}

using Grads = std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor>;

// Every gradient the problem has: values, weights, kernel, and bias when there is one.
std::array<bool, 4> all_gradients(const Problem& p) { return {true, true, true, p.bias.defined()}; }

Grads fused_backward(const Problem& p, std::array<bool, 4> output_mask) {
  return convnn::ops::knn_aggregate_backward(p.grad_output, p.values, p.weights, p.indices,
                                             p.kernel, output_mask);
}
Grads fused_backward(const Problem& p) { return fused_backward(p, all_gradients(p)); }

Grads reference_backward(const Problem& p) {
  return convnn::reference::knn_aggregate_backward(p.grad_output, p.values, p.weights, p.indices,
                                                   p.kernel, all_gradients(p));
}

std::vector<torch::Tensor> as_list(const Grads& grads) {
  return {std::get<0>(grads), std::get<1>(grads), std::get<2>(grads), std::get<3>(grads)};
}

// The flash-attention criterion: |fused - truth| <= 2 |reference - truth| + one ulp of the output
// scale, all in float64.
void expect_error_within_twice_reference(const torch::Tensor& fused, const torch::Tensor& reference,
                                         const torch::Tensor& truth, const std::string& what) {
  ASSERT_EQ(fused.defined(), truth.defined()) << what;
  if (!truth.defined()) return;
  ASSERT_EQ(fused.sizes(), truth.sizes()) << what;
  ASSERT_EQ(fused.scalar_type(), reference.scalar_type()) << what;
  const double scale = truth.numel() ? truth.abs().max().item<double>() : 0.0;
  const double floor = epsilon_of(fused.scalar_type()) * scale;
  const double fused_error = max_abs_diff(fused, truth);
  const double reference_error = max_abs_diff(reference, truth);
  EXPECT_LE(fused_error, 2.0 * reference_error + floor)
      << what << ": fused error " << fused_error << ", reference error " << reference_error
      << ", floor " << floor;
}

void expect_matches_reference(const Problem& problem64, const std::string& name) {
  const auto truth_forward = reference_forward(problem64);
  const auto truth_backward = as_list(reference_backward(problem64));
  {
    // In float64 the fused kernels equal the reference up to summation order.
    SCOPED_TRACE(name + " float64");
    EXPECT_TRUE(convnn::testing::AllClose(fused_forward(problem64), truth_forward, 1e-12, 1e-12));
    const auto grads = as_list(fused_backward(problem64));
    for (size_t e = 0; e < grads.size(); ++e) {
      ASSERT_EQ(grads[e].defined(), truth_backward[e].defined());
      if (grads[e].defined()) {
        EXPECT_TRUE(convnn::testing::AllClose(grads[e], truth_backward[e], 1e-12, 1e-12))
            << "gradient " << e;
      }
    }
  }
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const std::string trace = name + " " + std::string(c10::toString(dtype));
    SCOPED_TRACE(trace);
    // Truth is computed from the inputs as rounded to `dtype`, so only arithmetic error counts.
    const auto rounded = problem64.to(dtype).to(torch::kDouble);
    const auto low = problem64.to(dtype);
    expect_error_within_twice_reference(fused_forward(low), reference_forward(low),
                                        reference_forward(rounded), "output");
    const auto fused = as_list(fused_backward(low));
    const auto reference = as_list(reference_backward(low));
    const auto truth = as_list(reference_backward(rounded));
    const char* names[] = {"grad_values", "grad_weights", "grad_kernel", "grad_bias"};
    for (size_t e = 0; e < fused.size(); ++e) {
      expect_error_within_twice_reference(fused[e], reference[e], truth[e], names[e]);
    }
  }
}

class FusedAggregateShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(FusedAggregateShapes, MatchesReferenceInEveryDtype) {
  const Shape s = GetParam();
  expect_matches_reference(make_problem(s, 7 + s.g * 31 + s.n * 7 + s.k), s.name());
}

// Odd channel counts exercise the vector tails; N*G = 394 rows and K*C up to 9*64 span several
// GEMM tiles and kernel-gradient chunks; M < N selects the value-side standard path.
INSTANTIATE_TEST_SUITE_P(Sweep, FusedAggregateShapes,
                         ::testing::Values(Shape{2, 5, 9, 3, 3, 2, true, false},
                                           Shape{2, 5, 9, 3, 3, 2, true, true},
                                           Shape{3, 7, 11, 13, 5, 4, false, false},
                                           Shape{3, 7, 11, 13, 5, 4, false, true},
                                           Shape{2, 6, 8, 17, 17, 1, true, true},
                                           Shape{2, 6, 8, 17, 4, 1, false, true},
                                           Shape{2, 197, 197, 64, 64, 8, true, false},
                                           Shape{2, 197, 197, 64, 64, 9, false, true},
                                           Shape{1, 300, 40, 33, 21, 3, false, false},
                                           Shape{1, 300, 40, 33, 21, 3, true, true},
                                           Shape{2, 300, 150, 20, 24, 5, false, true}));

TEST(FusedAggregate, KEqualsMSelectsEveryCandidate) {
  for (const bool depthwise : {true, false}) {
    const Shape s{2, 9, 6, 5, 7, 6, depthwise, true};
    auto problem = make_problem(s, 11);
    problem.indices = all_candidates_shuffled(s.g, s.n, s.m);
    expect_matches_reference(problem, s.name() + " K=M");
  }
}

TEST(FusedAggregate, DuplicateIndicesWithinAndAcrossQueries) {
  for (const auto& s : {Shape{2, 40, 7, 6, 4, 5, true, true}, Shape{2, 40, 7, 6, 4, 5, false, true},
                        Shape{2, 6, 7, 6, 4, 5, false, true}}) {
    // Five slots per query over three value rows (so repeats inside a row), and the last value
    // rows selected by nobody (their gradient must be exactly zero).
    const auto problem = make_problem(s, 12, /*index_range=*/3);
    expect_matches_reference(problem, s.name() + " duplicates");
    const auto grad_values = std::get<0>(fused_backward(problem));
    EXPECT_TRUE(torch::equal(grad_values.slice(1, 3), torch::zeros_like(grad_values.slice(1, 3))));
  }
}

// The fused kernels read strided rows in place and promise the dense result bit for bit. The generic
// path (the op tests' CONVNN_CPU_KERNELS=generic pass) hands the strides to ATen's matrix products,
// whose blocking may round the last bits differently: there the results must agree to rounding.
::testing::AssertionResult SameResult(const torch::Tensor& x, const torch::Tensor& y) {
  if (!convnn::ops::generic::serves_cpu()) {
    return torch::equal(x, y) ? ::testing::AssertionSuccess() : ::testing::AssertionFailure() << "not bitwise equal";
  }
  return convnn::testing::AllClose(x, y, 1e-12, 1e-12);
}

TEST(FusedAggregate, NonContiguousInputs) {
  for (const auto& s :
       {Shape{3, 10, 12, 6, 6, 4, true, true}, Shape{3, 10, 12, 6, 5, 4, false, true},
        Shape{3, 10, 6, 6, 5, 4, false, true}}) {
    SCOPED_TRACE(s.name());
    const bool depthwise = s.depthwise;
    const auto dense = make_problem(s, 13);
    const int64_t c_out = depthwise ? s.c : s.c_out;
    Problem strided;
    // Rows with a unit-stride last dim but padded row and slice strides (a slice of a wider
    // projection), used in place.
    strided.values = torch::zeros({s.g, s.m, s.c + 5}, torch::kDouble).slice(2, 2, 2 + s.c);
    strided.values.copy_(dense.values);
    // Transposed storage: weights and indices [G,K,N] seen as [G,N,K], kernel and grad_output
    // with a non-unit last stride (the glue copies those).
    strided.weights = dense.weights.transpose(1, 2).contiguous().transpose(1, 2);
    strided.indices = dense.indices.transpose(1, 2).contiguous().transpose(1, 2);
    strided.kernel = depthwise ? dense.kernel.t().contiguous().t()
                               : dense.kernel.permute({2, 1, 0}).contiguous().permute({2, 1, 0});
    strided.bias = torch::stack({dense.bias, dense.bias}, 1).select(1, 0);
    strided.grad_output = dense.grad_output.transpose(1, 2).contiguous().transpose(1, 2);
    ASSERT_FALSE(strided.values.is_contiguous());
    ASSERT_FALSE(strided.weights.is_contiguous());
    ASSERT_FALSE(strided.kernel.is_contiguous());
    ASSERT_FALSE(strided.bias.is_contiguous());
    ASSERT_EQ(strided.grad_output.size(2), c_out);
    EXPECT_TRUE(SameResult(fused_forward(strided), fused_forward(dense)));
    const auto a = as_list(fused_backward(strided)), b = as_list(fused_backward(dense));
    for (size_t e = 0; e < a.size(); ++e) EXPECT_TRUE(SameResult(a[e], b[e])) << "gradient " << e;
    // An expanded (all-stride-0) gradient, as sum() produces.
    Problem expanded = dense;
    expanded.grad_output = torch::ones({1, 1, 1}, torch::kDouble).expand({s.g, s.n, c_out});
    Problem materialised = dense;
    materialised.grad_output = expanded.grad_output.contiguous();
    const auto x = as_list(fused_backward(expanded)), y = as_list(fused_backward(materialised));
    for (size_t e = 0; e < x.size(); ++e) EXPECT_TRUE(SameResult(x[e], y[e])) << "gradient " << e;
  }
}

TEST(FusedAggregate, EmptyProblems) {
  for (const bool depthwise : {true, false}) {
    for (const auto& [g, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {0, 8}, {2, 0}}) {
      const Shape s{g, n, 5, 3, 4, 2, depthwise, true};
      const auto problem = make_problem(s, 14);
      const int64_t c_out = depthwise ? s.c : s.c_out;
      const auto out = fused_forward(problem);
      EXPECT_EQ(out.sizes(), (std::vector<int64_t>{g, n, c_out}));
      const auto [grad_values, grad_weights, grad_kernel, grad_bias] = fused_backward(problem);
      EXPECT_TRUE(torch::equal(grad_values, torch::zeros({g, 5, 3}, torch::kDouble)));
      EXPECT_EQ(grad_weights.sizes(), (std::vector<int64_t>{g, n, 2}));
      EXPECT_TRUE(torch::equal(grad_kernel, torch::zeros_like(problem.kernel)));
      EXPECT_TRUE(torch::equal(grad_bias, torch::zeros({c_out}, torch::kDouble)));
    }
  }
}

TEST(FusedAggregate, NoBiasGivesUndefinedBiasGradient) {
  const auto problem = make_problem({2, 4, 5, 3, 3, 2, true, false}, 15);
  EXPECT_FALSE(std::get<3>(fused_backward(problem)).defined());
}

// Skipping a gradient skips its work only: each of the 16 output masks leaves the unwanted
// gradients undefined and gives the wanted ones bitwise as the full backward does, on the
// depthwise, query-side and value-side paths.
TEST(FusedAggregate, OutputMaskLeavesUnwantedGradientsUndefinedAndTheOthersUnchanged) {
  for (const auto& s : {Shape{2, 30, 40, 6, 6, 4, true, true}, Shape{2, 30, 40, 6, 5, 4, false, true},
                        Shape{2, 30, 12, 6, 5, 4, false, true}}) {
    SCOPED_TRACE(s.name());
    const auto problem = make_problem(s, 17).to(torch::kFloat);
    const auto full = as_list(fused_backward(problem));
    for (int bits = 0; bits < 16; ++bits) {
      const std::array<bool, 4> mask{(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0,
                                     (bits & 8) != 0};
      const auto grads = as_list(fused_backward(problem, mask));
      for (size_t e = 0; e < grads.size(); ++e) {
        SCOPED_TRACE("mask " + std::to_string(bits) + ", gradient " + std::to_string(e));
        ASSERT_EQ(grads[e].defined(), mask[e]);
        if (mask[e]) EXPECT_TRUE(torch::equal(grads[e], full[e]));
      }
    }
  }
}

TEST(FusedAggregate, GradCheckThroughTheOpInFloat64) {
  for (const auto& s : {Shape{2, 5, 6, 3, 4, 3, true, true}, Shape{2, 5, 6, 3, 4, 3, false, true},
                        Shape{2, 7, 5, 3, 4, 3, false, true}}) {
    SCOPED_TRACE(s.name());
    // Index range 4 < M: duplicate selections, and rows nobody selects.
    auto problem = make_problem(s, 16, /*index_range=*/4);
    const auto values = problem.values.requires_grad_();
    const auto weights = problem.weights.requires_grad_();
    const auto kernel = problem.kernel.requires_grad_();
    const auto bias = problem.bias.requires_grad_();
    EXPECT_TRUE(convnn::testing::GradCheck(
        [&](const std::vector<torch::Tensor>& x) {
          return convnn::ops::knn_aggregate(x[0], x[1], problem.indices, x[2], x[3]);
        },
        {values, weights, kernel, bias}));
  }
}

// Restores the thread count on scope exit.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(at::get_num_threads()) { at::set_num_threads(n); }
  ~ThreadCount() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

TEST(FusedAggregate, BackwardIsBitwiseReproducibleAndIndependentOfThreadCount) {
  // Big enough for several kernel-gradient chunks, GEMM tiles and parallel tasks. With G = 2 the
  // value side scatters by slices for 1 and 2 threads and gathers through the inverse index for
  // 3: both must give the same bits.
  for (const auto& s :
       {Shape{8, 197, 197, 64, 64, 9, true, true}, Shape{8, 197, 197, 64, 48, 9, false, true},
        Shape{8, 197, 120, 64, 48, 9, false, true}, Shape{2, 197, 120, 64, 48, 9, false, true}}) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      SCOPED_TRACE(s.name() + " " + c10::toString(dtype));
      const auto problem = make_problem(s, 17, /*index_range=*/50).to(dtype);
      std::vector<torch::Tensor> one_thread, two_threads, again, three_threads;
      {
        ThreadCount threads(1);
        one_thread = as_list(fused_backward(problem));
      }
      {
        ThreadCount threads(2);
        two_threads = as_list(fused_backward(problem));
        again = as_list(fused_backward(problem));
      }
      {
        ThreadCount threads(3);  // an uneven split of the work
        three_threads = as_list(fused_backward(problem));
      }
      for (size_t e = 0; e < one_thread.size(); ++e) {
        EXPECT_TRUE(torch::equal(two_threads[e], again[e])) << "gradient " << e;
        EXPECT_TRUE(convnn::testing::SameAcrossThreadCounts(three_threads[e], two_threads[e])) << "gradient " << e;
        EXPECT_TRUE(convnn::testing::SameAcrossThreadCounts(one_thread[e], two_threads[e])) << "gradient " << e;
      }
    }
  }
}

TEST(FusedAggregate, AutogradBackwardIsBitwiseReproducible) {
  const auto problem = make_problem({4, 50, 30, 16, 8, 5, false, true}, 18, /*index_range=*/10);
  const auto grads = [&] {
    const auto values = problem.values.clone().requires_grad_();
    const auto weights = problem.weights.clone().requires_grad_();
    const auto kernel = problem.kernel.clone().requires_grad_();
    const auto out =
        convnn::ops::knn_aggregate(values, weights, problem.indices, kernel, problem.bias);
    return torch::autograd::grad({(out * problem.grad_output).sum()}, {values, weights, kernel});
  };
  const auto a = grads(), b = grads();
  for (size_t e = 0; e < a.size(); ++e) EXPECT_TRUE(torch::equal(a[e], b[e])) << "gradient " << e;
}

}  // namespace
