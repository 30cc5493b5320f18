#pragma once
// PNG plots drawn by gnuplot, which the command runs (the library starts no program): a run's
// loss, accuracy and learning rate, and an evaluation's confusion matrix.
#include <string>
#include <vector>

namespace convnn::cli {

/// loss.png, accuracy.png and lr.png in `run_dir`/plots from its metrics.csv. Returns false (and
/// draws nothing) when gnuplot is not installed; throws when it fails.
bool plot_metrics(const std::string& run_dir);

/// confusion.png in `dir` from the confusion.dat that train::write_confusion wrote there. Returns
/// false when gnuplot is not installed.
bool plot_confusion(const std::string& dir, const std::vector<std::string>& class_names);

bool gnuplot_available();
/// Runs a gnuplot script, written to `script_path` (kept, so that users can restyle the plots);
/// its messages go to a .log beside it, named in the error when it fails.
void run_gnuplot(const std::string& script_path, const std::string& script);

}  // namespace convnn::cli
