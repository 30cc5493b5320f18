#pragma once
// What a ConvNN layer selected: per query, its K neighbours, their scores and the rho weights the
// aggregation used; and what a picture of them shows (convnn viz, convnn.viz in Python).
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace convnn::nn {

/// One forward's selection of a ConvNN layer. The tensors are [B, H, Q, K] (without B for an
/// input without a batch dimension), detached: H the layer's heads (ConvNNAttention: num_heads),
/// Q the queries in output order (row-major over the output grid), K the slots in the layer's slot
/// order.
struct Neighbours {
  /// int64. A spatial layer: the row-major flat index of each neighbour in the zero-padded input
  /// grid (sizes input_sizes + 2 * padding). ConvNNAttention: the token index.
  at::Tensor indices;
  /// The similarity of each neighbour to its query (rho's input); -inf: a masked slot.
  at::Tensor scores;
  /// rho's weights (the aggregation's); 0 for a masked slot.
  at::Tensor weights;

  // The grid, for a spatial layer (ConvNN1d/2d/3d, the ConvNN branch of BranchingConv2d/3d) and
  // for an attention layer's tokens placed on a grid (on_token_grid); empty otherwise.
  /// int64 [B, H, Q, K, D]: each neighbour's coordinates in the layer's input; a coordinate below 0
  /// or at least the size is padding (for tokens on a grid: -1 on every axis is a prefix token,
  /// such as a ViT's class token).
  at::Tensor positions;
  /// int64 [Q, D]: each query's coordinates in the input (stride x its output position).
  at::Tensor query_positions;
  std::vector<int64_t> input_sizes;  ///< D spatial sizes of the input (before padding)
  std::vector<int64_t> query_grid;   ///< D sizes of the output grid: ceil(input size / stride)
  std::vector<int64_t> stride, dilation;
  int64_t padding = 0;
  int64_t k = 0;
  /// A spatial layer: a picture shows the window of the convolution it generalises beside it.
  bool has_window = false;
};

/// A ConvNNAttention layer's neighbours with its tokens placed on a grid, as a ViT's patches: the
/// first `prefix_tokens` tokens (the class token) are off the grid, the others row-major on
/// `grid`. Keeps the queries on the grid (the prefix tokens' rows are dropped).
Neighbours on_token_grid(const Neighbours& attention, c10::IntArrayRef grid, int64_t prefix_tokens);

/// What a picture of one query shows: the query nearest a point of the input, its neighbours and
/// the window of the convolution the layer generalises.
struct NeighbourView {
  int64_t row = 0;             ///< the query's row among the Neighbours' Q
  std::vector<int64_t> query;  ///< D coordinates of the query in the input grid
  at::Tensor neighbours;       ///< int64 [H, K, D]: its neighbours' coordinates (Neighbours::positions)
  at::Tensor weights;          ///< [H, K]
  /// int64 [R^D, D]: the R x ... x R window (with the layer's dilation) of a convolution with at
  /// least K taps (R the least odd number with R^D >= K; K = R^D recovers it exactly); [0, D]
  /// when the layer has none (attention).
  at::Tensor window;
};

/// The view of the query nearest `point` (D fractions in [0, 1): 0 the first row or column of
/// the input, 1 past its last) in sample `sample`. Needs the grid (Neighbours::positions).
NeighbourView neighbour_view(const Neighbours& neighbours, c10::ArrayRef<double> point, int64_t sample = 0);

/// The side R of the convolution window a picture shows beside K neighbours in D dimensions: the
/// least odd R with R^D >= K.
int64_t window_side(int64_t k, int64_t spatial_dims);

/// The points a picture shows, as fractions of an image of `image_sizes` (H, W, ...): the centres
/// of the given pixels (one coordinate per axis each), or, when there are none, the cell centres of
/// a grid x grid x ... lattice over the image.
std::vector<std::vector<double>> picture_points(c10::IntArrayRef image_sizes,
                                                const std::vector<std::vector<int64_t>>& pixels, int64_t grid);

/// A picture's background at a layer's resolution: the image [C, H, W] in grey (the mean of its
/// channels), averaged over the cells of `grid` (adaptive average pooling) and scaled to [0, 1]
/// (float64, [grid...]).
at::Tensor picture_background(const at::Tensor& image, c10::IntArrayRef grid);

/// The colours of the pictures (`convnn viz` and Python's convnn.viz draw with these): the
/// neighbours, the query, the convolution's window, and the padding around the grid.
struct PictureColours {
  static constexpr const char* neighbour = "#e4572e";
  static constexpr const char* query = "#1d4ed8";
  static constexpr const char* window = "#16a34a";
  static constexpr const char* padding = "#dddddd";
};

/// A ConvNN layer that can keep what its forwards select (ConvNN1d/2d/3d, ConvNNAttention,
/// BranchingConv2d/3d). Off by default: then forward keeps nothing and costs nothing more.
class NeighbourRecording {
 public:
  virtual ~NeighbourRecording() = default;
  /// Keep what each forward selects in last_neighbours(); off drops what was kept.
  void record_neighbours(bool on);
  bool records_neighbours() const { return record_; }
  /// What the last forward selected while recording (indices undefined if none ran).
  const Neighbours& last_neighbours() const { return last_; }

 protected:
  /// Where forward puts its selection: null when not recording.
  Neighbours* neighbours_sink() { return record_ ? &last_ : nullptr; }
  /// A layer's forward_with_neighbours from its forward with a sink, run(Neighbours*).
  template <typename Run>
  static std::tuple<at::Tensor, Neighbours> with_neighbours(const Run& run) {
    Neighbours neighbours;
    auto output = run(&neighbours);
    return {std::move(output), std::move(neighbours)};
  }

 private:
  bool record_ = false;
  Neighbours last_;
};

/// Runs `forward` with every ConvNN layer in `module` (itself included) recording, and returns what
/// each layer that ran selected, by its module path ("" for `module` itself), in module order (a
/// layer run several times: its last run). Recording is off again afterwards, exception or not.
std::vector<std::pair<std::string, Neighbours>> record_neighbours(torch::nn::Module& module,
                                                                  const std::function<void()>& forward);

}  // namespace convnn::nn
