#include "convnn/bench/bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/autograd.h>

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
#include "ops/generic/generic.h"
#include "util/enum_names.h"

namespace convnn::bench {
namespace {

constexpr detail::NameTable<Level, 2> kLevels{{{"op", Level::Op}, {"module", Level::Module}}};
constexpr detail::NameTable<Impl, 2> kImpls{{{"fused", Impl::Fused}, {"generic", Impl::Generic}}};
constexpr detail::NameTable<Phase, 3> kPhaseNames{
    {{"forward", Phase::Forward}, {"backward", Phase::Backward}, {"forward+backward", Phase::ForwardBackward}}};
constexpr detail::NameTable<c10::ScalarType, 3> kDtypes{
    {{"float32", c10::ScalarType::Float}, {"float64", c10::ScalarType::Double}, {"bfloat16", c10::ScalarType::BFloat16}}};

// The reference path is the paper's Algorithm 1 with dot-product scores: the similarities it has.
bool is_measured(Similarity similarity) {
  return similarity == Similarity::Dot || similarity == Similarity::ScaledDot;
}

using Clock = std::chrono::steady_clock;

double elapsed_ms(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double, std::milli>(end - start).count();
}

// The clock once `device` has finished the work queued so far. CPU ops return when done; an
// accelerator's kernels run asynchronously, so a clock read without a synchronisation would time
// their launches only.
Clock::time_point now_on(c10::Device device) {
  synchronize(device);
  return Clock::now();
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

// Where a phase's end and its bytes are read: on the CPU the tracking allocator, on an
// accelerator its caching allocator's statistics (the tracking allocator sees host memory only).
class Meter {
 public:
  Meter(c10::Device device, TrackingAllocator& tracker) : device_(device), tracker_(tracker) {}

  Clock::time_point now() const { return now_on(device_); }
  // Starts a peak window; returns the bytes in use now.
  size_t open_window() const {
    if (device_.is_cpu()) return tracker_.reset_peak();
    at::accelerator::resetPeakStats(device_.index());
    return static_cast<size_t>(device_allocated().current);
  }
  // The highest bytes in use since the last open_window().
  size_t peak() const {
    if (device_.is_cpu()) return tracker_.peak_bytes();
    return static_cast<size_t>(device_allocated().peak);
  }

 private:
  c10::CachingAllocator::Stat device_allocated() const {
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return at::accelerator::getDeviceStats(device_.index()).allocated_bytes[aggregate];
  }

  c10::Device device_;
  TrackingAllocator& tracker_;
};

size_t growth(size_t peak, size_t start) { return peak > start ? peak - start : 0; }

// Each iteration runs a fresh forward and then the backward on its graph, timed separately.
// forward+backward is the same iteration seen whole: the sum of its two times (they run back to
// back), and a peak over both windows measured from the forward's start.
std::vector<PhaseResult> run_path(const Path& path, const at::Tensor& grad_output,
                                  const BenchConfig& config, const Meter& meter) {
  std::vector<double> forward_ms, backward_ms, total_ms;
  size_t forward_peak = 0, backward_peak = 0, total_peak = 0;
  for (int64_t i = 0; i < config.warmup + config.iters; ++i) {
    path.reset_grads();
    const size_t forward_start = meter.open_window();
    const auto t0 = meter.now();
    auto output = path.forward();
    const auto t1 = meter.now();
    // The output and the saved graph are still alive: they are part of the forward's peak.
    const size_t forward_growth = growth(meter.peak(), forward_start);
    const size_t backward_start = meter.open_window();
    // What the forward left behind (output, saved tensors): the backward's peak sits on top of it.
    const size_t held = growth(backward_start, forward_start);
    const auto t2 = meter.now();
    output.backward(grad_output);
    const auto t3 = meter.now();
    const size_t backward_growth = growth(meter.peak(), backward_start);
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

// The generic ops as autograd nodes, each forward with its own *_backward, as the library's
// Autograd kernels pair them (src/ops/autograd): calling convnn::ops::generic directly bypasses the
// dispatcher, autograd included, and on CPU tensors the dispatcher would pick the fused kernels.
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class GenericAttention : public torch::autograd::Function<GenericAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& kernel, int64_t kn,
                               const std::string& similarity) {
    auto [output, scores, indices, weights] =
        ops::generic::knn_attention(q, k, v, kernel, c10::nullopt, kn, similarity, c10::nullopt,
                                    /*index_order=*/false, "softmax", 1.0);
    ctx->save_for_backward({q, k, v, kernel, scores, indices, weights});
    ctx->saved_data["similarity"] = similarity;
    return {output};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto [dq, dk, dv, dkernel, dbias] = ops::generic::knn_attention_backward(
        grads[0], s[0], s[1], s[2], s[3], s[4], s[5], s[6], ctx->saved_data["similarity"].toStringRef(),
        "softmax", 1.0,
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2), ctx->needs_input_grad(3),
         /*bias=*/false});
    return {dq, dk, dv, dkernel, at::Tensor(), at::Tensor()};
  }
};

class GenericSelect : public torch::autograd::Function<GenericSelect> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, int64_t kn,
                               const std::string& similarity) {
    auto [scores, indices] = ops::generic::knn_select(q, k, kn, similarity, c10::nullopt, /*index_order=*/false);
    ctx->save_for_backward({q, k, indices, scores});
    ctx->saved_data["similarity"] = similarity;
    ctx->mark_non_differentiable({indices});
    return {scores, indices};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto [dq, dk] = ops::generic::knn_select_backward(grads[0].defined() ? grads[0] : at::zeros_like(s[3]), s[0],
                                                      s[1], s[2], s[3], ctx->saved_data["similarity"].toStringRef());
    return {dq, dk, at::Tensor(), at::Tensor()};
  }
};

class GenericAggregate : public torch::autograd::Function<GenericAggregate> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& v, const at::Tensor& weights,
                               const at::Tensor& indices, const at::Tensor& kernel) {
    auto output = ops::generic::knn_aggregate(v, weights, indices, kernel, c10::nullopt);
    ctx->save_for_backward({v, weights, indices, kernel});
    return {output};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto [dv, dweights, dkernel, dbias] = ops::generic::knn_aggregate_backward(
        grads[0], s[0], s[1], s[2], s[3],
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(3), /*bias=*/false});
    return {dv, dweights, at::Tensor(), dkernel};
  }
};

// Everything one case needs, alive for the whole case: inputs, weights, the paths over them.
struct Setup {
  std::vector<Path> paths;  // reference, fused, composed, then sdpa (op level) or mhsa (module level)
  at::Tensor grad_output;   // the same upstream gradient for every path
  nn::ConvNNAttention module{nullptr};
};

at::Tensor generic_op(bool composed, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& kernel, int64_t neighbours, const std::string& similarity) {
  if (!composed) return GenericAttention::apply(q, k, v, kernel, neighbours, similarity)[0];
  const auto selected = GenericSelect::apply(q, k, neighbours, similarity);
  const auto weights = nn::functional::rho_weights(selected[0], nn::Rho::Softmax);
  return GenericAggregate::apply(v, weights, selected[1], kernel)[0];
}

at::Tensor fused_op(bool composed, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& kernel, int64_t neighbours, const std::string& similarity) {
  if (!composed) {
    return std::get<0>(ops::knn_attention(q, k, v, kernel, c10::nullopt, neighbours, similarity, c10::nullopt,
                                          /*index_order=*/false, "softmax", 1.0));
  }
  auto [scores, indices] = ops::knn_select(q, k, neighbours, similarity, c10::nullopt, /*index_order=*/false);
  const auto weights = nn::functional::rho_weights(scores, nn::Rho::Softmax);
  return ops::knn_aggregate(v, weights, indices, kernel, c10::nullopt);
}

// Random tensors are drawn in float32 on the CPU and then converted and moved, so that one seed
// gives the same values (up to rounding) in every dtype and on every device.
Setup make_op_setup(const BenchConfig& c, at::Generator& gen) {
  const auto options = at::TensorOptions().dtype(c.dtype).device(c.device);
  const int64_t g = c.batch * c.heads, d = c.channels / c.heads;
  const bool depthwise = c.aggregation == nn::Aggregation::Depthwise;
  auto leaf = [&](at::IntArrayRef shape, double scale) {
    return (at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * scale).to(options).requires_grad_(true);
  };
  auto q = leaf({g, c.tokens, d}, 1.0), k = leaf({g, c.tokens, d}, 1.0), v = leaf({g, c.tokens, d}, 1.0);
  auto kernel = depthwise ? leaf({d, c.k}, 1.0) : leaf({d, d, c.k}, 1.0 / std::sqrt(static_cast<double>(d * c.k)));
  Setup setup;
  const std::vector<at::Tensor> leaves{q, k, v, kernel};
  const auto similarity = c.similarity;
  const int64_t kn = c.k;
  const auto impl = c.impl;
  setup.paths.push_back({"reference", "convnn",
                         [=] { return reference_conv_nn(q, k, v, kernel, kn, similarity); }, leaves});
  setup.paths.push_back({to_string(impl), "convnn",
                         [=] { return convnn_op(impl, /*composed=*/false, q, k, v, kernel, kn, similarity); },
                         leaves});
  setup.paths.push_back({"composed", "convnn",
                         [=] { return convnn_op(impl, /*composed=*/true, q, k, v, kernel, kn, similarity); },
                         leaves});
  // The anchor: dense attention on the same tensors, with the same scale.
  const std::optional<double> scale =
      similarity == Similarity::ScaledDot ? std::nullopt : std::optional<double>(1.0);
  setup.paths.push_back({kDenseOpPath, "mhsa",
                         [=] { return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale); },
                         {q, k, v}});
  setup.grad_output = at::randn({g, c.tokens, d}, gen, at::TensorOptions().dtype(at::kFloat)).to(options);
  return setup;
}

Setup make_module_setup(const BenchConfig& c, at::Generator& gen) {
  const auto options = at::TensorOptions().dtype(c.dtype).device(c.device);
  const auto drawn = at::TensorOptions().dtype(at::kFloat);
  Setup setup;
  const auto module_options =
      nn::ConvNNAttentionOptions(c.channels, c.heads, c.k).similarity(c.similarity).aggregation(c.aggregation);
  setup.module = nn::ConvNNAttention(module_options);
  setup.module->to(c.device, c.dtype);
  // The same layer on the composed path (knn_select, rho, knn_aggregate), with the same weights.
  nn::ConvNNAttention composed(nn::ConvNNAttentionOptions(module_options).fused(false));
  composed->to(c.device, c.dtype);
  {
    at::NoGradGuard no_grad;
    const auto fused_parameters = setup.module->named_parameters();
    for (auto& p : composed->named_parameters()) p.value().copy_(fused_parameters[p.key()]);
  }
  auto x = at::randn({c.batch, c.tokens, c.channels}, gen, drawn).to(options).requires_grad_(true);
  std::vector<at::Tensor> leaves{x}, composed_leaves{x};
  for (const auto& p : setup.module->parameters()) leaves.push_back(p);
  for (const auto& p : composed->parameters()) composed_leaves.push_back(p);
  const auto weights = attention_weights(*setup.module);
  const int64_t heads = c.heads, kn = c.k;
  const auto similarity = c.similarity;
  auto module = setup.module;
  setup.paths.push_back({"reference", "convnn",
                         [=] { return reference_attention(x, weights, heads, kn, similarity); }, leaves});
  // Off the CPU the layer's ops have no fused kernel: the dispatcher runs the generic ones.
  setup.paths.push_back({to_string(c.impl), "convnn", [=]() mutable { return module(x); }, leaves});
  setup.paths.push_back({"composed", "convnn", [=]() mutable { return composed(x); }, composed_leaves});
  setup.paths.push_back(
      {kDenseModulePath, "mhsa", [=] { return mhsa_attention(x, weights, heads, similarity); }, leaves});
  setup.grad_output = at::randn({c.batch, c.tokens, c.channels}, gen, drawn).to(options);
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

void synchronize(c10::Device device) {
  if (!device.is_cpu()) at::accelerator::synchronizeDevice(device.index());
}

Level parse_level(const std::string& name) { return detail::parse_name(kLevels, name, "bench: level"); }
const char* to_string(Level level) { return detail::name_of(kLevels, level); }
const std::vector<std::string>& level_names() { return detail::table_names<kLevels>(); }

at::Tensor convnn_op(Impl impl, bool composed, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& kernel, int64_t neighbours, Similarity similarity) {
  const std::string name = to_string(similarity);
  return impl == Impl::Generic ? generic_op(composed, q, k, v, kernel, neighbours, name)
                               : fused_op(composed, q, k, v, kernel, neighbours, name);
}

Impl parse_impl(const std::string& name) { return detail::parse_name(kImpls, name, "bench: impl"); }
const char* to_string(Impl impl) { return detail::name_of(kImpls, impl); }
const std::vector<std::string>& impl_names() { return detail::table_names<kImpls>(); }

const char* to_string(Phase phase) { return detail::name_of(kPhaseNames, phase); }
const std::vector<std::string>& phase_names() { return detail::table_names<kPhaseNames>(); }

const std::vector<std::string>& similarity_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> measured;
    for (const auto& name : convnn::similarity_names()) {
      if (is_measured(parse_similarity(name))) measured.push_back(name);
    }
    return measured;
  }();
  return names;
}

c10::ScalarType parse_dtype(const std::string& name) { return detail::parse_name(kDtypes, name, "bench: dtype"); }

const char* dtype_name(c10::ScalarType dtype) {
  for (const auto& [name, value] : kDtypes) {
    if (value == dtype) return name;
  }
  return c10::toString(dtype);  // for a message about a dtype the bench does not measure
}

const std::vector<std::string>& dtype_names() { return detail::table_names<kDtypes>(); }

void validate(const BenchConfig& c) {
  TORCH_CHECK(c.batch >= 1, "bench: batch must be at least 1, got ", c.batch);
  TORCH_CHECK(c.tokens >= 1, "bench: tokens (N) must be at least 1, got ", c.tokens);
  TORCH_CHECK(c.channels >= 1, "bench: channels (C) must be at least 1, got ", c.channels);
  TORCH_CHECK(c.heads >= 1 && c.channels % c.heads == 0, "bench: heads = ", c.heads,
              " must be at least 1 and divide channels = ", c.channels);
  TORCH_CHECK(c.k >= 1 && c.k <= c.tokens, "bench: k must be in [1, tokens = ", c.tokens, "], got ", c.k);
  TORCH_CHECK(c.iters >= 1, "bench: iters must be at least 1, got ", c.iters);
  TORCH_CHECK(c.warmup >= 0, "bench: warmup must be non-negative, got ", c.warmup);
  TORCH_CHECK(is_measured(c.similarity), "bench: similarity must be one of ", c10::Join(", ", similarity_names()),
              " (the reference is Algorithm 1), got ", to_string(c.similarity));
  const auto& dtypes = dtype_names();
  TORCH_CHECK(std::find(dtypes.begin(), dtypes.end(), dtype_name(c.dtype)) != dtypes.end(),
              "bench: dtype must be one of ", c10::Join(", ", dtypes), ", got ", c10::toString(c.dtype));
  TORCH_CHECK(c.reference_memory_cap > 0, "bench: the reference memory cap must be positive, got ",
              c.reference_memory_cap);
  TORCH_CHECK(c.device.is_cpu() || c.device.has_index(), "bench: device ", c.device.str(),
              " must have an index (convnn::resolve_device gives one)");
  TORCH_CHECK(c.impl == Impl::Generic || c.device.is_cpu(), "bench: impl fused has kernels only on the CPU, "
              "got device ", c.device.str(), "; use impl generic (the device-generic ops) there");
  TORCH_CHECK(c.impl == Impl::Fused || c.level == Level::Op || !c.device.is_cpu(),
              "bench: impl generic at level module needs a device other than the CPU, got device ",
              c.device.str(), ": ConvNNAttention's ops reach the fused kernels on CPU tensors; use level op "
              "to time the generic ops on the CPU");
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
  result.mhsa_cost = module_level ? mhsa_module_cost(shape) : mhsa_op_cost(shape);

  // The module's initial weights come from the default generator, the inputs from our own.
  at::manual_seed(config.seed);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(config.seed);
  Setup setup = module_level ? make_module_setup(config, gen) : make_op_setup(config, gen);

  const double score_bytes = reference_score_bytes(config);
  const bool skip_reference = score_bytes > config.reference_memory_cap;

  // Validate before timing: the impl's path and the reference must compute the same function on
  // these inputs.
  if (skip_reference) {
    result.max_abs_diff = result.max_abs_reference = std::numeric_limits<double>::quiet_NaN();
  } else {
    at::NoGradGuard no_grad;
    const auto reference = setup.paths[0].forward().to(at::kDouble);
    const auto measured = setup.paths[1].forward().to(at::kDouble);
    const auto difference = (measured - reference).abs();
    result.max_abs_diff = difference.max().item<double>();
    result.max_abs_reference = reference.abs().max().item<double>();
    // Relative rounding of the dtype's sums, generous: a row beyond it picked other neighbours.
    const double tolerance = (config.dtype == at::kBFloat16 ? 5e-2 : 1e-4) * result.max_abs_reference;
    const auto per_row = difference.flatten(0, -2).amax(-1);
    result.rows = per_row.numel();
    result.rows_beyond_rounding = per_row.gt(tolerance).sum().item<int64_t>();
  }

  const Meter meter(config.device, scoped.tracker());
  for (const auto& path : setup.paths) {
    PathResult row;
    row.name = path.name;
    row.workload = path.workload;
    if (path.name == "reference" && skip_reference) {
      row.skipped = true;
      row.skip_reason = "its [G,N,N] score matrix needs " + bytes_text(score_bytes) +
                        ", above the cap of " + bytes_text(config.reference_memory_cap);
    } else {
      row.phases = run_path(path, setup.grad_output, config, meter);
    }
    result.paths.push_back(std::move(row));
  }
  return result;
}

MachinePeaks measure_machine(c10::ScalarType dtype, c10::Device device) {
  MachinePeaks peaks;
  // The fastest of `repeats` runs of `work`, in seconds, read after the device has finished it.
  const auto best_seconds = [&](int repeats, const std::function<void()>& work) {
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i < repeats; ++i) {
      const auto start = now_on(device);
      work();
      best = std::min(best, elapsed_ms(start, now_on(device)) / 1e3);
    }
    return best;
  };
  // GEMM: large enough to reach the BLAS's steady state, small enough for a second on 2 cores.
  constexpr int64_t kSide = 2048;
  constexpr int kGemmRepeats = 3, kCopyRepeats = 5;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  const auto a = at::randn({kSide, kSide}, gen, at::TensorOptions().dtype(at::kFloat)).to(options);
  const auto b = at::randn({kSide, kSide}, gen, at::TensorOptions().dtype(at::kFloat)).to(options);
  auto c = at::mm(a, b);  // warm-up: threads started, pages touched
  peaks.gemm_size = kSide;
  peaks.flops_per_s = 2.0 * kSide * kSide * kSide / best_seconds(kGemmRepeats, [&] { at::mm_out(c, a, b); });

  // Bandwidth: a copy much larger than any cache; it reads and writes every byte once.
  constexpr int64_t kBytes = int64_t{256} << 20;
  const auto src = at::ones({kBytes}, options.dtype(at::kByte));
  auto dst = at::zeros({kBytes}, options.dtype(at::kByte));  // touched before timing
  peaks.copy_bytes = kBytes;
  peaks.bytes_per_s = 2.0 * static_cast<double>(kBytes) / best_seconds(kCopyRepeats, [&] { dst.copy_(src); });
  return peaks;
}

}  // namespace convnn::bench
