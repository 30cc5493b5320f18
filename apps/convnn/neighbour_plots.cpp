#include "neighbour_plots.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "convnn/checkpoint/atomic_file.h"
#include "plots.h"

namespace convnn::cli {
namespace {

namespace fs = std::filesystem;

// Margins and gaps of the picture, in pixels: the title and column titles above, the row labels
// on the left. A panel is at least kPanelPx wide and a cell at least kMinCellPx, so that each
// cell's centre is well inside its square whatever gnuplot's rounding.
constexpr int64_t kLeft = 70, kTop = 56, kRight = 16, kBottom = 12, kGapX = 16, kGapY = 28;
constexpr int64_t kPanelPx = 240, kMinCellPx = 12;

using nn::PictureColours;

std::string quoted(const std::string& text) { return "'" + text + "'"; }

// The data file's blocks (gnuplot's `index`): the background, then per query its heads'
// neighbours, the query itself and (for a spatial layer) the window.
struct Blocks {
  int64_t heads = 0;
  bool window = false;
  int64_t per_query() const { return heads + 1 + (window ? 1 : 0); }
  int64_t neighbours(int64_t query, int64_t head) const { return 1 + query * per_query() + head; }
  int64_t query(int64_t query) const { return 1 + query * per_query() + heads; }
  int64_t window_of(int64_t query) const { return 1 + query * per_query() + heads + 1; }
};

// "y x value" rows of the background, then blocks of "y x half-size" rows.
std::string picture_data(const at::Tensor& background, const std::vector<nn::NeighbourView>& views, const Blocks& b) {
  std::string data;
  const auto grey = background.accessor<double, 2>();
  for (int64_t y = 0; y < background.size(0); ++y) {
    for (int64_t x = 0; x < background.size(1); ++x) data += fmt::format("{} {} {:.6f}\n", y, x, grey[y][x]);
  }
  const auto block_end = [&] { data += "\n\n"; };
  block_end();
  for (const auto& view : views) {
    for (int64_t head = 0; head < b.heads; ++head) {
      const auto cells = view.neighbours[head].contiguous();  // [K, 2]
      const auto weights = view.weights[head].to(at::kDouble).contiguous();
      const double largest = std::max(weights.max().item<double>(), 0.0);
      for (int64_t slot = 0; slot < cells.size(0); ++slot) {
        const double weight = std::max(weights[slot].item<double>(), 0.0);
        // A heavier neighbour is a larger square: 0.6 to 1 of the cell, as convnn.viz draws them.
        const double size = 0.6 + 0.4 * (largest > 0.0 ? weight / largest : 1.0);
        data += fmt::format("{} {} {:.4f}\n", cells[slot][0].item<int64_t>(), cells[slot][1].item<int64_t>(), size / 2);
      }
      block_end();
    }
    data += fmt::format("{} {} 0.5\n", view.query[0], view.query[1]);
    block_end();
    if (b.window) {
      for (int64_t cell = 0; cell < view.window.size(0); ++cell) {
        data += fmt::format("{} {} 0.5\n", view.window[cell][0].item<int64_t>(), view.window[cell][1].item<int64_t>());
      }
      block_end();
    }
  }
  return data;
}

// A gnuplot screen coordinate of a pixel position (y counted from the top).
double screen_x(int64_t px, const PictureLayout& l) { return static_cast<double>(px) / static_cast<double>(l.width); }
double screen_y(int64_t px, const PictureLayout& l) { return 1.0 - static_cast<double>(px) / static_cast<double>(l.height); }

std::string panel_plot(const PictureLayout::Panel& panel, const PictureLayout& l, const nn::Neighbours& n,
                       const nn::NeighbourView& view, const Blocks& b, const std::string& data) {
  const int64_t height = n.input_sizes[0], width = n.input_sizes[1];
  const double frame = static_cast<double>(l.frame);
  std::string s = fmt::format(
      "set lmargin at screen {:.6f}\nset rmargin at screen {:.6f}\nset tmargin at screen {:.6f}\n"
      "set bmargin at screen {:.6f}\nset xrange [{}:{}]\nset yrange [{}:{}]\n",
      screen_x(panel.left, l), screen_x(panel.right, l), screen_y(panel.top, l), screen_y(panel.bottom, l),
      -0.5 - frame, width - 0.5 + frame, height - 0.5 + frame, -0.5 - frame);
  const bool window = panel.column == l.heads;
  const auto boxes = [&](int64_t block, const std::string& style) {
    return fmt::format(", {} index {} using 2:1:3:3 with boxxyerror {}", quoted(data), block, style);
  };
  s += fmt::format("plot {} index 0 using 2:1:3 with image", quoted(data));
  if (window) {
    s += boxes(b.window_of(panel.row), fmt::format("fillstyle empty lc rgb '{}' lw 1.5", PictureColours::window));
  } else {
    s += boxes(b.neighbours(panel.row, panel.column),
               fmt::format("fillstyle solid 1.0 noborder lc rgb '{}'", PictureColours::neighbour));
  }
  s += boxes(b.query(panel.row), fmt::format("fillstyle empty lc rgb '{}' lw 2", PictureColours::query)) + "\n";
  return s;
}

// The title, the column titles and the row labels (gnuplot draws labels with the next plot).
std::string labels(const std::string& title, const PictureLayout& l, const nn::Neighbours& n,
                   const std::vector<nn::NeighbourView>& views) {
  auto escaped = [](std::string text) {
    std::string out;
    for (const char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out;
  };
  std::string s = fmt::format("set label 1 '{}' at screen 0.5,{:.6f} center font ',11'\n", escaped(title),
                              screen_y(20, l));
  int64_t tag = 10;
  for (const auto& panel : l.panels) {
    if (panel.row != 0) continue;
    const auto side = nn::window_side(n.k, 2);
    // A token grid's class token is its top-left corner cell, outside the grid.
    const auto text = panel.column == l.heads ? fmt::format("convolution: {}x{}", side, side)
                      : l.heads > 1           ? fmt::format("head {}: K = {}", panel.column, n.k)
                                              : fmt::format("ConvNN: K = {}", n.k);
    const auto corner = n.has_window ? std::string() : std::string(" (corner: class token)");
    s += fmt::format("set label {} '{}{}' at screen {:.6f},{:.6f} center\n", tag++, text, corner,
                     screen_x((panel.left + panel.right) / 2, l), screen_y(panel.top - 10, l));
  }
  for (size_t row = 0; row < views.size(); ++row) {
    const auto& panel = l.panels[row * (l.panels.size() / views.size())];
    s += fmt::format("set label {} 'query {},{}' at screen {:.6f},{:.6f} center rotate by 90\n", tag++,
                     views[row].query[0], views[row].query[1], screen_x(kLeft / 2, l),
                     screen_y((panel.top + panel.bottom) / 2, l));
  }
  return s;
}

}  // namespace

PictureLayout picture_layout(const nn::Neighbours& n, int64_t queries) {
  TORCH_CHECK(n.positions.defined() && n.input_sizes.size() == 2, "picture_layout: neighbours on a 2-D grid only");
  PictureLayout l;
  l.heads = n.positions.size(-4);
  l.frame = n.has_window ? n.padding : 1;
  const int64_t rows = n.input_sizes[0] + 2 * l.frame, columns = n.input_sizes[1] + 2 * l.frame;
  l.cell_px = std::max(kMinCellPx, kPanelPx / std::max(rows, columns));
  const int64_t panel_w = columns * l.cell_px, panel_h = rows * l.cell_px;
  const int64_t panels_per_row = l.heads + (n.has_window ? 1 : 0);
  l.width = kLeft + panels_per_row * panel_w + (panels_per_row - 1) * kGapX + kRight;
  l.height = kTop + queries * panel_h + (queries - 1) * kGapY + kBottom;
  for (int64_t row = 0; row < queries; ++row) {
    for (int64_t column = 0; column < panels_per_row; ++column) {
      PictureLayout::Panel p;
      p.row = row;
      p.column = column;
      p.left = kLeft + column * (panel_w + kGapX);
      p.top = kTop + row * (panel_h + kGapY);
      p.right = p.left + panel_w;
      p.bottom = p.top + panel_h;
      l.panels.push_back(p);
    }
  }
  return l;
}

void plot_neighbour_picture(const std::string& png, const std::string& title, const nn::Neighbours& n,
                            const at::Tensor& background, const std::vector<nn::NeighbourView>& views,
                            const PictureLayout& layout) {
  TORCH_CHECK(!views.empty(), "plot_neighbour_picture: no query to draw");
  const Blocks blocks{layout.heads, n.has_window};
  auto stem = fs::path(png);
  stem.replace_extension();
  const auto data = stem.string() + ".dat";
  checkpoint::write_file_atomically(data, picture_data(background.to(at::kDouble).contiguous(), views, blocks));
  std::string script = fmt::format(
      "set terminal pngcairo size {},{} noenhanced font ',9'\nset output {}\nset multiplot\n"
      "unset key\nunset tics\nunset colorbox\nset palette grey\nset cbrange [0:1]\nset border lw 1\n"
      "set object 1 rectangle from graph 0,0 to graph 1,1 behind fillcolor rgb '{}' fillstyle solid 1.0 noborder\n",
      layout.width, layout.height, quoted(png), PictureColours::padding);
  script += labels(title, layout, n, views);
  bool first = true;
  for (const auto& panel : layout.panels) {
    script += panel_plot(panel, layout, n, views[panel.row], blocks, data);
    if (first) script += "unset label\n";  // drawn once, with the first panel
    first = false;
  }
  script += "unset multiplot\n";
  run_gnuplot(stem.string() + ".gp", script);
}

}  // namespace convnn::cli
