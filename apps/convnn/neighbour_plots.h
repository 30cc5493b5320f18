#pragma once
// The picture of one layer's neighbours that `convnn viz` draws with gnuplot: a row per query; a
// column per head with the K neighbours it selected on the image at the layer's resolution, and,
// for a spatial layer, a last column with the window of the convolution it generalises. The same
// picture as Python's convnn.viz.plot_neighbours, with the same colours.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "convnn/nn/neighbours.h"

namespace convnn::cli {

/// Where everything is, in pixels of the PNG, so that readers (and the tests) can find each cell:
/// a cell (y, x) of a panel has its centre at (left + (x + 0.5 + frame) * cell_px,
/// top + (y + 0.5 + frame) * cell_px).
struct PictureLayout {
  struct Panel {
    int64_t row = 0;     ///< the query
    int64_t column = 0;  ///< the head, or `heads` for the convolution's window
    int64_t left = 0, top = 0, right = 0, bottom = 0;
  };
  int64_t width = 0, height = 0;  ///< of the PNG
  int64_t cell_px = 0;            ///< the side of one cell
  int64_t frame = 0;              ///< cells drawn around the grid: the padding (a token grid: 1, for the class token)
  int64_t heads = 0;
  std::vector<Panel> panels;
};

PictureLayout picture_layout(const nn::Neighbours& neighbours, int64_t queries);

/// Draws `png` (its data `.dat` and gnuplot script `.gp` beside it) for neighbours on a 2-D grid,
/// the background of nn::picture_background and one view per query.
void plot_neighbour_picture(const std::string& png, const std::string& title, const nn::Neighbours& neighbours,
                            const at::Tensor& background, const std::vector<nn::NeighbourView>& views,
                            const PictureLayout& layout);

}  // namespace convnn::cli
