#include "nn/functional/spatial.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "convnn/nn/functional/convnn.h"
#include "nn/functional/symint_forms.h"
#include "ops/checks.h"

namespace convnn::nn::functional::detail {

std::string spatial_function_name(int64_t spatial_dims) { return "conv_nn" + std::to_string(spatial_dims) + "d"; }

std::string spatial_layer_name(int64_t spatial_dims) { return "ConvNN" + std::to_string(spatial_dims) + "d"; }

const char* spatial_layout(int64_t spatial_dims, bool batched) {
  TORCH_INTERNAL_ASSERT(spatial_dims >= 1 && spatial_dims <= 3, "spatial_layout: ", spatial_dims, " dimensions");
  static const char* const layouts[2][3] = {{"[C,L]", "[C,H,W]", "[C,D,H,W]"}, {"[B,C,L]", "[B,C,H,W]", "[B,C,D,H,W]"}};
  return layouts[batched ? 1 : 0][spatial_dims - 1];
}

namespace {

bool all_ones(const std::vector<int64_t>& values) {
  return std::all_of(values.begin(), values.end(), [](int64_t v) { return v == 1; });
}

// The queries of one phase of the dilated grid along one axis: the sub-grid positions j (padded
// position phase + dilation * j) that lie in the unpadded input on the stride lattice, and their
// output positions. Both are arithmetic progressions (j steps by stride / gcd(stride, dilation)),
// so they are built as aranges: no host data enters the traced program under torch.compile.
struct AxisQueries {
  int64_t count = 0, first = 0, step = 1, first_output = 0, output_step = 1;
};

// One spatial size as an integer: under torch.export it specialises that size alone. (Tensor::size
// of a FakeTensor asks Python for every size, which would specialise the batch too.)
int64_t spatial_size(const at::Tensor& t, int64_t dim) { return t.sym_size(dim).guard_int(__FILE__, __LINE__); }

AxisQueries axis_queries(int64_t phase, int64_t sub_size, int64_t dilation, int64_t pad, int64_t size, int64_t stride) {
  std::vector<int64_t> positions, outputs;
  for (int64_t j = 0; j < sub_size; ++j) {
    const int64_t position = phase + dilation * j - pad;
    if (position >= 0 && position < size && position % stride == 0) {
      positions.push_back(j);
      outputs.push_back(position / stride);
    }
  }
  AxisQueries queries;
  queries.count = static_cast<int64_t>(positions.size());
  if (queries.count > 0) {
    queries.first = positions[0];
    queries.first_output = outputs[0];
  }
  if (queries.count > 1) {
    queries.step = positions[1] - positions[0];
    queries.output_step = outputs[1] - outputs[0];
  }
  return queries;
}

// Row-major flat indices, in a grid of `sizes`, of the cartesian product of per-axis progressions
// (first + step * t for t < count).
at::Tensor flat_product(const std::vector<std::array<int64_t, 3>>& progressions, const std::vector<int64_t>& sizes,
                        const at::TensorOptions& options) {
  auto flat = at::zeros({1}, options);
  for (size_t axis = 0; axis < progressions.size(); ++axis) {
    const auto& [count, first, step] = progressions[axis];
    const auto positions = at::arange(count, options) * step + first;
    flat = (flat.unsqueeze(1) * sizes[axis] + positions.unsqueeze(0)).reshape({-1});
  }
  return flat;
}

// Row-major flat indices in the sub-grid of one phase of the dilated grid -> row-major flat indices
// in the padded grid: position phase + dilation * j on each axis.
at::Tensor sub_grid_to_padded(const at::Tensor& flat, const std::vector<int64_t>& sub_sizes,
                              const std::vector<int64_t>& phase, const std::vector<int64_t>& dilation,
                              const std::vector<int64_t>& padded_sizes) {
  const auto options = flat.options();
  const auto positions = unravel(flat, sub_sizes) * at::tensor(dilation, options) + at::tensor(phase, options);
  std::vector<int64_t> strides(padded_sizes.size(), 1);  // row-major strides of the padded grid
  for (auto axis = static_cast<int64_t>(padded_sizes.size()) - 2; axis >= 0; --axis) {
    strides[axis] = strides[axis + 1] * padded_sizes[axis + 1];
  }
  return (positions * at::tensor(strides, options)).sum(-1);
}

// Concatenates the phases' selections along the queries and puts the rows in `order`.
Selection merge_phases(const std::vector<Selection>& phases, const at::Tensor& order) {
  std::vector<at::Tensor> indices, scores, weights;
  for (const auto& phase : phases) {
    indices.push_back(phase.indices);
    scores.push_back(phase.scores);
    weights.push_back(phase.weights);
  }
  const auto rows = [&](const std::vector<at::Tensor>& parts) { return at::cat(parts, 1).index_select(1, order); };
  return {rows(indices), rows(scores), rows(weights)};
}

// Stride and dilation: one ConvNN per phase of the dilated grid (the padded positions congruent
// modulo the dilation on every axis), on that sub-grid's tokens and coordinates, so that a query's
// candidates are its dilated grid and one dilated step is one coordinate unit; the queries are the
// sub-grid's positions inside the input on the stride lattice. Each output position belongs to
// exactly one phase. The query lattice is built on the host from the concrete sizes (torch.compile
// specialises on the spatial sizes here; the default stride and dilation keep them dynamic).
at::Tensor strided_or_dilated(const at::Tensor& input, const at::Tensor& kernel, const at::Tensor& bias,
                              const ConvNNFuncOptions& options, const std::vector<int64_t>& stride,
                              const std::vector<int64_t>& dilation, const Projections& projections,
                              const std::string& op, Selection* selection) {
  const int64_t dims = static_cast<int64_t>(stride.size()), pad = options.padding();
  std::vector<int64_t> sizes, out_sizes, padded_sizes;
  for (int64_t axis = 0; axis < dims; ++axis) {
    sizes.push_back(spatial_size(input, 2 + axis));
    out_sizes.push_back((sizes.back() + stride[axis] - 1) / stride[axis]);
    padded_sizes.push_back(sizes.back() + 2 * pad);
  }
  check_spatial_candidates(sizes, options, op);
  const auto padded = pad > 0 ? at::constant_pad_nd(input, std::vector<int64_t>(2 * dims, pad)) : input;
  const auto apply = [](const auto& f, const at::Tensor& tokens) { return f ? f(tokens) : tokens; };
  auto token_options = options;
  token_options.padding(0).stride({1}).dilation({1});
  // include_self with random candidates needs the query among the tokens (N == M): every sub-grid
  // position is a query then, and the outputs are the lattice's.
  const bool every_position_queries = options.include_self() && options.num_candidates() > 0;
  std::vector<at::Tensor> outputs, output_positions;
  std::vector<Selection> selections;
  std::vector<int64_t> phase(dims, 0);
  do {
    auto sub = padded;
    std::vector<int64_t> sub_sizes;
    std::vector<std::array<int64_t, 3>> query_positions, query_outputs;  // (count, first, step) per axis
    bool has_queries = true;
    for (int64_t axis = 0; axis < dims; ++axis) {
      sub = sub.slice(2 + axis, phase[axis], c10::nullopt, dilation[axis]);
      sub_sizes.push_back(spatial_size(sub, 2 + axis));
      const auto queries = axis_queries(phase[axis], sub_sizes.back(), dilation[axis], pad, sizes[axis], stride[axis]);
      query_positions.push_back({queries.count, queries.first, queries.step});
      query_outputs.push_back({queries.count, queries.first_output, queries.output_step});
      has_queries = has_queries && queries.count > 0;
    }
    if (has_queries) {
      const auto tokens = sub.flatten(2).transpose(1, 2);  // [B, sub-grid tokens, C]
      const auto coordinates =
          options.coordinates() ? grid_coordinates(sub_sizes, tokens.options()) : at::Tensor();
      const auto index_options = at::TensorOptions().dtype(at::kLong).device(input.device());
      const auto query_index = flat_product(query_positions, sub_sizes, index_options);
      const auto keys = apply(projections.key, tokens), values = apply(projections.value, tokens);
      at::Tensor out;
      Selection phase_selection;
      Selection* const phase_record = selection != nullptr ? &phase_selection : nullptr;
      if (every_position_queries) {
        out = conv_nn_with_query_coordinates(apply(projections.query, tokens), keys, values, kernel, bias,
                                             token_options, coordinates, coordinates, phase_record)
                  .index_select(1, query_index);
      } else {  // the query projection on the queries only (it is per token)
        out = conv_nn_with_query_coordinates(
            apply(projections.query, tokens.index_select(1, query_index)), keys, values, kernel, bias, token_options,
            coordinates.defined() ? coordinates.index_select(0, query_index) : coordinates, coordinates,
            phase_record);
      }
      if (phase_record != nullptr) {
        auto& kept = phase_selection;
        if (every_position_queries) {
          kept = {kept.indices.index_select(1, query_index), kept.scores.index_select(1, query_index),
                  kept.weights.index_select(1, query_index)};
        }
        kept.indices = sub_grid_to_padded(kept.indices, sub_sizes, phase, dilation, padded_sizes);
        selections.push_back(kept);
      }
      outputs.push_back(out);
      output_positions.push_back(flat_product(query_outputs, out_sizes, index_options));
    }
    int64_t axis = dims - 1;  // the next phase, last axis fastest
    while (axis >= 0 && ++phase[axis] == dilation[axis]) phase[axis--] = 0;
    if (axis < 0) break;
  } while (true);
  // Every output position once: back to row-major order.
  const auto order = std::get<1>(at::cat(output_positions).sort());
  const auto y = at::cat(outputs, 1).index_select(1, order);  // [B, prod(out_sizes), C']
  if (selection != nullptr) *selection = merge_phases(selections, order);
  // The batch stays symbolic (torch.export with a dynamic batch): only the spatial sizes specialise.
  std::vector<c10::SymInt> shape{input.sym_size(0), y.sym_size(2)};
  shape.insert(shape.end(), out_sizes.begin(), out_sizes.end());
  return y.transpose(1, 2).reshape_symint(shape).contiguous();
}

}  // namespace

at::Tensor unravel(const at::Tensor& flat, const std::vector<int64_t>& sizes) {
  std::vector<at::Tensor> coordinates(sizes.size());
  auto rest = flat;
  for (auto axis = static_cast<int64_t>(sizes.size()) - 1; axis >= 0; --axis) {
    coordinates[axis] = rest.remainder(sizes[axis]);
    rest = rest.div(sizes[axis], "floor");
  }
  return at::stack(coordinates, -1);
}

std::vector<int64_t> per_axis(const std::vector<int64_t>& values, int64_t spatial_dims, std::string_view where,
                              const char* name) {
  TORCH_CHECK(values.size() == 1 || static_cast<int64_t>(values.size()) == spatial_dims, where, ": ", name,
              " must be one value or ", spatial_dims, " (one per axis), got ", c10::IntArrayRef(values));
  TORCH_CHECK(std::all_of(values.begin(), values.end(), [](int64_t v) { return v >= 1; }), where, ": ", name,
              " must be at least 1 on every axis, got ", c10::IntArrayRef(values));
  return values.size() == 1 ? std::vector<int64_t>(spatial_dims, values[0]) : values;
}

at::Tensor conv_nn_spatial(const at::Tensor& input, const at::Tensor& kernel,
                           const at::Tensor& bias, const ConvNNFuncOptions& options,
                           int64_t spatial_dims, const Projections& projections, Selection* selection) {
  const auto op = spatial_function_name(spatial_dims);
  TORCH_CHECK(input.defined() && input.dim() == spatial_dims + 2, op, ": input must be ",
              spatial_dims + 2, "-D ", spatial_layout(spatial_dims), ", got ",
              input.defined() ? checks::shape_string(input) : "undefined");
  const int64_t pad = options.padding();
  TORCH_CHECK(pad >= 0, op, ": padding must be non-negative, got ", pad);
  TORCH_CHECK(options.alpha() == 1.0 || options.coordinates(), op, ": alpha = ", options.alpha(),
              " blends in positional similarity, which needs coordinates(true)");
  TORCH_CHECK(options.kv_heads() == 0 || options.kv_heads() == options.heads(), op, ": kv_heads = ",
              options.kv_heads(), " applies to token inputs only (conv_nn); the spatial forms' keys and values are "
              "the input itself, with heads = ", options.heads(), " heads (give kv_heads 0)");
  const auto stride = per_axis(options.stride(), spatial_dims, op, "stride");
  const auto dilation = per_axis(options.dilation(), spatial_dims, op, "dilation");
  if (!all_ones(stride) || !all_ones(dilation)) {
    TORCH_CHECK(!options.mask().defined(), op, ": a mask is not supported with stride ", c10::IntArrayRef(stride),
                " or dilation ", c10::IntArrayRef(dilation), " (its [N,M] would index the tokens of one phase of the dilated grid)");
    return strided_or_dilated(input, kernel, bias, options, stride, dilation, projections, op, selection);
  }

  const auto padded = pad > 0 ? at::constant_pad_nd(input, std::vector<int64_t>(2 * spatial_dims, pad))
                              : input;
  // Symbolic sizes throughout (see convnn.cpp): H and W stay dynamic under torch.export.
  const auto grid = padded.sym_sizes().slice(2).vec();
  const auto tokens = padded.flatten(2).transpose(1, 2);  // [B, prod(grid), C]
  const auto apply = [&](const auto& f) { return f ? f(tokens) : tokens; };
  const auto coordinates =
      options.coordinates() ? grid_coordinates_symint(grid, tokens.options()) : at::Tensor();

  auto token_options = options;
  token_options.padding(0);
  const auto out = conv_nn_with_query_coordinates(apply(projections.query), apply(projections.key),
                                                  apply(projections.value), kernel, bias, token_options, coordinates,
                                                  coordinates, selection);
  if (selection != nullptr && pad > 0) {  // the rows of the input's positions, as the output's crop
    std::vector<std::array<int64_t, 3>> inside;
    std::vector<int64_t> padded_sizes;
    for (int64_t d = 0; d < spatial_dims; ++d) {
      inside.push_back({spatial_size(input, 2 + d), pad, 1});
      padded_sizes.push_back(spatial_size(padded, 2 + d));
    }
    const auto rows = flat_product(inside, padded_sizes, at::TensorOptions().dtype(at::kLong).device(input.device()));
    *selection = {selection->indices.index_select(1, rows), selection->scores.index_select(1, rows),
                  selection->weights.index_select(1, rows)};
  }

  auto y = out.transpose(1, 2).unflatten_symint(2, grid);
  for (int64_t d = 0; d < spatial_dims && pad > 0; ++d) {
    y = y.narrow_symint(2 + d, pad, grid[d] - 2 * pad);
  }
  return y.contiguous();
}

void check_spatial_candidates(c10::IntArrayRef sizes, const ConvNNFuncOptions& options,
                              std::string_view where) {
  const auto dims = static_cast<int64_t>(sizes.size());
  const auto dilation = per_axis(options.dilation(), dims, where, "dilation");
  per_axis(options.stride(), dims, where, "stride");
  // A query's candidates are its phase of the dilated grid; the smallest phase has
  // floor(padded size / dilation) positions on each axis.
  int64_t m = 1;
  std::string map;
  for (int64_t axis = 0; axis < dims; ++axis) {
    const int64_t size = sizes[axis];
    TORCH_CHECK(size >= 1, where, ": every spatial size must be at least 1, got ", sizes);
    m *= (size + 2 * options.padding()) / dilation[axis];
    map += (map.empty() ? "" : "x") + std::to_string(size);
  }
  const bool dilated = std::any_of(dilation.begin(), dilation.end(), [](int64_t d) { return d > 1; });
  check_candidates(options, m, std::string(where) + " (on a " + map + " map with padding " +
                                   std::to_string(options.padding()) +
                                   (dilated ? ", the smallest phase of the dilated grid" : "") + ")");
}

}  // namespace convnn::nn::functional::detail
