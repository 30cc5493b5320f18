#pragma once
// The measurements behind `convnn bench`: the reference path (the paper's Algorithm 1 in plain
// ATen) and the fused path (convnn's ops or ConvNNAttention) side by side, in one process, on the
// same seeded inputs and weights; module level adds multi-head self-attention. Each phase
// (forward, backward, forward+backward) is timed and its peak memory taken from
// TrackingAllocator (on the CPU) or the device allocator's peak statistics (on an accelerator).
// Method and rules: docs/benchmarks.md.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "convnn/bench/cost_model.h"
#include "convnn/nn/options/convnn.h"
#include "convnn/ops/similarity.h"

namespace convnn::bench {

/// op: knn_select + softmax rho + knn_aggregate on [G,N,d] (G = batch * heads).
/// module: ConvNNAttention on [B,N,C], plus multi-head self-attention.
enum class Level { Op, Module };
Level parse_level(const std::string& name);
const char* to_string(Level level);
/// The levels' names (op, module): the one table parse_level and to_string read.
const std::vector<std::string>& level_names();

/// Which implementation of the ConvNN ops is measured. fused: convnn's CPU kernels, reached through
/// the dispatcher (CPU only). generic: the device-generic plain-ATen ops (convnn::ops::generic); at
/// op level they are called directly (on CPU tensors the dispatcher would pick the fused kernels),
/// at module level they are what the dispatcher runs on a device without fused kernels.
enum class Impl { Fused, Generic };
/// "fused" or "generic"; anything else throws c10::Error naming the text and the choices.
Impl parse_impl(const std::string& name);
/// Also the name of that implementation's path in a CaseResult.
const char* to_string(Impl impl);
/// fused, generic: the one table parse_impl and to_string read (a command line adds "auto").
const std::vector<std::string>& impl_names();

/// What the op level times for `impl` on queries, keys, values [G,N,d] and a shared kernel: the
/// impl's knn_attention (select, softmax rho and aggregation in one), or with `composed` its
/// knn_select, softmax rho and knn_aggregate. Differentiable in all four tensors. The generic impl
/// calls convnn::ops::generic directly, with autograd nodes pairing each op with its backward.
at::Tensor convnn_op(Impl impl, bool composed, const at::Tensor& queries, const at::Tensor& keys,
                     const at::Tensor& values, const at::Tensor& kernel, int64_t k, Similarity similarity);

enum class Phase { Forward, Backward, ForwardBackward };
const char* to_string(Phase phase);
/// forward, backward, forward+backward, in kPhases order.
const std::vector<std::string>& phase_names();

/// The similarities the bench measures, in convnn::similarity_names() order: those of the
/// reference path (Algorithm 1 with dot-product scores), dot and scaled_dot.
const std::vector<std::string>& similarity_names();
inline constexpr Phase kPhases[] = {Phase::Forward, Phase::Backward, Phase::ForwardBackward};

struct BenchConfig {
  Level level = Level::Module;
  int64_t batch = 32;
  int64_t tokens = 197;     // N
  int64_t channels = 768;   // C; d = C / heads
  int64_t heads = 12;
  int64_t k = 8;
  nn::Aggregation aggregation = nn::Aggregation::Depthwise;
  Similarity similarity = Similarity::ScaledDot;
  c10::ScalarType dtype = c10::ScalarType::Float;
  int64_t iters = 10;
  int64_t warmup = 2;
  uint64_t seed = 0;
  Impl impl = Impl::Fused;
  /// Where every path runs; an accelerator device must be present (convnn::resolve_device).
  c10::Device device = c10::Device(c10::kCPU);
  /// The reference path is skipped when its [G,N,N] score matrix would exceed this many bytes.
  double reference_memory_cap = 8.0 * (1ull << 30);
};

/// Throws c10::Error, one line naming the field, when a size or count is out of range, or when the
/// impl cannot run on the device: fused has kernels only on the CPU, and generic at module level
/// needs a device without fused kernels (on the CPU, ConvNNAttention's ops reach the fused ones).
void validate(const BenchConfig& config);

/// Bytes of the reference path's [G,N,N] score matrix.
double reference_score_bytes(const BenchConfig& config);

/// Median and 10th / 90th percentiles (linear interpolation between order statistics).
struct TimeStats {
  double median_ms = 0.0, p10_ms = 0.0, p90_ms = 0.0;
  std::vector<double> samples_ms;
};
TimeStats summarize(std::vector<double> samples_ms);

/// Every iteration times a fresh forward (autograd recording) and the backward on its graph;
/// forward+backward is that iteration whole: the sum of the two times, and the high-water mark of
/// both above the bytes in use when the forward started.
struct PhaseResult {
  Phase phase = Phase::Forward;
  TimeStats time;
  /// Max bytes in use during the phase minus bytes in use at its start, max over iterations.
  int64_t peak_bytes = 0;
};

struct PathResult {
  /// "reference"; the impl's own op or layer, named to_string(config.impl) ("fused" or
  /// "generic"); "composed" (that impl's knn_select, rho and knn_aggregate); or the dense anchor,
  /// dense_path(level).
  std::string name;
  std::string workload;  // cost model it is charged with: "convnn" or "mhsa"
  bool skipped = false;
  std::string skip_reason;
  std::vector<PhaseResult> phases;  // in kPhases order; empty when skipped
};

/// The dense-attention anchor of each level: "sdpa" (scaled_dot_product_attention on the op's
/// folded q, k, v) and "mhsa" (multi-head self-attention with the module's projections).
inline constexpr const char* kDenseOpPath = "sdpa";
inline constexpr const char* kDenseModulePath = "mhsa";
inline const char* dense_path(Level level) { return level == Level::Op ? kDenseOpPath : kDenseModulePath; }

struct CaseResult {
  BenchConfig config;
  CostModel convnn_cost;
  CostModel mhsa_cost;  // of the dense path: mhsa_op_cost or mhsa_module_cost
  std::vector<PathResult> paths;
  /// Forward outputs of the impl's path and the reference path on the same inputs, compared before
  /// any timing: max |impl - reference| and max |reference| (NaN when the reference was skipped).
  double max_abs_diff = 0.0;
  double max_abs_reference = 0.0;
  /// Output rows (one query's channels) whose difference exceeds the dtype's rounding
  /// (kRowTolerance x max |reference|), of all rows: a row picks other neighbours where its K-th
  /// and (K+1)-th scores tie to rounding, and two GEMMs round differently (seen on an H100: one
  /// row in 75,648 at the paper's op-level configuration in float32).
  int64_t rows_beyond_rounding = 0;
  int64_t rows = 0;
};

/// Waits until `device` has finished the work queued so far (a no-op on the CPU, whose ops return
/// when done): a clock read after it times the work, not only its launches.
void synchronize(c10::Device device);

/// Runs every path of one configuration with the tracking allocator installed.
CaseResult run_case(const BenchConfig& config);

/// Measures the device's ceilings once: the best of a few square at::mm of side 2048 in `dtype`,
/// and the best of a few copies of a 256 MiB tensor (bandwidth counts read + write bytes).
MachinePeaks measure_machine(c10::ScalarType dtype, c10::Device device = c10::Device(c10::kCPU));

/// A name of dtype_names(); anything else throws c10::Error naming the text and the choices.
c10::ScalarType parse_dtype(const std::string& name);
/// The name dtype_names() gives `dtype` (c10's name for a dtype the bench does not measure).
const char* dtype_name(c10::ScalarType dtype);
/// float32, float64, bfloat16: the dtypes the bench measures, from the table parse_dtype reads.
const std::vector<std::string>& dtype_names();

}  // namespace convnn::bench
