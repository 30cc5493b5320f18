#include "convnn/nn/neighbours.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cmath>
#include <functional>

#include "nn/neighbours_detail.h"

namespace convnn::nn {
namespace {

int64_t product(const std::vector<int64_t>& sizes) {
  int64_t p = 1;
  for (const auto s : sizes) p *= s;
  return p;
}

using functional::detail::unravel;

// [B*heads, Q, K] -> [B, heads, Q, K]
at::Tensor split_heads(const at::Tensor& t, int64_t heads) { return t.unflatten(0, {-1, heads}); }

Neighbours split_selection(const functional::detail::Selection& selection, int64_t heads, int64_t k) {
  Neighbours n;
  n.indices = split_heads(selection.indices, heads);
  n.scores = split_heads(selection.scores, heads);
  n.weights = split_heads(selection.weights, heads);
  n.k = k;
  return n;
}

}  // namespace

namespace detail {

Neighbours spatial_neighbours(const functional::detail::Selection& selection, int64_t heads,
                              const std::vector<int64_t>& input_sizes, int64_t padding,
                              const std::vector<int64_t>& stride, const std::vector<int64_t>& dilation, int64_t k) {
  auto n = split_selection(selection, heads, k);
  std::vector<int64_t> padded;
  for (size_t axis = 0; axis < input_sizes.size(); ++axis) {
    padded.push_back(input_sizes[axis] + 2 * padding);
    n.query_grid.push_back((input_sizes[axis] + stride[axis] - 1) / stride[axis]);
  }
  n.positions = unravel(n.indices, padded) - padding;
  const auto queries = at::arange(product(n.query_grid), n.indices.options());
  n.query_positions = unravel(queries, n.query_grid) * at::tensor(stride, n.indices.options());
  n.input_sizes = input_sizes;
  n.stride = stride;
  n.dilation = dilation;
  n.padding = padding;
  n.has_window = true;
  return n;
}

Neighbours token_neighbours(const functional::detail::Selection& selection, int64_t heads, int64_t k) {
  return split_selection(selection, heads, k);
}

void drop_batch_dimension(Neighbours& n) {
  for (auto* t : {&n.indices, &n.scores, &n.weights, &n.positions}) {
    if (t->defined()) *t = t->squeeze(0);
  }
}

}  // namespace detail

int64_t window_side(int64_t k, int64_t spatial_dims) {
  TORCH_CHECK(k >= 1, "window_side: k must be at least 1, got ", k);
  TORCH_CHECK(spatial_dims >= 1, "window_side: spatial_dims must be at least 1, got ", spatial_dims);
  int64_t side = 1;
  while (std::pow(static_cast<double>(side), static_cast<double>(spatial_dims)) < static_cast<double>(k)) side += 2;
  return side;
}

Neighbours on_token_grid(const Neighbours& attention, c10::IntArrayRef grid, int64_t prefix_tokens) {
  TORCH_CHECK(attention.indices.defined(), "on_token_grid: the neighbours are empty (no forward was recorded)");
  TORCH_CHECK(!attention.positions.defined(), "on_token_grid: the neighbours are on a grid already");
  TORCH_CHECK(!grid.empty() && std::all_of(grid.begin(), grid.end(), [](int64_t s) { return s >= 1; }),
              "on_token_grid: grid must be one or more sizes, each at least 1, got ", grid);
  TORCH_CHECK(prefix_tokens >= 0, "on_token_grid: prefix_tokens must be non-negative, got ", prefix_tokens);
  const std::vector<int64_t> sizes(grid.begin(), grid.end());
  const int64_t tokens = attention.indices.size(-2);
  TORCH_CHECK(tokens == prefix_tokens + product(sizes), "on_token_grid: the layer has ", tokens,
              " tokens, but prefix_tokens + the grid's ", grid, " = ", prefix_tokens + product(sizes));
  Neighbours n = attention;
  const auto on_grid = [&](const at::Tensor& t) { return t.narrow(-2, prefix_tokens, tokens - prefix_tokens); };
  n.indices = on_grid(attention.indices);
  n.scores = on_grid(attention.scores);
  n.weights = on_grid(attention.weights);
  const auto is_prefix = (n.indices < prefix_tokens).unsqueeze(-1);
  n.positions = at::where(is_prefix, at::full({}, -1, n.indices.options()),
                          unravel((n.indices - prefix_tokens).clamp_min(0), sizes));
  n.query_positions = unravel(at::arange(product(sizes), n.indices.options()), sizes);
  n.input_sizes = sizes;
  n.query_grid = sizes;
  n.stride = std::vector<int64_t>(sizes.size(), 1);
  n.dilation = n.stride;
  n.padding = 0;
  n.has_window = false;
  return n;
}

NeighbourView neighbour_view(const Neighbours& n, c10::ArrayRef<double> point, int64_t sample) {
  TORCH_CHECK(n.positions.defined(), "neighbour_view: these neighbours are not on a grid (an attention layer's: ",
              "place its tokens with on_token_grid first)");
  const auto dims = static_cast<int64_t>(n.input_sizes.size());
  TORCH_CHECK(static_cast<int64_t>(point.size()) == dims, "neighbour_view: point must have ", dims,
              " coordinates (one per axis of the layer's input), got ", point.size());
  for (const double p : point) {
    TORCH_CHECK(p >= 0.0 && p <= 1.0, "neighbour_view: point must be fractions of the input in [0, 1], got ", point);
  }
  const bool batched = n.positions.dim() == 5;
  const int64_t samples = batched ? n.positions.size(0) : 1;
  TORCH_CHECK(sample >= 0 && sample < samples, "neighbour_view: sample must be in [0, ", samples, "), got ", sample);
  NeighbourView view;
  int64_t query = 0;
  for (int64_t axis = 0; axis < dims; ++axis) {
    const int64_t size = n.input_sizes[axis];
    const int64_t pixel = std::min(size - 1, static_cast<int64_t>(std::floor(point[axis] * static_cast<double>(size))));
    const int64_t row = std::min(n.query_grid[axis] - 1, pixel / n.stride[axis]);
    query = query * n.query_grid[axis] + row;
    view.query.push_back(row * n.stride[axis]);
  }
  view.row = query;
  const auto of_sample = [&](const at::Tensor& t) { return (batched ? t[sample] : t).select(1, query); };
  view.neighbours = of_sample(n.positions);  // [H, K, D]
  view.weights = of_sample(n.weights);
  if (!n.has_window) {
    view.window = at::empty({0, dims}, n.positions.options());
    return view;
  }
  const int64_t side = window_side(n.k, dims);
  std::vector<at::Tensor> axes;
  for (int64_t axis = 0; axis < dims; ++axis) {
    axes.push_back((at::arange(side, n.positions.options()) - side / 2) * n.dilation[axis] + view.query[axis]);
  }
  std::vector<at::Tensor> columns;
  for (const auto& axis : at::meshgrid(axes, "ij")) columns.push_back(axis.reshape({-1}));
  view.window = at::stack(columns, 1);
  return view;
}

std::vector<std::vector<double>> picture_points(c10::IntArrayRef image_sizes,
                                                const std::vector<std::vector<int64_t>>& pixels, int64_t grid) {
  TORCH_CHECK(!image_sizes.empty() && std::all_of(image_sizes.begin(), image_sizes.end(), [](int64_t s) { return s >= 1; }),
              "picture_points: image_sizes must be one or more sizes, each at least 1, got ", image_sizes);
  const auto dims = image_sizes.size();
  std::vector<std::vector<double>> points;
  for (const auto& pixel : pixels) {
    TORCH_CHECK(pixel.size() == dims, "picture_points: a query pixel needs ", dims, " coordinates, got ",
                c10::IntArrayRef(pixel));
    std::vector<double> point;
    for (size_t axis = 0; axis < dims; ++axis) {
      TORCH_CHECK(pixel[axis] >= 0 && pixel[axis] < image_sizes[axis], "picture_points: query pixel ",
                  c10::IntArrayRef(pixel), " is outside the ", image_sizes, " image");
      point.push_back((static_cast<double>(pixel[axis]) + 0.5) / static_cast<double>(image_sizes[axis]));
    }
    points.push_back(point);
  }
  if (!pixels.empty()) return points;
  TORCH_CHECK(grid >= 1, "picture_points: grid must be at least 1 (or give query pixels), got ", grid);
  std::vector<int64_t> cell(dims, 0);
  do {
    std::vector<double> point;
    for (const auto c : cell) point.push_back((static_cast<double>(c) + 0.5) / static_cast<double>(grid));
    points.push_back(point);
    auto axis = static_cast<int64_t>(dims) - 1;  // the next cell, last axis fastest
    while (axis >= 0 && ++cell[axis] == grid) cell[axis--] = 0;
    if (axis < 0) break;
  } while (true);
  return points;
}

at::Tensor picture_background(const at::Tensor& image, c10::IntArrayRef grid) {
  TORCH_CHECK(image.defined() && image.dim() == static_cast<int64_t>(grid.size()) + 1,
              "picture_background: image must be [C, ", grid.size(), " spatial sizes] for a grid of ", grid,
              ", got ", image.defined() ? image.sizes() : c10::IntArrayRef{});
  TORCH_CHECK(grid.size() == 2, "picture_background: pictures are of 2-D layers, got a grid of ", grid);
  const auto grey = image.to(at::kDouble).mean(0, /*keepdim=*/true);
  const auto cells = at::adaptive_avg_pool2d(grey.unsqueeze(0), grid).squeeze(0).squeeze(0);
  const auto low = cells.min(), range = cells.max() - low;
  return at::where(range > 0, (cells - low) / range, at::full_like(cells, 0.5));
}

void NeighbourRecording::record_neighbours(bool on) {
  record_ = on;
  last_ = Neighbours{};
}

std::vector<std::pair<std::string, Neighbours>> record_neighbours(torch::nn::Module& module,
                                                                  const std::function<void()>& forward) {
  std::vector<std::pair<std::string, NeighbourRecording*>> layers;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    if (auto* layer = dynamic_cast<NeighbourRecording*>(item.value().get())) layers.emplace_back(item.key(), layer);
  }
  // Off again however forward ends.
  struct StopRecording {
    std::vector<std::pair<std::string, NeighbourRecording*>>& layers;
    ~StopRecording() {
      for (auto& [name, layer] : layers) layer->record_neighbours(false);
    }
  } stop{layers};
  for (auto& [name, layer] : layers) layer->record_neighbours(true);
  forward();
  std::vector<std::pair<std::string, Neighbours>> recorded;
  for (auto& [name, layer] : layers) {
    if (layer->last_neighbours().indices.defined()) recorded.emplace_back(name, layer->last_neighbours());
  }
  return recorded;
}

}  // namespace convnn::nn
