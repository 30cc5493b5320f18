// The identities of DESIGN.md §2. Each runs ConvNN through the public API (functional forms,
// modules) on fresh random inputs and compares it with an independent implementation: ATen's
// convolutions, scaled_dot_product_attention, or a few lines of plain tensor algebra written here
// (never the library's own selection code).
#include "convnn/verify/identities.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/modules/convnn.h"
#include "util/enum_names.h"

namespace convnn::verify {
namespace {

constexpr detail::NameTable<c10::ScalarType, 2> kDtypes{
    {{"float32", c10::ScalarType::Float}, {"float64", c10::ScalarType::Double}}};

namespace F = nn::functional;
using nn::Aggregation;
using nn::Rho;
using nn::SlotOrder;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Random inputs of one run: one seeded generator, the dtype under test.
class Sampler {
 public:
  Sampler(c10::ScalarType dtype, uint64_t seed)
      : generator_(at::make_generator<at::CPUGeneratorImpl>(seed)),
        options_(at::TensorOptions().dtype(dtype)) {}

  // N(0, scale^2) entries.
  at::Tensor normal(at::IntArrayRef shape, double scale = 1.0) {
    return at::randn(shape, generator_, options_) * scale;
  }
  // A bool [n,m] pattern, true with probability one half; the diagonal is always true so that no
  // row is empty (scaled_dot_product_attention gives NaN there, ConvNN gives 0).
  at::Tensor allowed_pattern(int64_t n, int64_t m) {
    const auto coin = at::rand({n, m}, generator_, at::TensorOptions().dtype(at::kDouble)) < 0.5;
    return coin | at::eye(n, m, at::TensorOptions().dtype(at::kBool));
  }
  // A seed for a generator that several calls must share (so they draw the same candidates).
  uint64_t derived_seed() {
    return static_cast<uint64_t>(at::randint(1 << 30, {}, generator_).item<int64_t>());
  }

  at::Generator& generator() { return generator_; }
  const at::TensorOptions& options() const { return options_; }
  c10::ScalarType dtype() const { return options_.dtype().toScalarType(); }

 private:
  at::Generator generator_;
  at::TensorOptions options_;
};

// Collects the rows of one dtype.
class Report {
 public:
  explicit Report(c10::ScalarType dtype) : tolerance_(identity_tolerance(dtype)) {}

  void add(std::string identity, std::string configuration, const at::Tensor& actual,
           const at::Tensor& expected) {
    IdentityResult row{std::move(identity), std::move(configuration),
                       max_abs_error(actual, expected), tolerance_, false};
    row.passed = row.max_abs_error <= tolerance_;  // false for NaN
    rows_.push_back(std::move(row));
  }
  std::vector<IdentityResult> take() { return std::move(rows_); }

 private:
  static double max_abs_error(const at::Tensor& actual, const at::Tensor& expected) {
    if (actual.sizes() != expected.sizes()) return std::numeric_limits<double>::infinity();
    if (actual.numel() == 0) return 0.0;
    return (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
  }

  double tolerance_;
  std::vector<IdentityResult> rows_;
};

std::string shape_text(at::IntArrayRef sizes) { return fmt::format("{}", fmt::join(sizes, "x")); }

// ------------------------------------------------------------------ convolution (Theorems 1-2)

constexpr int64_t kConvBatch = 2, kConvIn = 3, kConvOut = 4;

struct ConvCase {
  int64_t dims;  // 1, 2 or 3
  int64_t r;     // odd window size
  Aggregation aggregation;
  Similarity similarity;
  bool padded;
};

int64_t window_taps(const ConvCase& c) {
  int64_t taps = 1;
  for (int64_t d = 0; d < c.dims; ++d) taps *= c.r;
  return taps;
}
int64_t out_channels(const ConvCase& c) {
  return c.aggregation == Aggregation::Standard ? kConvOut : kConvIn;
}

// Spatial sizes tried for each case: 1D, a square and a non-square 2D map (every side at least 9,
// the largest R, so that unpadded windows fit), or a non-cubic volume (padded cases only).
std::vector<std::vector<int64_t>> conv_maps(int64_t dims) {
  if (dims == 1) return {{20}};
  if (dims == 3) return {{5, 6, 7}};
  return {{11, 11}, {10, 14}};
}

std::string conv_identity(const ConvCase& c) {
  return fmt::format("conv{}d/{}/{}", c.dims, to_string(c.aggregation),
                     c.padded ? "padded" : "unpadded");
}

std::string conv_configuration(const ConvCase& c) {
  const char* checked = c.padded      ? ""
                        : c.dims == 1 ? ", shifted window at edges"
                                      : ", checked at interior + corner diagonals";
  std::vector<std::string> maps;
  for (const auto& m : conv_maps(c.dims)) maps.push_back(shape_text(m));
  return fmt::format("R={} K={} {} B={} C={}->{} maps {} padding={} bias{}", c.r, window_taps(c),
                     to_string(c.similarity), kConvBatch, kConvIn, out_channels(c),
                     fmt::join(maps, ","), c.padded ? c.r / 2 : 0, checked);
}

// A convolution's weights: [C',C,R..] (standard) or [C,1,R..] (depthwise, groups = C), scaled by
// 1/sqrt(fan_in) so that outputs stay O(1) and float32 rounding stays far below the tolerance.
struct ConvWeights {
  at::Tensor weight, bias;
  int64_t groups;
};

ConvWeights random_conv_weights(Sampler& sampler, const ConvCase& c) {
  const bool standard = c.aggregation == Aggregation::Standard;
  std::vector<int64_t> shape{out_channels(c), standard ? kConvIn : 1};
  shape.insert(shape.end(), c.dims, c.r);
  const double fan_in = static_cast<double>((standard ? kConvIn : 1) * window_taps(c));
  return {sampler.normal(shape, 1.0 / std::sqrt(fan_in)), sampler.normal({out_channels(c)}, 0.1),
          standard ? 1 : kConvIn};
}

// The same weights as a ConvNN aggregation kernel, [C',C,R^d] or [C,R^d]: taps in row-major window
// order, which is the order of index-ordered slots.
at::Tensor as_convnn_kernel(const at::Tensor& weight, Aggregation aggregation) {
  return aggregation == Aggregation::Standard ? weight.flatten(2) : weight.flatten(1);
}

// Coordinates only (alpha = 0), K = R^d, index order, uniform rho: the convolution setting.
F::ConvNNFuncOptions conv_options(const ConvCase& c) {
  return F::ConvNNFuncOptions(window_taps(c))
      .similarity(c.similarity)
      .coordinates(true)
      .alpha(0.0)
      .padding(c.padded ? c.r / 2 : 0)
      .slot_order(SlotOrder::Index)
      .rho(Rho::Uniform);
}

at::Tensor aten_conv(const at::Tensor& x, const ConvWeights& w, int64_t padding) {
  if (x.dim() == 3) return at::conv1d(x, w.weight, w.bias, 1, padding, 1, w.groups);
  if (x.dim() == 5) return at::conv3d(x, w.weight, w.bias, 1, padding, 1, w.groups);
  return at::conv2d(x, w.weight, w.bias, 1, padding, 1, w.groups);
}

// Unpadded convolution whose window is shifted inwards at the edges, built explicitly: on every
// axis, position i sees [clamp(i - R/2, 0, size - R), +R), i.e. the valid convolution's output at
// that start.
at::Tensor shifted_window_conv(const at::Tensor& x, const ConvWeights& w, int64_t r) {
  auto y = aten_conv(x, w, 0);
  for (int64_t axis = 2; axis < x.dim(); ++axis) {
    const int64_t size = x.size(axis);
    const auto starts = (at::arange(size, at::kLong) - r / 2).clamp(0, size - r);
    y = y.index_select(axis, starts);
  }
  return y;
}

// Positions where unpadded ConvNN provably equals the shifted-window convolution.
//
// 1D: every position. The R nearest positions of i are unique up to mirror pairs that are both
// taken, so they are exactly the clamped window (the supplement's boundary skew).
//
// 2D: the supplement says the skew "follows along each axis independently"; it does not. Off the
// corners an edge position's R² nearest positions are never a rectangle: with chebyshev at (0,j),
// R = 3, the 2x3 block at distance <= 1 is completed by three of the nine positions at distance 2,
// picked by the lower-index tie rule ((0,j-2), (0,j+2), (1,j-2)); gaussian gives a plus-like
// shape. What holds without relying on ties: (a) interior positions, whose centred window lies
// inside the map; (b) with chebyshev, the positions (t,t) on each corner's diagonal, t < R/2: the
// chebyshev ball of radius R-1-t around them meets the map in exactly the R x R corner window, and
// every other position is farther. (A few further positions next to the top corners happen to
// match through the tie rule; they are not checked, since fp32 coordinates need not tie exactly.)
at::Tensor exactly_recovered_positions(at::IntArrayRef sizes, int64_t r) {
  if (sizes.size() == 1) return at::ones(sizes, at::kBool);
  const int64_t h = sizes[0], w = sizes[1], half = r / 2;
  auto exact = at::zeros(sizes, at::kBool);
  exact.slice(0, half, h - half).slice(1, half, w - half).fill_(true);
  for (int64_t t = 0; t < half; ++t) {
    const std::pair<int64_t, int64_t> diagonal_points[] = {
        {t, t}, {t, w - 1 - t}, {h - 1 - t, t}, {h - 1 - t, w - 1 - t}};
    for (const auto& [row, col] : diagonal_points) exact[row][col] = true;
  }
  return exact;
}

// Values at the given positions ([spatial] bool), flattened over batch and channels.
at::Tensor at_positions(const at::Tensor& y, const at::Tensor& positions) {
  return y.masked_select(positions.expand(y.sizes()));
}

// Largest error of ConvNN against the matching convolution over every map of the case.
void add_conv_row(Report& report, Sampler& sampler, const ConvCase& c) {
  const auto weights = random_conv_weights(sampler, c);
  const auto kernel = as_convnn_kernel(weights.weight, c.aggregation);
  std::vector<at::Tensor> actual, expected;
  for (const auto& map : conv_maps(c.dims)) {
    std::vector<int64_t> shape{kConvBatch, kConvIn};
    shape.insert(shape.end(), map.begin(), map.end());
    const auto x = sampler.normal(shape);
    const auto y = c.dims == 1   ? F::conv_nn1d(x, kernel, weights.bias, conv_options(c))
                   : c.dims == 2 ? F::conv_nn2d(x, kernel, weights.bias, conv_options(c))
                                 : F::conv_nn3d(x, kernel, weights.bias, conv_options(c));
    const auto reference =
        c.padded ? aten_conv(x, weights, c.r / 2) : shifted_window_conv(x, weights, c.r);
    const auto positions =
        c.padded ? at::ones(map, at::kBool) : exactly_recovered_positions(map, c.r);
    actual.push_back(at_positions(y, positions));
    expected.push_back(at_positions(reference, positions));
  }
  report.add(conv_identity(c), conv_configuration(c), at::cat(actual), at::cat(expected));
}

// The ConvNN2d module with a convolution's weights copied in, against that convolution.
void add_conv_module_row(Report& report, Sampler& sampler, Aggregation aggregation, int64_t r) {
  const ConvCase c{2, r, aggregation, Similarity::Chebyshev, true};
  const auto weights = random_conv_weights(sampler, c);
  nn::ConvNN2d module(nn::ConvNN2dOptions(kConvIn, out_channels(c), window_taps(c))
                          .similarity(c.similarity)
                          .coordinates(true)
                          .alpha(0.0)
                          .padding(r / 2)
                          .slot_order(SlotOrder::Index)
                          .rho(Rho::Uniform)
                          .aggregation(aggregation)
                          .bias(true));
  module->to(sampler.dtype());
  module->kernel.copy_(as_convnn_kernel(weights.weight, aggregation));
  module->bias.copy_(weights.bias);
  std::vector<int64_t> shape{kConvBatch, kConvIn};
  const auto map = conv_maps(2).back();
  shape.insert(shape.end(), map.begin(), map.end());
  const auto x = sampler.normal(shape);
  report.add(
      fmt::format("conv2d/module/{}", to_string(aggregation)),
      fmt::format("ConvNN2d R={} K={} chebyshev B={} C={}->{} map {} padding={} bias", r,
                  window_taps(c), kConvBatch, kConvIn, out_channels(c), shape_text(map), r / 2),
      module->forward(x), aten_conv(x, weights, r / 2));
}

// Dilation and stride (per axis): the strided, dilated convolution with same padding d * (R/2)
// (ConvNN pads every axis by the largest; the extra padded positions are farther than the window).
struct StridedConvCase {
  int64_t dims, r;
  std::vector<int64_t> stride, dilation, map;
};

void add_strided_conv_row(Report& report, Sampler& sampler, const StridedConvCase& c) {
  const ConvCase conv_case{c.dims, c.r, Aggregation::Standard, Similarity::Chebyshev, true};
  const auto weights = random_conv_weights(sampler, conv_case);
  std::vector<int64_t> shape{kConvBatch, kConvIn}, padding;
  shape.insert(shape.end(), c.map.begin(), c.map.end());
  for (const int64_t d : c.dilation) padding.push_back(d * (c.r / 2));
  const auto x = sampler.normal(shape);
  const auto options = conv_options(conv_case)
                           .padding(*std::max_element(padding.begin(), padding.end()))
                           .stride(c.stride)
                           .dilation(c.dilation);
  const auto kernel = as_convnn_kernel(weights.weight, Aggregation::Standard);
  const auto y = c.dims == 1   ? F::conv_nn1d(x, kernel, weights.bias, options)
                 : c.dims == 2 ? F::conv_nn2d(x, kernel, weights.bias, options)
                               : F::conv_nn3d(x, kernel, weights.bias, options);
  const std::vector<int64_t> no_output_padding(c.dims, 0);
  const auto reference = at::convolution(x, weights.weight, weights.bias, c.stride, padding, c.dilation, false,
                                         no_output_padding, 1);
  const bool strided = std::any_of(c.stride.begin(), c.stride.end(), [](int64_t v) { return v > 1; });
  const bool dilated = std::any_of(c.dilation.begin(), c.dilation.end(), [](int64_t v) { return v > 1; });
  report.add(fmt::format("conv{}d/{}", c.dims, strided && dilated ? "strided-dilated" : strided ? "strided" : "dilated"),
             fmt::format("R={} K={} chebyshev B={} C={}->{} map {} stride {} dilation {} padding {}", c.r,
                         window_taps(conv_case), kConvBatch, kConvIn, kConvOut, shape_text(c.map),
                         shape_text(c.stride), shape_text(c.dilation), shape_text(padding)),
             y, reference);
}

void add_strided_conv_rows(Report& report, Sampler& sampler) {
  const std::vector<StridedConvCase> cases{
      {1, 3, {1}, {2}, {20}},           {2, 3, {1, 1}, {1, 3}, {10, 14}}, {3, 3, {1, 1, 1}, {2, 1, 2}, {5, 6, 7}},
      {1, 5, {2}, {1}, {20}},           {2, 3, {2, 1}, {1, 1}, {10, 14}}, {3, 3, {2, 2, 2}, {1, 1, 1}, {5, 6, 7}},
      {2, 3, {2, 2}, {2, 2}, {11, 10}}};
  for (const auto& c : cases) add_strided_conv_row(report, sampler, c);
}

void add_convolution_rows(Report& report, Sampler& sampler) {
  const std::vector<int64_t> all_r{3, 5, 7, 9};
  for (const auto aggregation : {Aggregation::Standard, Aggregation::Depthwise}) {
    for (const bool padded : {true, false}) {
      for (const auto r : all_r) {
        add_conv_row(report, sampler, {1, r, aggregation, Similarity::Gaussian, padded});
      }
    }
  }
  for (const auto aggregation : {Aggregation::Standard, Aggregation::Depthwise}) {
    // gaussian selects the R x R window only while it is the R² nearest positions (R <= 5);
    // chebyshev does for every odd R.
    for (const int64_t r : {3, 5}) {
      add_conv_row(report, sampler, {2, r, aggregation, Similarity::Gaussian, true});
    }
    for (const bool padded : {true, false}) {
      for (const auto r : all_r) {
        add_conv_row(report, sampler, {2, r, aggregation, Similarity::Chebyshev, padded});
      }
    }
    add_conv_module_row(report, sampler, aggregation, 5);
  }
  for (const auto aggregation : {Aggregation::Standard, Aggregation::Depthwise}) {
    // 3D, same padding: chebyshev selects the R x R x R cube for every odd R; gaussian only while
    // the cube is the R³ nearest voxels (R <= 3: at R = 5, (3,0,0) is nearer than the corner (2,2,2)).
    for (const int64_t r : {1, 3, 5}) {
      add_conv_row(report, sampler, {3, r, aggregation, Similarity::Chebyshev, true});
    }
    add_conv_row(report, sampler, {3, 3, aggregation, Similarity::Gaussian, true});
  }
}

// --------------------------------------------------------------- attention (Theorems 3.1-3.3, 4)

constexpr int64_t kAttnBatch = 2, kHeads = 2, kHeadDim = 8, kTokens = 24, kCrossTokens = 30;
constexpr int64_t kTopK = 8;  // K < N for KVT

// Token-form inputs [B,N,H*d] (queries) and [B,M,H*d] (keys, values).
struct Tokens {
  at::Tensor q, k, v;
};

Tokens random_tokens(Sampler& sampler, int64_t n, int64_t m) {
  const int64_t c = kHeads * kHeadDim;
  return {sampler.normal({kAttnBatch, n, c}), sampler.normal({kAttnBatch, m, c}),
          sampler.normal({kAttnBatch, m, c})};
}

// [B,N,H*d] -> [B,H,N,d]
at::Tensor split_heads(const at::Tensor& x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
}
// [B,H,N,d] -> [B,N,H*d]
at::Tensor merge_heads(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

// ConvNN as attention: scaled_dot, softmax rho, depthwise kernel of ones shared by the heads.
at::Tensor convnn_attention(const Tokens& t, int64_t k, const at::Tensor& mask = {}) {
  const auto options = F::ConvNNFuncOptions(k)
                           .similarity(Similarity::ScaledDot)
                           .rho(Rho::Softmax)
                           .heads(kHeads)
                           .mask(mask);
  return F::conv_nn(t.q, t.k, t.v, at::ones({kHeadDim, k}, t.q.options()), {}, options);
}

at::Tensor sdpa(const Tokens& t, const at::Tensor& attn_mask = {}, bool is_causal = false) {
  return merge_heads(at::scaled_dot_product_attention(
      split_heads(t.q, kHeads), split_heads(t.k, kHeads), split_heads(t.v, kHeads),
      attn_mask.defined() ? c10::optional<at::Tensor>(attn_mask) : c10::nullopt, 0.0, is_causal));
}

// Rank of each entry within its row under descending order, the lower column first among equals:
// the number of entries of the row that come before it. [..,M] -> [..,M] int64.
at::Tensor rank_within_row(const at::Tensor& s) {
  const int64_t m = s.size(-1);
  const auto column = at::arange(m, at::kLong);
  const auto lower_column = column.view({1, m}) < column.view({m, 1});  // [j, j']: j' < j
  const auto entry = s.unsqueeze(-1), other = s.unsqueeze(-2);          // [..,j,1], [..,1,j']
  return ((other > entry) | ((other == entry) & lower_column)).sum(-1);
}

// KVT's masked softmax written out: full QK^T/sqrt(d), masked entries (allowed false) to -inf,
// only each row's top-k entries kept, softmax, times V. q [B,H,N,d], k and v [B,H,M,d].
at::Tensor top_k_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           int64_t top_k, const at::Tensor& allowed = {}) {
  auto scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (allowed.defined()) scores = scores.masked_fill(~allowed, kNegInf);
  const auto dropped = rank_within_row(scores) >= top_k;
  return at::matmul(at::softmax(scores.masked_fill(dropped, kNegInf), -1), v);
}

at::Tensor top_k_attention(const Tokens& t, int64_t top_k, const at::Tensor& allowed = {}) {
  return merge_heads(top_k_attention(split_heads(t.q, kHeads), split_heads(t.k, kHeads),
                                     split_heads(t.v, kHeads), top_k, allowed));
}

std::string token_shapes(int64_t m, int64_t k) {
  return fmt::format("B={} N={} M={} H={} d={} K={}", kAttnBatch, kTokens, m, kHeads, kHeadDim, k);
}

std::string attention_configuration(int64_t k, int64_t m = kTokens, const std::string& extra = "") {
  return token_shapes(m, k) + " scaled_dot softmax ones" + extra;
}

// ConvNNAttention in the dtype under test, with random projection weights.
nn::ConvNNAttention random_attention_module(Sampler& sampler, int64_t k, bool causal) {
  const int64_t c = kHeads * kHeadDim;
  nn::ConvNNAttention module(nn::ConvNNAttentionOptions(c, kHeads, k).causal(causal));
  module->to(sampler.dtype());
  module->eval();
  for (auto* projection : {&module->query_projection, &module->key_projection,
                           &module->value_projection, &module->output_projection}) {
    (*projection)->weight.copy_(sampler.normal({c, c}, 1.0 / std::sqrt(static_cast<double>(c))));
  }
  return module;
}

using HeadAttention =
    std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

// Multi-head self-attention written out with a module's projection weights; `attend` maps the
// per-head q, k, v [B,H,N,d] to [B,H,N,d].
at::Tensor hand_written_mhsa(const nn::ConvNNAttention& module, const at::Tensor& x,
                             const HeadAttention& attend) {
  const auto project = [&](const torch::nn::Linear& linear) {
    return split_heads(at::linear(x, linear->weight), kHeads);
  };
  const auto heads = attend(project(module->query_projection), project(module->key_projection),
                            project(module->value_projection));
  return at::linear(merge_heads(heads), module->output_projection->weight);
}

void add_attention_rows(Report& report, Sampler& sampler) {
  const auto t = random_tokens(sampler, kTokens, kTokens);
  report.add("attention", attention_configuration(kTokens), convnn_attention(t, kTokens), sdpa(t));
  report.add("kvt", attention_configuration(kTopK), convnn_attention(t, kTopK),
             top_k_attention(t, kTopK));
  const auto causal = F::causal_mask(kTokens);
  report.add("kvt/causal", attention_configuration(kTopK, kTokens, " causal mask"),
             convnn_attention(t, kTopK, causal), top_k_attention(t, kTopK, causal));

  const auto cross = random_tokens(sampler, kTokens, kCrossTokens);
  report.add("kvt/cross", attention_configuration(kTopK, kCrossTokens, " cross keys"),
             convnn_attention(cross, kTopK), top_k_attention(cross, kTopK));

  const auto x = sampler.normal({kAttnBatch, kTokens, kHeads * kHeadDim});
  const std::string module_config = "ConvNNAttention, hand-written MHSA with its weights";
  auto full = random_attention_module(sampler, kTokens, false);
  report.add("attention/module", attention_configuration(kTokens, kTokens, ", " + module_config),
             full->forward(x),
             hand_written_mhsa(full, x, [](const auto& q, const auto& k, const auto& v) {
               return at::scaled_dot_product_attention(q, k, v);
             }));
  auto kvt = random_attention_module(sampler, kTopK, false);
  report.add("kvt/module", attention_configuration(kTopK, kTokens, ", " + module_config),
             kvt->forward(x),
             hand_written_mhsa(kvt, x, [](const auto& q, const auto& k, const auto& v) {
               return top_k_attention(q, k, v, kTopK);
             }));
}

// K = N with a mask against scaled_dot_product_attention with the same mask. Rows with fewer
// valid candidates than K are legal: their masked slots weigh 0.
void add_masked_rows(Report& report, Sampler& sampler) {
  const auto t = random_tokens(sampler, kTokens, kTokens);
  const auto allowed = sampler.allowed_pattern(kTokens, kTokens);
  const auto additive =
      at::zeros({kTokens, kTokens}, sampler.options()).masked_fill(~allowed, kNegInf);
  report.add("masked/additive",
             attention_configuration(kTokens, kTokens, " additive {0,-inf} mask"),
             convnn_attention(t, kTokens, additive), sdpa(t, additive));
  report.add("masked/bool", attention_configuration(kTokens, kTokens, " bool mask"),
             convnn_attention(t, kTokens, allowed), sdpa(t, allowed));
  report.add(
      "masked/causal", attention_configuration(kTokens, kTokens, " causal_mask vs is_causal"),
      convnn_attention(t, kTokens, F::causal_mask(kTokens)), sdpa(t, {}, /*is_causal=*/true));

  const int64_t window = 2, num_global = 2, num_random = 2, stride = 4;
  const auto bigbird =
      F::bigbird_mask(kTokens, window, num_global, num_random, sampler.generator());
  report.add("masked/bigbird",
             attention_configuration(kTokens, kTokens,
                                     fmt::format(" bigbird window={} global={} random={}", window,
                                                 num_global, num_random)),
             convnn_attention(t, kTokens, bigbird), sdpa(t, bigbird));
  const auto strided = F::strided_mask(kTokens, stride, /*causal=*/true);
  report.add(
      "masked/strided",
      attention_configuration(kTokens, kTokens, fmt::format(" strided stride={} causal", stride)),
      convnn_attention(t, kTokens, strided), sdpa(t, strided));

  const auto x = sampler.normal({kAttnBatch, kTokens, kHeads * kHeadDim});
  auto module = random_attention_module(sampler, kTokens, /*causal=*/true);
  report.add(
      "masked/causal/module",
      attention_configuration(kTokens, kTokens, ", ConvNNAttention(causal) vs MHSA is_causal"),
      module->forward(x),
      hand_written_mhsa(module, x, [](const auto& q, const auto& k, const auto& v) {
        return at::scaled_dot_product_attention(q, k, v, c10::nullopt, 0.0, /*is_causal=*/true);
      }));
}

// conv_nn with its random candidate draw pinned: a fresh generator seeded with `draw_seed` on
// every call, so that every call draws the same candidates.
at::Tensor conv_nn_pinned(const Tokens& t, const at::Tensor& kernel, const at::Tensor& bias,
                          F::ConvNNFuncOptions options, uint64_t draw_seed) {
  options.generator(at::make_generator<at::CPUGeneratorImpl>(draw_seed));
  return F::conv_nn(t.q, t.k, t.v, kernel, bias, options);
}

// H single-head conv_nn calls, one on each head's channels (with that head's kernel and bias when
// kernel_per_head), concatenated: Theorem 4's right-hand side.
at::Tensor independent_heads(const Tokens& t, const at::Tensor& kernel, const at::Tensor& bias,
                             F::ConvNNFuncOptions options, uint64_t draw_seed) {
  const int64_t heads = options.heads();
  const bool per_head = options.kernel_per_head();
  options.heads(1).kernel_per_head(false);
  std::vector<at::Tensor> outputs;
  for (int64_t h = 0; h < heads; ++h) {
    const Tokens head{t.q.chunk(heads, -1)[h], t.k.chunk(heads, -1)[h], t.v.chunk(heads, -1)[h]};
    outputs.push_back(conv_nn_pinned(head, per_head ? kernel[h] : kernel,
                                     per_head && bias.defined() ? bias[h] : bias, options,
                                     draw_seed));
  }
  return at::cat(outputs, -1);
}

void add_multihead_row(Report& report, std::string identity, std::string configuration,
                       const Tokens& t, const at::Tensor& kernel, const at::Tensor& bias,
                       const F::ConvNNFuncOptions& options, uint64_t draw_seed) {
  report.add(std::move(identity), std::move(configuration),
             conv_nn_pinned(t, kernel, bias, options, draw_seed),
             independent_heads(t, kernel, bias, options, draw_seed));
}

void add_multihead_rows(Report& report, Sampler& sampler) {
  const auto t = random_tokens(sampler, kTokens, kTokens);
  const uint64_t draw_seed = sampler.derived_seed();
  const auto softmax_options =
      F::ConvNNFuncOptions(kTopK).similarity(Similarity::ScaledDot).rho(Rho::Softmax).heads(kHeads);
  add_multihead_row(
      report, "multihead",
      token_shapes(kTokens, kTopK) + " scaled_dot softmax, random depthwise kernel shared", t,
      sampler.normal({kHeadDim, kTopK}), {}, softmax_options, draw_seed);

  const int64_t k = 6, out_dim = 5;
  const auto per_head_options = F::ConvNNFuncOptions(k)
                                    .similarity(Similarity::Cosine)
                                    .slot_order(SlotOrder::Index)
                                    .rho(Rho::Uniform)
                                    .heads(kHeads)
                                    .kernel_per_head(true);
  const auto per_head_kernel = sampler.normal({kHeads, out_dim, kHeadDim, k},
                                              1.0 / std::sqrt(static_cast<double>(kHeadDim * k)));
  add_multihead_row(
      report, "multihead/per-head-kernel",
      token_shapes(kTokens, k) + fmt::format(" cosine index-order uniform, standard kernel "
                                             "[H,{},d,K] and bias per head",
                                             out_dim),
      t, per_head_kernel, sampler.normal({kHeads, out_dim}), per_head_options, draw_seed);

  const int64_t r = 16, cross_k = 5;
  const auto cross = random_tokens(sampler, kTokens, kCrossTokens);
  const auto random_options = F::ConvNNFuncOptions(cross_k)
                                  .similarity(Similarity::Dot)
                                  .rho(Rho::Mean)
                                  .heads(kHeads)
                                  .num_candidates(r)
                                  .mask(sampler.allowed_pattern(kTokens, kCrossTokens));
  add_multihead_row(report, "multihead/cross-random-candidates",
                    token_shapes(kCrossTokens, cross_k) +
                        fmt::format(" r={} dot mean, bool mask, one draw for all heads", r),
                    cross, sampler.normal({kHeadDim, cross_k}), {}, random_options, draw_seed);
}

}  // namespace

const std::vector<std::string>& dtype_names() { return detail::table_names<kDtypes>(); }
c10::ScalarType parse_dtype(const std::string& name) { return detail::parse_name(kDtypes, name, "verify: dtype"); }

double identity_tolerance(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Double ? 1e-10 : 1e-5;
}

std::vector<IdentityResult> run_identities(c10::ScalarType dtype, uint64_t seed) {
  TORCH_CHECK(dtype == c10::ScalarType::Float || dtype == c10::ScalarType::Double,
              "run_identities: dtype must be float32 or float64, got ", dtype);
  at::NoGradGuard no_grad;  // forward comparisons only; also lets module parameters be overwritten
  Sampler sampler(dtype, seed);
  Report report(dtype);
  add_convolution_rows(report, sampler);
  add_strided_conv_rows(report, sampler);
  add_attention_rows(report, sampler);
  add_masked_rows(report, sampler);
  add_multihead_rows(report, sampler);
  return report.take();
}

}  // namespace convnn::verify
