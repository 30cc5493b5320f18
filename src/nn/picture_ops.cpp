// The pictures' rules of `convnn viz` (convnn/nn/neighbours.h, which the command calls directly)
// as dispatcher ops for the Python package's convnn.viz, so that its pictures are the command's:
//
//   convnn::picture_points(image_sizes, pixels, grid)  the query points of a picture, flat
//   convnn::picture_colours()                           the colours of neighbours, query, window, padding
//   convnn::picture_background(image, grid)             the image a picture is drawn on
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "convnn/nn/neighbours.h"

namespace convnn::nn {
namespace {

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  // The query pixels flat (D coordinates each); the points flat likewise.
  m.def("picture_points(int[] image_sizes, int[] pixels, int grid) -> float[]",
        [](std::vector<int64_t> image_sizes, std::vector<int64_t> pixels, int64_t grid) {
          const auto dims = static_cast<int64_t>(image_sizes.size());
          TORCH_CHECK(dims >= 1 && static_cast<int64_t>(pixels.size()) % dims == 0, "picture_points: pixels must hold ",
                      dims, " coordinates per query pixel, got ", pixels.size(), " numbers");
          std::vector<std::vector<int64_t>> queries;
          for (size_t i = 0; i < pixels.size(); i += dims) queries.emplace_back(pixels.begin() + i, pixels.begin() + i + dims);
          std::vector<double> flat;
          for (const auto& point : picture_points(image_sizes, queries, grid)) flat.insert(flat.end(), point.begin(), point.end());
          return flat;
        });
  m.def("picture_colours() -> (str neighbour, str query, str window, str padding)", [] {
    return std::make_tuple(std::string(PictureColours::neighbour), std::string(PictureColours::query),
                           std::string(PictureColours::window), std::string(PictureColours::padding));
  });
  m.def("picture_background(Tensor image, int[] grid) -> Tensor",
        [](const at::Tensor& image, std::vector<int64_t> grid) { return picture_background(image, grid); });
}

}  // namespace
}  // namespace convnn::nn
