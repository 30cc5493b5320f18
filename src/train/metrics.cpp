#include "convnn/train/metrics.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "convnn/checkpoint/atomic_file.h"
#include "util/json_fields.h"

namespace convnn::train {
namespace {

namespace fs = std::filesystem;

template <typename Metrics, typename Visitor>
void visit_metrics(Metrics& m, Visitor&& visit) {
  visit("epoch", m.epoch);
  visit("train_loss", m.train_loss);
  visit("train_top1", m.train_top1);
  visit("val_loss", m.val_loss);
  visit("val_top1", m.val_top1);
  visit("val_top5", m.val_top5);
  visit("lr", m.lr);
  visit("images_per_s", m.images_per_s);
  visit("epoch_time_s", m.epoch_time_s);
  visit("skipped", m.skipped);
}


}  // namespace

const std::vector<std::string>& metrics_columns() {
  static const std::vector<std::string> columns = [] {
    std::vector<std::string> names;
    EpochMetrics m;
    visit_metrics(m, [&](const char* key, auto&) { names.push_back(key); });
    return names;
  }();
  return columns;
}

MetricsLog::MetricsLog(std::string run_dir, int64_t first_epoch) : run_dir_(std::move(run_dir)) {
  const auto path = fs::path(run_dir_) / "metrics.json";
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json json;
  try {
    json = convnn::detail::parse_json(text.str(), "metrics file '" + path.string() + "'");
    for (const auto& row : json) {
      EpochMetrics m;
      // Columns added later (skipped) are absent from older runs' files: they keep their default.
      visit_metrics(m, [&](const char* key, auto& field) {
        if (std::string(key) != "skipped" || row.contains(key)) field = row.at(key);
      });
      if (m.epoch < first_epoch) epochs_.push_back(m);
    }
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "metrics file '", path.string(), "' is damaged: ", e.what());
  }
}

void MetricsLog::add(const EpochMetrics& metrics) {
  epochs_.push_back(metrics);
  write();
}

void MetricsLog::write() const {
  auto json = nlohmann::json::array();
  std::ostringstream csv;
  for (size_t c = 0; c < metrics_columns().size(); ++c) csv << (c ? "," : "") << metrics_columns()[c];
  csv << "\n";
  for (auto m : epochs_) {
    nlohmann::json row;
    bool first = true;
    visit_metrics(m, [&](const char* key, auto& field) {
      row[key] = field;
      csv << (first ? "" : ",") << fmt::format("{}", field);
      first = false;
    });
    json.push_back(row);
    csv << "\n";
  }
  checkpoint::write_file_atomically((fs::path(run_dir_) / "metrics.json").string(), json.dump(2) + "\n");
  checkpoint::write_file_atomically((fs::path(run_dir_) / "metrics.csv").string(), csv.str());
}

void write_confusion(const std::string& dir, const std::vector<std::string>& class_names,
                     const std::vector<std::vector<int64_t>>& counts) {
  fs::create_directories(dir);
  std::ostringstream csv, matrix;
  csv << "true\\predicted";
  for (const auto& name : class_names) csv << ",\"" << name << "\"";
  csv << "\n";
  for (size_t t = 0; t < counts.size(); ++t) {
    csv << "\"" << class_names[t] << "\"";
    for (size_t p = 0; p < counts[t].size(); ++p) {
      csv << "," << counts[t][p];
      matrix << (p ? " " : "") << counts[t][p];
    }
    csv << "\n";
    matrix << "\n";
  }
  checkpoint::write_file_atomically((fs::path(dir) / "confusion.csv").string(), csv.str());
  checkpoint::write_file_atomically((fs::path(dir) / "confusion.dat").string(), matrix.str());
}

}  // namespace convnn::train
