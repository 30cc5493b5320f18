// `convnn bench --impl fused|generic --device ...`: the names parse, the impl/device rules of
// bench::validate reject what cannot run (before any measurement), both impls' op-level functions
// compute Algorithm 1's forward and gradients, and a generic op-level case runs end to end with its
// path named after the impl.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "convnn/bench/bench.h"
#include "convnn/bench/reference_attention.h"
#include "support/assert_close.h"

namespace {

namespace bench = convnn::bench;
using bench::Impl;
using bench::Level;
using convnn::Similarity;
using convnn::testing::AllClose;

// Runs `f`, which must throw c10::Error, and returns its message without the C++ trace.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(BenchImpl, NamesParseAndPrintBack) {
  EXPECT_EQ(bench::parse_impl("fused"), Impl::Fused);
  EXPECT_EQ(bench::parse_impl("generic"), Impl::Generic);
  EXPECT_STREQ(bench::to_string(Impl::Fused), "fused");
  EXPECT_STREQ(bench::to_string(Impl::Generic), "generic");
  const auto message = error_of([] { bench::parse_impl("cuda"); });
  EXPECT_NE(message.find("impl"), std::string::npos) << message;
  EXPECT_NE(message.find("'cuda'"), std::string::npos) << message;
}

TEST(BenchImpl, ValidateAcceptsWhatRunsAndNamesTheRuleOfWhatCannot) {
  bench::BenchConfig c;
  c.level = Level::Op;
  EXPECT_NO_THROW(bench::validate(c));  // fused on the CPU: the default
  c.impl = Impl::Generic;
  EXPECT_NO_THROW(bench::validate(c));  // generic ops called directly on CPU tensors

  // A device need not be present to be named: these are rejected before anything touches it.
  c.device = c10::Device(c10::kCUDA, 0);
  EXPECT_NO_THROW(bench::validate(c));
  c.impl = Impl::Fused;
  auto message = error_of([&] { bench::validate(c); });
  EXPECT_NE(message.find("fused"), std::string::npos) << message;
  EXPECT_NE(message.find("cuda:0"), std::string::npos) << message;
  EXPECT_NE(message.find("only on the CPU"), std::string::npos) << message;

  c.impl = Impl::Generic;
  c.device = c10::Device(c10::kCUDA);
  message = error_of([&] { bench::validate(c); });
  EXPECT_NE(message.find("index"), std::string::npos) << message;

  // On the CPU, the layer's ops reach the fused kernels: a module-level "generic" run would not be.
  c.device = c10::Device(c10::kCPU);
  c.level = Level::Module;
  message = error_of([&] { bench::validate(c); });
  EXPECT_NE(message.find("generic"), std::string::npos) << message;
  EXPECT_NE(message.find("module"), std::string::npos) << message;
  EXPECT_THROW(bench::run_case(c), c10::Error);  // run_case validates too
  c.impl = Impl::Fused;
  EXPECT_NO_THROW(bench::validate(c));
}

// Both impls, whole and composed, equal Algorithm 1 (bench::reference_conv_nn) in float64:
// forward and the gradients of queries, keys, values and kernel. K < N on continuous inputs, so no
// top-k tie can make them select different neighbours.
TEST(BenchImpl, OpLevelFunctionsEqualTheReferenceForwardAndBackward) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const auto options = at::TensorOptions().dtype(at::kDouble);
  const int64_t g = 3, n = 20, d = 8, k = 5;
  for (const bool depthwise : {true, false}) {
    std::vector<at::Tensor> inputs{at::randn({g, n, d}, gen, options), at::randn({g, n, d}, gen, options),
                                   at::randn({g, n, d}, gen, options),
                                   depthwise ? at::randn({d, k}, gen, options) : at::randn({d, d, k}, gen, options)};
    const auto grad_output = at::randn({g, n, d}, gen, options);
    const auto run = [&](const auto& f) {
      std::vector<at::Tensor> leaves;
      for (const auto& t : inputs) leaves.push_back(t.clone().requires_grad_(true));
      auto output = f(leaves[0], leaves[1], leaves[2], leaves[3]);
      output.backward(grad_output);
      std::vector<at::Tensor> results{output.detach()};
      for (const auto& leaf : leaves) results.push_back(leaf.grad());
      return results;
    };
    const auto expected = run([&](const at::Tensor& q, const at::Tensor& kk, const at::Tensor& v, const at::Tensor& w) {
      return bench::reference_conv_nn(q, kk, v, w, k, Similarity::ScaledDot);
    });
    for (const auto impl : {Impl::Fused, Impl::Generic}) {
      for (const bool composed : {false, true}) {
        SCOPED_TRACE(std::string(bench::to_string(impl)) + (composed ? " composed" : "") +
                     (depthwise ? " depthwise" : " standard"));
        const auto actual = run([&](const at::Tensor& q, const at::Tensor& kk, const at::Tensor& v,
                                    const at::Tensor& w) {
          return bench::convnn_op(impl, composed, q, kk, v, w, k, Similarity::ScaledDot);
        });
        for (size_t i = 0; i < expected.size(); ++i) {
          ASSERT_TRUE(actual[i].defined()) << "result " << i;
          EXPECT_TRUE(AllClose(actual[i], expected[i], 1e-10, 1e-10)) << "result " << i;
        }
      }
    }
  }
}

TEST(BenchImpl, GenericOpLevelCaseRunsUnderItsOwnName) {
  bench::BenchConfig c;
  c.level = Level::Op;
  c.impl = Impl::Generic;
  c.batch = 1;
  c.heads = 2;
  c.channels = 16;
  c.tokens = 24;
  c.k = 4;
  c.iters = 2;
  c.warmup = 0;
  const auto result = bench::run_case(c);
  ASSERT_EQ(result.paths.size(), 4u);
  EXPECT_EQ(result.paths[0].name, "reference");
  EXPECT_EQ(result.paths[1].name, "generic");
  EXPECT_EQ(result.paths[2].name, "composed");
  EXPECT_EQ(result.paths[3].name, "sdpa");  // the dense anchor on the same q, k, v
  EXPECT_EQ(result.paths[3].workload, "mhsa");
  EXPECT_LT(result.max_abs_diff, 1e-4);  // float32: generic against Algorithm 1 on the same inputs
  EXPECT_EQ(result.rows, 2 * 24);  // one output row per (slice, query)
  EXPECT_EQ(result.rows_beyond_rounding, 0);
  for (const auto& path : result.paths) {
    ASSERT_EQ(path.phases.size(), 3u) << path.name;
    for (const auto& phase : path.phases) {
      EXPECT_EQ(phase.time.samples_ms.size(), 2u) << path.name;
      EXPECT_GT(phase.peak_bytes, 0) << path.name;
    }
  }
}

}  // namespace
