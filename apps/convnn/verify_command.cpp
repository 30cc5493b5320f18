// `convnn verify`: runs every identity of DESIGN.md §2 on fresh random inputs and prints a table
// (or JSON); exits non-zero when any identity fails.
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.h"
#include "convnn/verify/identities.h"
#include "model_options.h"

namespace convnn::cli {
namespace {

struct VerifyArgs {
  bool json = false;
  std::vector<std::string> dtypes = verify::dtype_names();
  int64_t seed = -1;  // -1: fresh
};

void print_table(const std::vector<std::pair<std::string, verify::IdentityResult>>& rows) {
  size_t identity_width = 8, config_width = 13;
  for (const auto& [dtype, r] : rows) {
    identity_width = std::max(identity_width, r.identity.size());
    config_width = std::max(config_width, r.configuration.size());
  }
  const auto line = fmt::format("{:<{}}  {:<7}  {:<{}}  {:>12}  {:>9}  {}", "identity", identity_width,
                                "dtype", "configuration", config_width, "max abs err", "tolerance", "result");
  std::cout << line << "\n" << std::string(line.size(), '-') << "\n";
  for (const auto& [dtype, r] : rows) {
    std::cout << fmt::format("{:<{}}  {:<7}  {:<{}}  {:>12.3e}  {:>9.0e}  {}\n", r.identity,
                             identity_width, dtype, r.configuration, config_width, r.max_abs_error,
                             r.tolerance, r.passed ? "pass" : "FAIL");
  }
}

int run_verify(const VerifyArgs& args) {
  const uint64_t seed = args.seed >= 0 ? static_cast<uint64_t>(args.seed) : std::random_device{}();
  std::vector<std::pair<std::string, verify::IdentityResult>> rows;
  for (const auto& dtype : args.dtypes) {
    for (auto& r : verify::run_identities(verify::parse_dtype(dtype), seed)) rows.emplace_back(dtype, std::move(r));
  }
  TORCH_CHECK(!rows.empty(), "verify: no identity was run");
  size_t failed = 0;
  for (const auto& row : rows) failed += row.second.passed ? 0 : 1;
  if (args.json) {
    nlohmann::json out{{"seed", seed}, {"passed", rows.size() - failed}, {"failed", failed}};
    out["results"] = nlohmann::json::array();
    for (const auto& [dtype, r] : rows) {
      out["results"].push_back({{"identity", r.identity},
                                {"dtype", dtype},
                                {"configuration", r.configuration},
                                {"max_abs_error", r.max_abs_error},
                                {"tolerance", r.tolerance},
                                {"passed", r.passed}});
    }
    std::cout << out.dump(2) << "\n";
  } else {
    print_table(rows);
    std::cout << fmt::format("\nseed {}: {} identities passed, {} failed\n", seed,
                             rows.size() - failed, failed);
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

Command add_verify_command(CLI::App& app) {
  auto args = std::make_shared<VerifyArgs>();
  auto* sub = app.add_subcommand("verify", "Check every ConvNN identity (convolution, attention, "
                                           "KVT, masks, multi-head) on fresh random inputs");
  sub->add_flag("--json", args->json, "Print the results as JSON");
  sub->add_option("--dtype", args->dtypes, "Dtypes to check")
      ->check(CLI::IsMember(verify::dtype_names()));
  sub->add_option("--seed", args->seed, "Seed of the random inputs (unset: fresh)")
      ->check(explicit_value("a fresh seed", /*allow_zero=*/true))
      ->default_str("");  // its -1 means "not given", which the help says
  return {sub, [args] { return run_verify(*args); }};
}

}  // namespace convnn::cli
