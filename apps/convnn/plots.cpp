#include "plots.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "convnn/checkpoint/atomic_file.h"

namespace convnn::cli {

namespace fs = std::filesystem;

bool gnuplot_available() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

void run_gnuplot(const std::string& script_path, const std::string& script) {
  checkpoint::write_file_atomically(script_path, script);
  auto log = fs::path(script_path);
  log.replace_extension(".log");
  const auto command = fmt::format("gnuplot '{}' > '{}' 2>&1", script_path, log.string());
  TORCH_CHECK(std::system(command.c_str()) == 0, "gnuplot failed on '", script_path, "'; see '",
              log.string(), "'");
}

namespace {

std::string quoted(const fs::path& path) { return "'" + path.string() + "'"; }

}  // namespace

bool plot_metrics(const std::string& run_dir) {
  if (!gnuplot_available()) return false;
  const auto plots = fs::path(run_dir) / "plots";
  fs::create_directories(plots);
  const auto csv = quoted(fs::path(run_dir) / "metrics.csv");
  // Epochs are whole numbers: a tic every epoch, or every ceil(epochs / 10) past ten (gnuplot's own
  // choice put tics at 1.5, 2.5, ...).
  const std::string common =
      "set datafile separator ','\nset key autotitle columnhead\nset grid\n"
      "set terminal pngcairo size 800,500 noenhanced\nset xlabel 'epoch'\n"
      "stats " + csv + " using 'epoch' nooutput\nepoch_step = STATS_max > 10 ? ceil(STATS_max / 10.0) : 1\n"
      "set xtics epoch_step\nset format x '%.0f'\n";
  run_gnuplot((plots / "plots.gp").string(),
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

bool plot_confusion(const std::string& dir, const std::vector<std::string>& class_names) {
  if (!gnuplot_available()) return false;
  // Past this many classes (a language model's 256 bytes) a label per row is unreadable: the axes
  // keep their numbers and the picture its size.
  constexpr size_t kMostLabelledClasses = 64;
  const bool labelled = class_names.size() <= kMostLabelledClasses;
  std::string tics;
  for (size_t c = 0; c < class_names.size() && labelled; ++c) {
    // A quote inside gnuplot's single-quoted string is written twice.
    std::string name;
    for (const char ch : class_names[c]) name += ch == '\'' ? std::string("''") : std::string(1, ch);
    tics += fmt::format("{}'{}' {}", c ? ", " : "", name, c);
  }
  const int64_t side =
      labelled ? std::max<int64_t>(500, 40 * static_cast<int64_t>(class_names.size()) + 200) : 1200;
  run_gnuplot((fs::path(dir) / "confusion.gp").string(),
              fmt::format("set terminal pngcairo size {0},{0} noenhanced\nset output {1}\n"
                          "set title 'Confusion matrix (rows: true class)'\nset xlabel 'predicted'\n"
                          "set ylabel 'true'\n{2}"
                          "set yrange [] reverse\nset palette defined (0 'white', 1 'dark-blue')\n"
                          "set autoscale fix\nplot {3} matrix with image notitle\n",
                          side, quoted(fs::path(dir) / "confusion.png"),
                          labelled ? fmt::format("set xtics ({0}) rotate by 45 right\nset ytics ({0})\n", tics) : "",
                          quoted(fs::path(dir) / "confusion.dat")));
  return true;
}

}  // namespace convnn::cli
