// `convnn bench`: the reference path (the paper's Algorithm 1 in plain ATen) and convnn's path
// side by side, per phase: median / p10 / p90 time, peak memory, GFLOP/s and GB/s against the rules
// of docs/benchmarks.md, the roofline floor, and impl/reference ratios. --impl picks convnn's
// path (fused CPU kernels or the device-generic ops), --device where everything runs. --sweep
// grows N and K at op level. Prints a table, or JSON with every number.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "bench_data.h"
#include "commands.h"
#include "model_options.h"
#include "convnn/bench/bench.h"
#include "convnn/bench/sequence_bench.h"
#include "convnn/util/device.h"

namespace convnn::cli {
namespace {

using bench::CaseResult;
using bench::CostModel;
using bench::MachinePeaks;
using bench::PathResult;
using bench::Phase;
using bench::PhaseCost;
using bench::PhaseResult;

// The flags, by name as typed; their defaults are bench::BenchConfig's (what --help shows).
const bench::BenchConfig kDefaults;

struct BenchArgs {
  std::string level = bench::to_string(kDefaults.level);
  int64_t batch = kDefaults.batch, tokens = kDefaults.tokens, channels = kDefaults.channels,
          heads = kDefaults.heads, k = kDefaults.k;
  std::string aggregation = nn::to_string(kDefaults.aggregation), similarity = to_string(kDefaults.similarity),
              dtype = bench::dtype_name(kDefaults.dtype);
  // auto: the impl follows the device (config_of), as the device follows the machine.
  std::string impl = "auto", device = "auto";
  int64_t iters = kDefaults.iters, warmup = kDefaults.warmup, seed = static_cast<int64_t>(kDefaults.seed);
  double memory_cap_gib = kDefaults.reference_memory_cap / (1ull << 30);
  bool json = false;
  bool sweep = false;
  std::vector<int64_t> sweep_n{197, 1024, 3136, 4096}, sweep_k{8, 9, 16, 25, 100};
  int64_t sweep_batch = 1, sweep_iters = 3, sweep_warmup = 1;
  bool sequence = false;
  bench::SequenceBenchConfig sequence_config;  // its sizes; k, dtype, device and seed from the flags above
};

constexpr double kMiB = 1024.0 * 1024.0;

bench::BenchConfig config_of(const BenchArgs& a) {
  bench::BenchConfig c;
  c.level = bench::parse_level(a.level);
  c.batch = a.batch;
  c.tokens = a.tokens;
  c.channels = a.channels;
  c.heads = a.heads;
  c.k = a.k;
  c.aggregation = nn::parse_aggregation(a.aggregation);
  c.similarity = parse_similarity(a.similarity);
  c.dtype = bench::parse_dtype(a.dtype);
  c.iters = a.iters;
  c.warmup = a.warmup;
  TORCH_CHECK(a.seed >= 0, "bench: seed must be non-negative, got ", a.seed);
  c.seed = static_cast<uint64_t>(a.seed);
  TORCH_CHECK(a.memory_cap_gib > 0, "bench: --memory-cap must be positive, got ", a.memory_cap_gib);
  c.reference_memory_cap = a.memory_cap_gib * 1024.0 * kMiB;
  c.device = resolve_device(a.device, "--device");
  // auto: the fused kernels where they exist (the CPU), the generic path on every other device.
  c.impl = a.impl == "auto" ? (c.device.is_cpu() ? bench::Impl::Fused : bench::Impl::Generic)
                            : bench::parse_impl(a.impl);
  return c;
}

const CostModel& cost_of(const CaseResult& r, const PathResult& path) {
  return path.workload == "mhsa" ? r.mhsa_cost : r.convnn_cost;
}

const PhaseCost& phase_cost(const CostModel& model, Phase phase) {
  switch (phase) {
    case Phase::Forward: return model.forward;
    case Phase::Backward: return model.backward;
    case Phase::ForwardBackward: return model.forward_backward;
  }
  return model.forward;
}

const PathResult* find_path(const CaseResult& r, const std::string& name) {
  for (const auto& p : r.paths) {
    if (p.name == name && !p.skipped) return &p;
  }
  return nullptr;
}

const PhaseResult& phase_of(const PathResult& path, Phase phase) {
  for (const auto& p : path.phases) {
    if (p.phase == phase) return p;
  }
  TORCH_CHECK(false, "bench: path ", path.name, " has no ", bench::to_string(phase), " phase");
}

// The impl's own path ("fused" or "generic"), the numerator of every ratio.
std::string measured(const CaseResult& r) { return bench::to_string(r.config.impl); }

std::optional<double> ratio(double numerator, double denominator) {
  if (!(denominator > 0) || !std::isfinite(numerator)) return std::nullopt;
  return numerator / denominator;
}

// Time and memory ratios numerator/denominator for one phase; empty when a side is missing.
struct Ratio {
  std::optional<double> time, memory;
};
Ratio phase_ratio(const CaseResult& r, const std::string& numerator, const std::string& denominator,
                  Phase phase) {
  const auto* a = find_path(r, numerator);
  const auto* b = find_path(r, denominator);
  if (a == nullptr || b == nullptr) return {};
  const auto& pa = phase_of(*a, phase);
  const auto& pb = phase_of(*b, phase);
  return {ratio(pa.time.median_ms, pb.time.median_ms),
          ratio(static_cast<double>(pa.peak_bytes), static_cast<double>(pb.peak_bytes))};
}

std::string ratio_text(const std::optional<double>& value) {
  return value ? fmt::format("{:.2f}x", *value) : std::string("-");
}

std::string describe(const bench::BenchConfig& c) {
  return fmt::format("batch {}, tokens {}, channels {}, heads {} (d {}), k {}, {}, {}, softmax rho, {}; "
                     "impl {}, device {}",
                     c.batch, c.tokens, c.channels, c.heads, c.channels / c.heads, c.k,
                     nn::to_string(c.aggregation), to_string(c.similarity), bench::dtype_name(c.dtype),
                     bench::to_string(c.impl), device_name(c.device));
}

// ------------------------------------------------------------------------------------ JSON

nlohmann::json cost_json(const CostModel& model) {
  nlohmann::json terms = nlohmann::json::array();
  for (const auto& t : model.terms) {
    terms.push_back({{"name", t.name}, {"forward_flops", t.forward_flops}, {"backward_flops", t.backward_flops}});
  }
  const auto phase = [](const PhaseCost& p) { return nlohmann::json{{"flops", p.flops}, {"bytes", p.bytes}}; };
  return {{"terms", terms},
          {"forward", phase(model.forward)},
          {"backward", phase(model.backward)},
          {"forward+backward", phase(model.forward_backward)}};
}

nlohmann::json case_json(const CaseResult& r, const MachinePeaks& machine) {
  const auto& c = r.config;
  nlohmann::json out;
  out["config"] = {{"level", bench::to_string(c.level)},
                   {"batch", c.batch},
                   {"tokens", c.tokens},
                   {"channels", c.channels},
                   {"heads", c.heads},
                   {"head_dim", c.channels / c.heads},
                   {"k", c.k},
                   {"aggregation", nn::to_string(c.aggregation)},
                   {"similarity", to_string(c.similarity)},
                   {"rho", "softmax"},
                   {"dtype", bench::dtype_name(c.dtype)},
                   {"impl", bench::to_string(c.impl)},
                   {"device", device_name(c.device)},
                   {"iters", c.iters},
                   {"warmup", c.warmup},
                   {"seed", c.seed},
                   {"reference_memory_cap_bytes", c.reference_memory_cap}};
  out["check"] = {{"max_abs_diff_" + measured(r) + "_vs_reference", r.max_abs_diff},
                  {"max_abs_reference", r.max_abs_reference},
                  {"rows_beyond_rounding", r.rows_beyond_rounding},
                  {"rows", r.rows}};
  out["costs"] = {{"convnn", cost_json(r.convnn_cost)}};
  out["costs"]["mhsa"] = cost_json(r.mhsa_cost);
  out["paths"] = nlohmann::json::array();
  for (const auto& path : r.paths) {
    nlohmann::json p{{"name", path.name}, {"workload", path.workload}, {"skipped", path.skipped}};
    if (path.skipped) p["skip_reason"] = path.skip_reason;
    for (const auto& ph : path.phases) {
      const auto& cost = phase_cost(cost_of(r, path), ph.phase);
      const double seconds = ph.time.median_ms / 1e3;
      p["phases"][bench::to_string(ph.phase)] = {
          {"median_ms", ph.time.median_ms},
          {"p10_ms", ph.time.p10_ms},
          {"p90_ms", ph.time.p90_ms},
          {"samples_ms", ph.time.samples_ms},
          {"peak_bytes", ph.peak_bytes},
          {"gflops_per_s", cost.flops / seconds / 1e9},
          {"gbytes_per_s", cost.bytes / seconds / 1e9},
          {"roofline_floor_ms", bench::roofline_floor_s(cost, machine) * 1e3}};
    }
    out["paths"].push_back(p);
  }
  const auto ratios = [&](const std::string& a, const std::string& b) {
    nlohmann::json j;
    for (const auto phase : bench::kPhases) {
      const auto ra = phase_ratio(r, a, b, phase);
      j[bench::to_string(phase)] = {{"time", ra.time ? nlohmann::json(*ra.time) : nlohmann::json()},
                                    {"peak_memory", ra.memory ? nlohmann::json(*ra.memory) : nlohmann::json()}};
    }
    return j;
  };
  const auto name = measured(r);
  out["ratios"][name + "/reference"] = ratios(name, "reference");
  out["ratios"][name + "/composed"] = ratios(name, "composed");
  const std::string dense = bench::dense_path(c.level);
  out["ratios"][name + "/" + dense] = ratios(name, dense);
  return out;
}

// ----------------------------------------------------------------------------------- tables

void print_machine(const MachinePeaks& m, c10::ScalarType dtype, const c10::Device& device) {
  std::cout << fmt::format("torch {}, {} threads; {} ceilings: GEMM {:.1f} GFLOP/s (at::mm {}x{}, {}), "
                           "copy {:.1f} GB/s ({} MiB, read + write)\n",
                           TORCH_VERSION, at::get_num_threads(), device_name(device), m.flops_per_s / 1e9, m.gemm_size,
                           m.gemm_size, bench::dtype_name(dtype), m.bytes_per_s / 1e9,
                           m.copy_bytes / (1 << 20));
}

void print_case(const CaseResult& r, const MachinePeaks& machine) {
  const auto& c = r.config;
  std::cout << fmt::format("{} level: {}\n", bench::to_string(c.level), describe(c));
  std::cout << fmt::format("{} iterations after {} warm-up per phase; peak = allocator high-water mark above "
                           "the bytes in use when the phase starts\n",
                           c.iters, c.warmup);
  if (std::isnan(r.max_abs_diff)) {
    std::cout << fmt::format("check: reference skipped, {} output not compared\n\n", measured(r));
  } else {
    std::cout << fmt::format("check: max |{} - reference| = {:.3e} (max |reference| = {:.3e}); output rows "
                             "beyond rounding: {} of {} (near-tied K-th neighbours, picked apart by rounding)\n\n",
                             measured(r), r.max_abs_diff, r.max_abs_reference, r.rows_beyond_rounding, r.rows);
  }
  const auto header = fmt::format("{:<17} {:<10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8} {:>9}", "phase",
                                  "path", "median ms", "p10 ms", "p90 ms", "peak MiB", "GFLOP/s", "GB/s",
                                  "floor ms");
  std::cout << header << "\n" << std::string(header.size(), '-') << "\n";
  for (const auto phase : bench::kPhases) {
    bool first = true;
    for (const auto& path : r.paths) {
      const std::string label = first ? bench::to_string(phase) : "";
      first = false;
      if (path.skipped) {
        std::cout << fmt::format("{:<17} {:<10} skipped: {}\n", label, path.name, path.skip_reason);
        continue;
      }
      const auto& ph = phase_of(path, phase);
      const auto& cost = phase_cost(cost_of(r, path), phase);
      const double seconds = ph.time.median_ms / 1e3;
      std::cout << fmt::format("{:<17} {:<10} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.1f} {:>9.1f} {:>8.2f} {:>9.2f}\n",
                               label, path.name, ph.time.median_ms, ph.time.p10_ms, ph.time.p90_ms,
                               ph.peak_bytes / kMiB, cost.flops / seconds / 1e9, cost.bytes / seconds / 1e9,
                               bench::roofline_floor_s(cost, machine) * 1e3);
    }
  }
  std::cout << "\n";
  const auto print_ratios = [&](const std::string& a, const std::string& b) {
    std::cout << fmt::format("{:<20}", a + " / " + b);
    for (const auto phase : bench::kPhases) {
      const auto ra = phase_ratio(r, a, b, phase);
      std::cout << fmt::format("  {}: time {}, memory {}", bench::to_string(phase), ratio_text(ra.time),
                               ratio_text(ra.memory));
    }
    std::cout << "\n";
  };
  print_ratios(measured(r), "reference");
  print_ratios(measured(r), "composed");
  print_ratios(measured(r), bench::dense_path(c.level));
}

void print_sweep(const std::vector<CaseResult>& cases, const MachinePeaks& machine) {
  const auto header = fmt::format("{:>5} {:>4}  {:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>8}",
                                  "N", "K", "path", "fwd ms", "bwd ms", "f+b ms", "fwd MiB", "bwd MiB",
                                  "f+b MiB", "f+b floor", "f+b t/r", "f+b m/r");
  std::cout << header << "\n" << std::string(header.size(), '-') << "\n";
  for (const auto& r : cases) {
    for (const auto& path : r.paths) {
      const auto prefix = fmt::format("{:>5} {:>4}  {:<10}", r.config.tokens, r.config.k, path.name);
      if (path.skipped) {
        std::cout << prefix << " skipped: " << path.skip_reason << "\n";
        continue;
      }
      const auto& f = phase_of(path, Phase::Forward);
      const auto& b = phase_of(path, Phase::Backward);
      const auto& fb = phase_of(path, Phase::ForwardBackward);
      const auto floor_ms = bench::roofline_floor_s(phase_cost(cost_of(r, path), Phase::ForwardBackward), machine) * 1e3;
      std::string ratios;
      if (path.name == measured(r)) {
        const auto ra = phase_ratio(r, path.name, "reference", Phase::ForwardBackward);
        ratios = fmt::format(" {:>8} {:>8}", ratio_text(ra.time), ratio_text(ra.memory));
      }
      std::cout << prefix
                << fmt::format(" {:>9.2f} {:>9.2f} {:>9.2f} {:>9.1f} {:>9.1f} {:>9.1f} {:>10.2f}", f.time.median_ms,
                               b.time.median_ms, fb.time.median_ms, f.peak_bytes / kMiB, b.peak_bytes / kMiB,
                               fb.peak_bytes / kMiB, floor_ms)
                << ratios << "\n";
    }
  }
  std::cout << fmt::format("(times are medians; t/r and m/r: {} / reference time and peak memory)\n",
                           cases.empty() ? std::string("fused") : measured(cases.front()));
}

// -------------------------------------------------------------------------------------- sequence

// The convnn row's time over the sdpa row's of the same workload and length, if both ran.
std::optional<double> sequence_ratio(const std::vector<bench::SequenceTiming>& rows, const bench::SequenceTiming& row,
                                     bool forward_backward) {
  if (row.path == "sdpa") return std::nullopt;
  for (const auto& other : rows) {
    if (other.path != "sdpa" || other.workload != row.workload || other.length != row.length) continue;
    const auto time = [&](const bench::SequenceTiming& t) {
      return forward_backward ? t.forward_backward.median_ms : t.forward.median_ms;
    };
    if (forward_backward && !(row.has_backward && other.has_backward)) return std::nullopt;
    return ratio(time(row), time(other));
  }
  return std::nullopt;
}

int run_sequence_bench(const BenchArgs& args) {
  const auto started = std::chrono::steady_clock::now();
  auto c = args.sequence_config;
  const auto base = config_of(args);
  c.k = base.k;
  c.dtype = base.dtype;
  c.device = base.device;
  c.seed = base.seed;
  bench::validate(c);
  const auto rows = bench::run_sequence_bench(c);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (args.json) {
    nlohmann::json out{{"torch_version", TORCH_VERSION}, {"threads", at::get_num_threads()}, {"mode", "sequence"},
                       {"batch", c.batch}, {"channels", c.channels}, {"heads", c.heads}, {"kv_heads", c.kv_heads},
                       {"k", c.k}, {"dtype", bench::dtype_name(c.dtype)}, {"device", device_name(c.device)},
                       {"iters", c.iters}, {"warmup", c.warmup}, {"wall_s", wall_s}};
    out["cases"] = nlohmann::json::array();
    for (const auto& row : rows) {
      nlohmann::json item{{"workload", row.workload}, {"length", row.length}, {"path", row.path},
                          {"tokens", row.tokens}, {"forward_ms", row.forward.median_ms},
                          {"forward_p10_ms", row.forward.p10_ms}, {"forward_p90_ms", row.forward.p90_ms}};
      if (row.has_backward) item["forward_backward_ms"] = row.forward_backward.median_ms;
      if (const auto r = sequence_ratio(rows, row, false)) item["forward_vs_sdpa"] = *r;
      if (const auto r = sequence_ratio(rows, row, true)) item["forward_backward_vs_sdpa"] = *r;
      out["cases"].push_back(item);
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("sequence cases: batch {}, channels {}, heads {} sharing {} key/value heads (d {}), K {}, "
                           "causal, {}, device {}, {} threads; {} iterations after {} warm-up\n\n",
                           c.batch, c.channels, c.heads, c.kv_heads, c.channels / c.heads, c.k,
                           bench::dtype_name(c.dtype), device_name(c.device), at::get_num_threads(), c.iters, c.warmup);
  const auto header = fmt::format("{:<8} {:>7}  {:<7} {:>8} {:>10} {:>10} {:>12} {:>9} {:>9}", "workload", "length",
                                  "path", "tokens", "fwd ms", "f+b ms", "fwd tok/s", "fwd c/s", "f+b c/s");
  std::cout << header << "\n" << std::string(header.size(), '-') << "\n";
  for (const auto& row : rows) {
    const auto backward = row.has_backward ? fmt::format("{:>10.2f}", row.forward_backward.median_ms)
                                           : fmt::format("{:>10}", "-");
    std::cout << fmt::format("{:<8} {:>7}  {:<7} {:>8} {:>10.2f} ", row.workload, row.length, row.path, row.tokens,
                             row.forward.median_ms)
              << backward
              << fmt::format(" {:>12.0f} {:>9} {:>9}\n", row.tokens / (row.forward.median_ms / 1e3),
                             ratio_text(sequence_ratio(rows, row, false)), ratio_text(sequence_ratio(rows, row, true)));
  }
  std::cout << "(times are medians; c/s: convnn / sdpa time for the same workload and length; causal: [B,N,C]; "
               "padded: the samples at N, 3N/4, ... in the batch with a key_padding_mask (sdpa: with the causal mask as one "
               "attn_mask); packed: those samples with cu_seqlens; decode: one token per sample against a cache "
               "of `length` tokens)\n";
  std::cout << fmt::format("\nfinished in {:.1f} s\n", wall_s);
  return 0;
}

// -------------------------------------------------------------------------------------- run

int run_bench(const BenchArgs& args) {
  const auto started = std::chrono::steady_clock::now();
  const auto base = config_of(args);
  std::vector<bench::BenchConfig> configs;
  std::vector<std::string> notes;
  if (args.sweep) {
    TORCH_CHECK(!args.sweep_n.empty() && !args.sweep_k.empty(), "bench: --sweep-n and --sweep-k must not be empty");
    for (const auto n : args.sweep_n) {
      for (const auto k : args.sweep_k) {
        if (k > n) {
          notes.push_back(fmt::format("N = {}, K = {} skipped: K > N", n, k));
          continue;
        }
        auto c = base;
        c.level = bench::Level::Op;
        c.batch = args.sweep_batch;
        c.iters = args.sweep_iters;
        c.warmup = args.sweep_warmup;
        c.tokens = n;
        c.k = k;
        configs.push_back(c);
      }
    }
  } else {
    configs.push_back(base);
  }
  for (const auto& c : configs) bench::validate(c);  // fail before any measurement

  const auto machine = bench::measure_machine(base.dtype, base.device);
  if (!args.json) print_machine(machine, base.dtype, base.device);
  std::vector<CaseResult> results;
  for (const auto& c : configs) {
    if (!args.json && args.sweep) {
      std::cerr << fmt::format("bench: N = {}, K = {} ...\n", c.tokens, c.k);
    }
    results.push_back(bench::run_case(c));
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  if (args.json) {
    nlohmann::json out{{"torch_version", TORCH_VERSION},
                       {"threads", at::get_num_threads()},
                       {"mode", args.sweep ? "sweep" : "single"},
                       {"machine",
                        {{"gemm_flops_per_s", machine.flops_per_s},
                         {"gemm_size", machine.gemm_size},
                         {"gemm_dtype", bench::dtype_name(base.dtype)},
                         {"copy_bytes_per_s", machine.bytes_per_s},
                         {"copy_bytes", machine.copy_bytes}}},
                       {"notes", notes},
                       {"wall_s", wall_s}};
    out["cases"] = nlohmann::json::array();
    for (const auto& r : results) out["cases"].push_back(case_json(r, machine));
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (args.sweep) {
    std::cout << fmt::format("op-level sweep: batch {}, channels {}, heads {} (d {}), {}, {}, softmax rho, {}; "
                             "impl {}, device {}; {} iterations after {} warm-up\n\n",
                             args.sweep_batch, base.channels, base.heads, base.channels / base.heads,
                             nn::to_string(base.aggregation), to_string(base.similarity),
                             bench::dtype_name(base.dtype), bench::to_string(base.impl),
                             device_name(base.device), args.sweep_iters, args.sweep_warmup);
    print_sweep(results, machine);
    for (const auto& note : notes) std::cout << note << "\n";
  } else {
    std::cout << "\n";
    print_case(results.front(), machine);
  }
  std::cout << fmt::format("\nfinished in {:.1f} s\n", wall_s);
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  auto data_args = std::make_shared<DataBenchArgs>();
  auto* sub = app.add_subcommand("bench", "Time and measure the memory of the reference (Algorithm 1 in plain "
                                          "ATen) and fused ConvNN paths side by side; with --data, the input "
                                          "pipeline's images/s");
  sub->add_option("--level", args->level, "op: knn_select + softmax + knn_aggregate on [G,N,d]; module: "
                                          "ConvNNAttention, the reference layer and MHSA")
      ->check(CLI::IsMember(bench::level_names()));
  sub->add_option("--batch", args->batch, "Batch size B (with --data, the loader's batch)");
  sub->add_option("--tokens", args->tokens, "Sequence length N");
  sub->add_option("--channels", args->channels, "Embedding dimension C");
  sub->add_option("--heads", args->heads, "Heads H, must divide C");
  sub->add_option("--k", args->k, "Neighbours K");
  sub->add_option("--aggregation", args->aggregation, "Aggregation of the ConvNN paths")
      ->check(CLI::IsMember(nn::aggregation_names()));
  sub->add_option("--similarity", args->similarity, "Similarity (those of the reference, Algorithm 1)")
      ->check(CLI::IsMember(bench::similarity_names()));
  sub->add_option("--dtype", args->dtype, "Dtype of the inputs and weights")
      ->check(CLI::IsMember(bench::dtype_names()));
  auto impls = bench::impl_names();
  impls.insert(impls.begin(), "auto");
  sub->add_option("--impl", args->impl,
                  "fused: convnn's CPU kernels; generic: the device-generic plain-ATen ops, called directly at "
                  "op level, what the dispatcher runs off the CPU at module level; auto: fused on the CPU, generic "
                  "elsewhere")
      ->check(CLI::IsMember(impls));
  sub->add_option("--device", args->device,
                  "cpu, cuda, cuda:N, ... or auto, the accelerator when one is present, else the CPU; off the "
                  "CPU only --impl generic runs");
  sub->add_option("--iters", args->iters, "Timed iterations per phase");
  sub->add_option("--warmup", args->warmup, "Untimed iterations before them");
  sub->add_option("--seed", args->seed, "Seed of the inputs and weights");
  sub->add_option("--memory-cap", args->memory_cap_gib,
                  "Skip the reference when its [G,N,N] score matrix exceeds this many GiB");
  sub->add_flag("--json", args->json, "Print every number as JSON");
  sub->add_flag("--sweep", args->sweep,
                "Op-level sweep over --sweep-n x --sweep-k (replaces --level, --batch, --tokens, --k, "
                "--iters and --warmup by the --sweep-* options)");
  sub->add_option("--sweep-n", args->sweep_n, "Sequence lengths of the sweep")
      ->delimiter(',')
      ->check(integer_at_least(1));
  sub->add_option("--sweep-k", args->sweep_k, "Neighbour counts of the sweep")
      ->delimiter(',')
      ->check(integer_at_least(1));
  sub->add_option("--sweep-batch", args->sweep_batch, "Batch size of the sweep");
  sub->add_option("--sweep-iters", args->sweep_iters, "Timed iterations per phase in the sweep");
  sub->add_option("--sweep-warmup", args->sweep_warmup, "Warm-up iterations in the sweep");
  auto& sequence = args->sequence_config;
  sub->add_flag("--sequence", args->sequence,
                "Sequence cases instead: causal ConvNNAttention with grouped heads against scaled_dot_product_attention "
                "over [B,N,C] at each --sequence-n (and at decreasing lengths, padded and packed), and one decoding step "
                "against a cache of each --sequence-cache tokens; --k, --dtype, --device, --seed apply");
  sub->add_option("--sequence-n", sequence.tokens, "Sequence lengths of the causal cases")->delimiter(',');
  sub->add_option("--sequence-cache", sequence.cache_lengths, "Cache lengths of the decoding cases")->delimiter(',');
  sub->add_option("--sequence-batch", sequence.batch, "Batch size of the sequence cases");
  sub->add_option("--sequence-channels", sequence.channels, "Embedding dimension C of the sequence cases");
  sub->add_option("--sequence-heads", sequence.heads, "Query heads of the sequence cases");
  sub->add_option("--kv-heads", sequence.kv_heads, "Key/value heads of the sequence cases (must divide the heads)");
  sub->add_option("--sequence-iters", sequence.iters, "Timed iterations per sequence case");
  sub->add_option("--sequence-warmup", sequence.warmup, "Warm-up iterations per sequence case");
  add_data_bench_options(sub, *data_args);
  return {sub, [args, data_args] {
            if (args->sequence) return run_sequence_bench(*args);
            if (!data_bench_requested(*data_args)) return run_bench(*args);
            TORCH_CHECK(args->seed >= 0, "bench: seed must be non-negative, got ", args->seed);
            return run_data_bench(*data_args, args->batch, static_cast<uint64_t>(args->seed), args->json);
          }};
}

}  // namespace convnn::cli
