#include "convnn/train/metrics.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "convnn/train/checkpoint.h"

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

bool gnuplot_available() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

// Runs a gnuplot script (written next to its outputs, kept so that users can restyle the plots);
// its messages go to a .log beside it, named in the error when it fails.
void run_gnuplot(const fs::path& script_path, const std::string& script) {
  write_file_atomically(script_path.string(), script);
  auto log = script_path;
  log.replace_extension(".log");
  const auto command = fmt::format("gnuplot '{}' > '{}' 2>&1", script_path.string(), log.string());
  TORCH_CHECK(std::system(command.c_str()) == 0, "gnuplot failed on '", script_path.string(), "'; see '",
              log.string(), "'");
}

std::string quoted(const fs::path& path) { return "'" + path.string() + "'"; }

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
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
    for (const auto& row : json) {
      EpochMetrics m;
      // Columns added later (skipped) are absent from older runs' files: they keep their default.
      visit_metrics(m, [&](const char* key, auto& field) {
        if (std::string(key) != "skipped" || row.contains(key)) field = row.at(key);
      });
      if (m.epoch < first_epoch) epochs_.push_back(m);
    }
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
  write_file_atomically((fs::path(run_dir_) / "metrics.json").string(), json.dump(2) + "\n");
  write_file_atomically((fs::path(run_dir_) / "metrics.csv").string(), csv.str());
}

bool plot_metrics(const std::string& run_dir) {
  if (!gnuplot_available()) return false;
  const auto plots = fs::path(run_dir) / "plots";
  fs::create_directories(plots);
  const auto csv = quoted(fs::path(run_dir) / "metrics.csv");
  const std::string common =
      "set datafile separator ','\nset key autotitle columnhead\nset grid\n"
      "set terminal pngcairo size 800,500 noenhanced\nset xlabel 'epoch'\n";
  run_gnuplot(plots / "plots.gp",
              common +
                  "set output " + quoted(plots / "loss.png") + "\nset ylabel 'loss'\nset title 'Loss'\n"
                  "plot " + csv + " using 'epoch':'train_loss' with linespoints title 'train', "
                  "'' using 'epoch':'val_loss' with linespoints title 'validation'\n"
                  "set output " + quoted(plots / "accuracy.png") +
                  "\nset ylabel 'accuracy (%)'\nset title 'Validation accuracy'\n"
                  "plot " + csv + " using 'epoch':'val_top1' with linespoints title 'top-1', "
                  "'' using 'epoch':'val_top5' with linespoints title 'top-5', "
                  "'' using 'epoch':'train_top1' with linespoints title 'train top-1'\n"
                  "set output " + quoted(plots / "lr.png") +
                  "\nset ylabel 'learning rate'\nset title 'Learning rate (end of epoch)'\n"
                  "plot " + csv + " using 'epoch':'lr' with linespoints title 'lr'\n");
  return true;
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
  write_file_atomically((fs::path(dir) / "confusion.csv").string(), csv.str());
  if (!gnuplot_available()) return;
  write_file_atomically((fs::path(dir) / "confusion.dat").string(), matrix.str());
  std::string tics;
  for (size_t c = 0; c < class_names.size(); ++c) {
    tics += fmt::format("{}'{}' {}", c ? ", " : "", class_names[c], c);
  }
  const int64_t side = std::max<int64_t>(500, 40 * static_cast<int64_t>(class_names.size()) + 200);
  run_gnuplot(fs::path(dir) / "confusion.gp",
              fmt::format("set terminal pngcairo size {0},{0} noenhanced\nset output {1}\n"
                          "set title 'Confusion matrix (rows: true class)'\nset xlabel 'predicted'\n"
                          "set ylabel 'true'\nset xtics ({2}) rotate by 45 right\nset ytics ({2})\n"
                          "set yrange [] reverse\nset palette defined (0 'white', 1 'dark-blue')\n"
                          "set autoscale fix\nplot {3} matrix with image notitle\n",
                          side, quoted(fs::path(dir) / "confusion.png"), tics,
                          quoted(fs::path(dir) / "confusion.dat")));
}

}  // namespace convnn::train
