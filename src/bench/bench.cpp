#include "convnn/bench/bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>

#include "convnn/bench/reference_attention.h"
#include "convnn/bench/tracking_allocator.h"
#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/modules/convnn.h"
#include "convnn/ops/knn_ops.h"

namespace convnn::bench {
namespace {

using Clock = std::chrono::steady_clock;

double elapsed_ms(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

// One implementation under test: a forward that builds a fresh autograd graph, and the leaves
// whose gradients must be dropped before each iteration (set to none, as zero_grad does by
// default), so that every iteration allocates its gradients anew and is charged for them.
struct Path {
  std::string name;
  std::string workload;
  std::function<at::Tensor()> forward;
  std::vector<at::Tensor> leaves;

  void reset_grads() const {
    for (const auto& leaf : leaves) leaf.mutable_grad() = at::Tensor();
  }
};

// Each iteration runs a fresh forward and then the backward on its graph, timed separately.
// forward+backward is the same iteration seen whole: the sum of its two times (they run back to
// back), and a peak over both windows measured from the forward's start.
std::vector<PhaseResult> run_path(const Path& path, const at::Tensor& grad_output,
                                  const BenchConfig& config, TrackingAllocator& tracker) {
  std::vector<double> forward_ms, backward_ms, total_ms;
  size_t forward_peak = 0, backward_peak = 0, total_peak = 0;
  for (int64_t i = 0; i < config.warmup + config.iters; ++i) {
    path.reset_grads();
    PeakWindow forward_window(tracker);
    const auto t0 = Clock::now();
    auto output = path.forward();
    const auto t1 = Clock::now();
    // The output and the saved graph are still alive: they are part of the forward's peak.
    const size_t forward_growth = forward_window.peak_growth();
    PeakWindow backward_window(tracker);
    // What the forward left behind (output, saved tensors): the backward's peak sits on top of it.
    const size_t held = backward_window.start_bytes() - std::min(backward_window.start_bytes(),
                                                                 forward_window.start_bytes());
    const auto t2 = Clock::now();
    output.backward(grad_output);
    const auto t3 = Clock::now();
    const size_t backward_growth = backward_window.peak_growth();
    output = at::Tensor();
    if (i < config.warmup) continue;
    forward_ms.push_back(elapsed_ms(t0, t1));
    backward_ms.push_back(elapsed_ms(t2, t3));
    total_ms.push_back(elapsed_ms(t0, t1) + elapsed_ms(t2, t3));
    forward_peak = std::max(forward_peak, forward_growth);
    backward_peak = std::max(backward_peak, backward_growth);
    total_peak = std::max(total_peak, std::max(forward_growth, held + backward_growth));
  }
  path.reset_grads();
  const auto result = [](Phase phase, std::vector<double> samples, size_t peak) {
    return PhaseResult{phase, summarize(std::move(samples)), static_cast<int64_t>(peak)};
  };
  return {result(Phase::Forward, std::move(forward_ms), forward_peak),
          result(Phase::Backward, std::move(backward_ms), backward_peak),
          result(Phase::ForwardBackward, std::move(total_ms), total_peak)};
}

// Everything one case needs, alive for the whole case: inputs, weights, the paths over them.
struct Setup {
  std::vector<Path> paths;  // reference, fused, composed[, mhsa]
  at::Tensor grad_output;   // the same upstream gradient for every path
  nn::ConvNNAttention module{nullptr};
};

// Random tensors are drawn in float32 and then converted, so that one seed gives the same values
// (up to rounding) in every dtype.
Setup make_op_setup(const BenchConfig& c, at::Generator& gen) {
  const auto options = at::TensorOptions().dtype(c.dtype);
  const int64_t g = c.batch * c.heads, d = c.channels / c.heads;
  const bool depthwise = c.aggregation == nn::Aggregation::Depthwise;
  auto leaf = [&](at::IntArrayRef shape, double scale) {
    return (at::randn(shape, gen, options.dtype(at::kFloat)) * scale).to(c.dtype).requires_grad_(true);
  };
  auto q = leaf({g, c.tokens, d}, 1.0), k = leaf({g, c.tokens, d}, 1.0), v = leaf({g, c.tokens, d}, 1.0);
  auto kernel = depthwise ? leaf({d, c.k}, 1.0) : leaf({d, d, c.k}, 1.0 / std::sqrt(static_cast<double>(d * c.k)));
  Setup setup;
  const std::vector<at::Tensor> leaves{q, k, v, kernel};
  const auto similarity = c.similarity;
  const int64_t kn = c.k;
  setup.paths.push_back({"reference", "convnn",
                         [=] { return reference_conv_nn(q, k, v, kernel, kn, similarity); }, leaves});
  setup.paths.push_back({"fused", "convnn",
                         [=] {
                           return std::get<0>(ops::knn_attention(q, k, v, kernel, c10::nullopt, kn,
                                                                 to_string(similarity), c10::nullopt,
                                                                 /*index_order=*/false, "softmax", 1.0));
                         },
                         leaves});
  setup.paths.push_back({"composed", "convnn",
                         [=] {
                           auto [scores, indices] = ops::knn_select(q, k, kn, to_string(similarity),
                                                                    c10::nullopt, /*index_order=*/false);
                           const auto weights = nn::functional::rho_weights(scores, nn::Rho::Softmax);
                           return ops::knn_aggregate(v, weights, indices, kernel, c10::nullopt);
                         },
                         leaves});
  setup.grad_output = at::randn({g, c.tokens, d}, gen, options.dtype(at::kFloat)).to(c.dtype);
  return setup;
}

Setup make_module_setup(const BenchConfig& c, at::Generator& gen) {
  const auto options = at::TensorOptions().dtype(c.dtype);
  Setup setup;
  const auto module_options =
      nn::ConvNNAttentionOptions(c.channels, c.heads, c.k).similarity(c.similarity).aggregation(c.aggregation);
  setup.module = nn::ConvNNAttention(module_options);
  setup.module->to(c.dtype);
  // The same layer on the composed path (knn_select, rho, knn_aggregate), with the same weights.
  nn::ConvNNAttention composed(nn::ConvNNAttentionOptions(module_options).fused(false));
  composed->to(c.dtype);
  {
    at::NoGradGuard no_grad;
    const auto fused_parameters = setup.module->named_parameters();
    for (auto& p : composed->named_parameters()) p.value().copy_(fused_parameters[p.key()]);
  }
  auto x = at::randn({c.batch, c.tokens, c.channels}, gen, options.dtype(at::kFloat)).to(c.dtype).requires_grad_(true);
  std::vector<at::Tensor> leaves{x}, composed_leaves{x};
  for (const auto& p : setup.module->parameters()) leaves.push_back(p);
  for (const auto& p : composed->parameters()) composed_leaves.push_back(p);
  const auto weights = attention_weights(*setup.module);
  const int64_t heads = c.heads, kn = c.k;
  const auto similarity = c.similarity;
  auto module = setup.module;
  setup.paths.push_back({"reference", "convnn",
                         [=] { return reference_attention(x, weights, heads, kn, similarity); }, leaves});
  setup.paths.push_back({"fused", "convnn", [=]() mutable { return module(x); }, leaves});
  setup.paths.push_back({"composed", "convnn", [=]() mutable { return composed(x); }, composed_leaves});
  setup.paths.push_back({"mhsa", "mhsa", [=] { return mhsa_attention(x, weights, heads, similarity); }, leaves});
  setup.grad_output = at::randn({c.batch, c.tokens, c.channels}, gen, options.dtype(at::kFloat)).to(c.dtype);
  return setup;
}

std::string bytes_text(double bytes) {
  char text[32];
  if (bytes >= static_cast<double>(1ull << 30)) {
    std::snprintf(text, sizeof(text), "%.2f GiB", bytes / static_cast<double>(1ull << 30));
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", bytes / static_cast<double>(1ull << 20));
  }
  return text;
}

}  // namespace

Level parse_level(const std::string& name) {
  if (name == "op") return Level::Op;
  if (name == "module") return Level::Module;
  TORCH_CHECK(false, "bench: level must be op or module, got '", name, "'");
}

const char* to_string(Level level) { return level == Level::Op ? "op" : "module"; }

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::ForwardBackward: return "forward+backward";
  }
  return "?";
}

c10::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float64") return at::kDouble;
  if (name == "bfloat16") return at::kBFloat16;
  TORCH_CHECK(false, "bench: dtype must be float32, float64 or bfloat16, got '", name, "'");
}

const char* dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kBFloat16: return "bfloat16";
    default: return c10::toString(dtype);
  }
}

void validate(const BenchConfig& c) {
  TORCH_CHECK(c.batch >= 1, "bench: batch must be at least 1, got ", c.batch);
  TORCH_CHECK(c.tokens >= 1, "bench: tokens (N) must be at least 1, got ", c.tokens);
  TORCH_CHECK(c.channels >= 1, "bench: channels (C) must be at least 1, got ", c.channels);
  TORCH_CHECK(c.heads >= 1 && c.channels % c.heads == 0, "bench: heads = ", c.heads,
              " must be at least 1 and divide channels = ", c.channels);
  TORCH_CHECK(c.k >= 1 && c.k <= c.tokens, "bench: k must be in [1, tokens = ", c.tokens, "], got ", c.k);
  TORCH_CHECK(c.iters >= 1, "bench: iters must be at least 1, got ", c.iters);
  TORCH_CHECK(c.warmup >= 0, "bench: warmup must be non-negative, got ", c.warmup);
  TORCH_CHECK(c.similarity == Similarity::Dot || c.similarity == Similarity::ScaledDot,
              "bench: similarity must be dot or scaled_dot (the reference is Algorithm 1), got ",
              to_string(c.similarity));
  TORCH_CHECK(c.dtype == at::kFloat || c.dtype == at::kDouble || c.dtype == at::kBFloat16,
              "bench: dtype must be float32, float64 or bfloat16, got ", c10::toString(c.dtype));
  TORCH_CHECK(c.reference_memory_cap > 0, "bench: the reference memory cap must be positive, got ",
              c.reference_memory_cap);
}

double reference_score_bytes(const BenchConfig& c) {
  return static_cast<double>(c.batch) * static_cast<double>(c.heads) * static_cast<double>(c.tokens) *
         static_cast<double>(c.tokens) * static_cast<double>(c10::elementSize(c.dtype));
}

TimeStats summarize(std::vector<double> samples_ms) {
  TORCH_CHECK(!samples_ms.empty(), "summarize: no samples");
  TimeStats stats;
  stats.samples_ms = samples_ms;
  std::sort(samples_ms.begin(), samples_ms.end());
  const auto quantile = [&](double q) {
    const double position = q * static_cast<double>(samples_ms.size() - 1);
    const auto below = static_cast<size_t>(std::floor(position));
    const auto above = std::min(below + 1, samples_ms.size() - 1);
    const double fraction = position - static_cast<double>(below);
    return samples_ms[below] + fraction * (samples_ms[above] - samples_ms[below]);
  };
  stats.median_ms = quantile(0.5);
  stats.p10_ms = quantile(0.1);
  stats.p90_ms = quantile(0.9);
  return stats;
}

CaseResult run_case(const BenchConfig& config) {
  validate(config);
  ScopedTrackingAllocator scoped;
  CaseResult result;
  result.config = config;
  const CostShape shape{config.batch,
                        config.tokens,
                        config.channels,
                        config.heads,
                        config.k,
                        config.aggregation == nn::Aggregation::Depthwise,
                        static_cast<int64_t>(c10::elementSize(config.dtype)),
                        config.similarity == Similarity::ScaledDot};
  const bool module_level = config.level == Level::Module;
  result.convnn_cost = module_level ? convnn_module_cost(shape) : convnn_op_cost(shape);
  if (module_level) result.mhsa_cost = mhsa_module_cost(shape);

  // The module's initial weights come from the default generator, the inputs from our own.
  at::manual_seed(config.seed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(config.seed);
  Setup setup = module_level ? make_module_setup(config, gen) : make_op_setup(config, gen);

  const double score_bytes = reference_score_bytes(config);
  const bool skip_reference = score_bytes > config.reference_memory_cap;

  // Validate before timing: both paths must compute the same function on these inputs.
  if (skip_reference) {
    result.max_abs_diff = result.max_abs_reference = std::numeric_limits<double>::quiet_NaN();
  } else {
    at::NoGradGuard no_grad;
    const auto reference = setup.paths[0].forward().to(at::kDouble);
    const auto fused = setup.paths[1].forward().to(at::kDouble);
    result.max_abs_diff = (fused - reference).abs().max().item<double>();
    result.max_abs_reference = reference.abs().max().item<double>();
  }

  auto& tracker = scoped.tracker();
  for (const auto& path : setup.paths) {
    PathResult row;
    row.name = path.name;
    row.workload = path.workload;
    if (path.name == "reference" && skip_reference) {
      row.skipped = true;
      row.skip_reason = "its [G,N,N] score matrix needs " + bytes_text(score_bytes) +
                        ", above the cap of " + bytes_text(config.reference_memory_cap);
    } else {
      row.phases = run_path(path, setup.grad_output, config, tracker);
    }
    result.paths.push_back(std::move(row));
  }
  return result;
}

MachinePeaks measure_machine(c10::ScalarType dtype) {
  MachinePeaks peaks;
  // GEMM: large enough to reach the BLAS's steady state, small enough for a second on 2 cores.
  constexpr int64_t kSide = 2048;
  constexpr int kGemmRepeats = 3, kCopyRepeats = 5;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  const auto a = at::randn({kSide, kSide}, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
  const auto b = at::randn({kSide, kSide}, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
  auto c = at::mm(a, b);  // warm-up: threads started, pages touched
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < kGemmRepeats; ++i) {
    const auto start = Clock::now();
    at::mm_out(c, a, b);
    best = std::min(best, elapsed_ms(start, Clock::now()) / 1e3);
  }
  peaks.gemm_size = kSide;
  peaks.flops_per_s = 2.0 * kSide * kSide * kSide / best;

  // Bandwidth: a copy much larger than any cache; it reads and writes every byte once.
  constexpr int64_t kBytes = int64_t{256} << 20;
  const auto src = at::ones({kBytes}, at::TensorOptions().dtype(at::kByte));
  auto dst = at::zeros({kBytes}, at::TensorOptions().dtype(at::kByte));  // touched before timing
  best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < kCopyRepeats; ++i) {
    const auto start = Clock::now();
    dst.copy_(src);
    best = std::min(best, elapsed_ms(start, Clock::now()) / 1e3);
  }
  peaks.copy_bytes = kBytes;
  peaks.bytes_per_s = 2.0 * static_cast<double>(kBytes) / best;
  return peaks;
}

}  // namespace convnn::bench
